"""The coordinator: job deployment, outcomes, barriers, metrics; the facade of the package.

It runs on the control plane's asyncio loop and extends cluster membership
(:class:`.cluster.Cluster`: the port, worker registrations, heartbeats) with jobs, speaking
the protocol of :mod:`runtime.messages`. It satisfies :class:`.ports.JobHost`, which is all
that the reconfiguration, restart and plan modules it forwards to know of it. Deployment of
a job:

1. Have a worker list the partitions of its partitioned sources (:mod:`.listing`; a
   source that cannot refuses the job: :class:`.errors.SourceError`), then place the
   tasks (:meth:`runtime.layout.Layout.initial`: partitions and key groups given out).
2. Send ``deploy`` to every worker hosting a task, numbered: the job's next attempt
   (its first deploy is attempt 1; a recovery, a resume or a restart deploys the next);
   each worker creates its tasks and channels, and refuses data connections of an
   earlier attempt from then on.
3. Wait for every ``deployed`` (:data:`.deployment.DEPLOY_TIMEOUT_S`); any
   ``deploy_failed`` fails the job and stops it everywhere, and so does one of those
   workers lost, at once.
4. Send ``start`` with a common start time; the job is ``running``.

A job submitted from a savepoint (``from_savepoint``, checked to fit by
:func:`.from_savepoint.incompatibility`) first gets a copy of the savepoint's files
(:func:`.from_savepoint.copy_savepoint`), deploys with its tasks restored from it (step
2), and starts with the savepoint's clock origin (step 4).

A job is ``finished`` when every task has reported it finished (bounded sources exhausted
and every record processed), ``failed`` (with the cause) when a task raises, a data link
breaks or a worker hosting a task dies, and ``stopped`` when asked to stop.

Steps 2-4 are carried out by :mod:`.deployment`; what workers tell (their messages, their
registrations and losses) by :mod:`.inbox`; a failure, recovered from or not, by
:func:`.recovery.failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from controlplane.abstraction import Abstraction, Plan, Resolver, resolve_importable
from controlplane.statuses import JobStatus
from runtime import messages
from runtime.checkpoints.store import CheckpointStoreError
from runtime.dataflow import JobGraph
from runtime.layout import Layout
from runtime.records import BarrierKind

from . import deployment, inbox
from .checkpoint_report import CheckpointPolicy, CheckpointReport, RestartPolicy
from .checkpointer import Checkpointer, CheckpointListener, Restorable
from .cluster import HEARTBEAT_TIMEOUT_S, Cluster
from .errors import CoordinatorError, SourceError
from .from_savepoint import copy_savepoint, incompatibility
from .layouts import abstraction_of, refresh_workers
from .listing import listed
from .model import RunningJob, RuntimeConfig, WorkerInfo
from .plans import apply, cancel
from .reconfig import reconfigure
from .recovery import failed, restore_of
from .restart import restart_with
from .resume import RESTARTED, resume
from .validation import ValidatedPlan, validate

if TYPE_CHECKING:
    from .report import Listener, RunReport
    from .slot import Cancellation

__all__ = ["Coordinator"]

logger = logging.getLogger(__name__)

BARRIER_TIMEOUT_S = 30.0  # every task acks an injected barrier within this
STOP_TIMEOUT_S = 5.0  # workers send their last counts of a stopped job within this


class Coordinator(Cluster):
    """Accepts workers, deploys jobs and follows them. Start with :meth:`start`."""

    def __init__(
        self,
        secret: str,
        host: str = "127.0.0.1",
        port: int = 0,
        config: RuntimeConfig | None = None,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        resolve_logic: Resolver = resolve_importable,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(secret, host, port, heartbeat_timeout_s=heartbeat_timeout_s, tls=tls)
        self.config = config or RuntimeConfig()
        self.jobs: dict[str, RunningJob] = {}
        self._job_ids = itertools.count(1)
        # What a logic ref in a plan may name (raises BadLogic otherwise); the server's
        # accepts registered code only, a program running its own coordinator anything.
        self.resolve_logic = resolve_logic
        # Told of every job's checkpoints as they go, of each recovery as it starts (the
        # job and the failure) and once the job runs again with the version it made (the
        # control plane records them).
        self.on_checkpoint: CheckpointListener | None = None
        self.on_recovering: Callable[[str, str], None] | None = None
        self.on_recovery: Callable[[str, RunReport, dict[str, Any]], None] | None = None
        # Told of partitions a source found that no task reads (job, operator, names):
        # the control plane submits the plan; without a listener the coordinator applies it.
        self.on_partitions_found: Callable[[str, str, tuple[str, ...]], None] | None = None
        self.listings: dict[int, asyncio.Future[messages.PartitionsListed]] = {}  # listing.py

    async def close(self) -> None:
        """Stop running jobs, tell workers to exit, close every connection."""
        for job in list(self.jobs.values()):
            if not job.done:
                await self.stop_job(job.id)
        await super().close()

    # -- jobs ---------------------------------------------------------------------------------

    async def submit(
        self,
        graph: JobGraph,
        workers: list[str] | None = None,
        *,
        job_id: str | None = None,
        checkpoints: CheckpointPolicy | None = None,
        restart: RestartPolicy | None = None,
        from_savepoint: dict[str, Any] | None = None,
    ) -> RunningJob:
        """Deploy and start ``graph``; returns the running job (or a failed one, with cause).

        ``job_id`` lets the caller (the StreamManager) name the job; it must be new.
        ``checkpoints``: how often the job is checkpointed (None: never); ``restart``: how
        often it may recover from failures (:mod:`.recovery`; None: the default policy).
        ``from_savepoint``: the manifest of a savepoint the job starts from (module
        docstring; the caller checked it fits ``graph``; the job must take checkpoints).
        """
        if from_savepoint is not None and (checkpoints is None or not checkpoints.enabled):
            raise CoordinatorError("a job started from a savepoint must take checkpoints")
        if job_id is not None and job_id in self.jobs:
            raise CoordinatorError(f"job id {job_id!r} is taken")
        ids = workers or [w.id for w in self.alive_workers()]
        if not ids:
            raise CoordinatorError("no workers are registered: start some before submitting a job")
        graph = await listed(self, graph, ids[0])  # SourceError: not submitted
        if from_savepoint is not None and (why := incompatibility(from_savepoint, graph)):
            raise SourceError(why)  # a partition the savepoint read is no longer listed
        layout = Layout.initial(graph, ids)
        job = RunningJob(job_id or f"job-{next(self._job_ids)}", graph, layout)
        if restart is not None:
            job.failures.policy = restart
        self.jobs[job.id] = job
        if checkpoints is not None and checkpoints.enabled:
            try:
                await self._checkpointed(job, checkpoints)
            except CheckpointStoreError as exc:
                await self.fail(job, f"checkpoints cannot be taken: {exc}")
                return job
        base = restore = None
        if from_savepoint is not None:
            assert job.checkpointer is not None
            try:
                base = await asyncio.to_thread(
                    copy_savepoint, job.checkpointer.store, from_savepoint, job.id
                )
            except CheckpointStoreError as exc:
                await self.fail(job, f"the savepoint's files cannot be copied: {exc}")
                return job
            self.skip_barrier_ids(int(base["checkpoint_id"]))
            restore = restore_of(job, layout, base)
        error = await self.deploy(job, layout, restore)
        if error:
            await self.fail(job, error)
            return job
        if job.done:
            return job
        backend = self.backend.name if self.backend is not None else "local"
        job.abstraction = abstraction_of(job, self.alive_workers(), backend)
        job.versions.append(job.abstraction)
        # Step 4. Start with a common clock origin (a savepoint's: its sources keep pace).
        job.started_at = float((base or {}).get("started_at") or time.time())
        job.status = JobStatus.RUNNING
        self.start_deployed(job)
        if job.checkpointer is not None:
            if base is not None:  # a recovery goes back to it until the first checkpoint
                restorable = Restorable(base, layout, job.abstraction)
                job.checkpointer.adopt(restorable, {int(base["checkpoint_id"])})
            job.checkpointer.start()
        logger.info("job %s running on %s", job.id, ", ".join(layout.workers_used()))
        return job

    async def resume(
        self,
        graph: JobGraph,
        job_id: str,
        *,
        manifest: dict[str, Any],
        at_checkpoint: Abstraction,
        latest_version: int,
        checkpoints: CheckpointPolicy,
        restart: RestartPolicy | None = None,
        present: set[int] | None = None,
    ) -> RunningJob:
        """Run job ``job_id``, which ran under an earlier control plane, from its last
        complete checkpoint ``manifest`` (taken in version ``at_checkpoint``; the job's
        last version is ``latest_version``; ``present``: the checkpoints whose
        directories the store holds) on this coordinator's workers (see :mod:`.resume`);
        returns it running, or failed with the cause."""
        if job_id in self.jobs:
            raise CoordinatorError(f"job id {job_id!r} is taken")
        placeholder = Layout({}, {}, {}, {})
        job = RunningJob(job_id, graph, placeholder)
        if restart is not None:
            job.failures.policy = restart
        self.jobs[job.id] = job
        self.skip_barrier_ids(int(manifest["checkpoint_id"]))
        try:
            await self._checkpointed(job, checkpoints, fresh=False)
        except CheckpointStoreError as exc:
            await self.fail(job, f"{RESTARTED}; checkpoints cannot be taken: {exc}")
            return job
        await resume(self, job, manifest, at_checkpoint, latest_version, present or set())
        return job

    async def _checkpointed(
        self, job: RunningJob, policy: CheckpointPolicy, fresh: bool = True
    ) -> None:
        """Set ``job`` up to take checkpoints as ``policy`` says, into the configured
        store (raises :class:`CheckpointStoreError` if the store cannot be opened). A
        ``fresh`` (new) job starts with nothing in its directory of the store."""
        location = self.config.checkpoint_store
        job.checkpoint_policy = policy
        job.checkpointer = await Checkpointer.open(self, job, policy, location, self.on_checkpoint)
        if fresh:
            # What the directory holds is an earlier job's of the same id (a coordinator
            # that names its jobs job-1, job-2... in every process).
            await asyncio.to_thread(job.checkpointer.store.delete, job.id)
        job.slot.quiescer = job.checkpointer
        job.checkpoint_config = messages.CheckpointConfig(location, policy.full_every)

    async def deploy(
        self, job: RunningJob, layout: Layout, restore: dict[str, messages.Restore] | None = None
    ) -> str | None:
        """Steps 2-3: deploy ``layout`` as the job's next attempt (see
        :func:`.deployment.deploy`); returns an error, or None when deployed."""
        return await deployment.deploy(self, job, layout, restore)

    def start_deployed(self, job: RunningJob) -> None:
        """Step 4: start the deployed job (see :func:`.deployment.start_deployed`)."""
        deployment.start_deployed(self, job)

    async def restart_with(self, job_id: str, layout: Layout) -> RunReport:
        """The stop-and-restart baseline (see :mod:`.restart`); returns the report."""
        return await restart_with(self, self._job(job_id), layout)

    async def stop_job(self, job_id: str) -> RunningJob:
        """Stop the job everywhere; waits (at most ``STOP_TIMEOUT_S``) for the workers' last
        counts, so the job's totals include what its tasks did since their last report."""
        job = self._job(job_id)
        if job.end(JobStatus.STOPPED):
            loop = asyncio.get_running_loop()
            job.stop_replies = {
                wid: loop.create_future()
                for wid in job.layout.workers_used()
                if self.connected(wid)
            }
            self.stop_everywhere(job)
            if job.stop_replies:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.gather(*job.stop_replies.values()), STOP_TIMEOUT_S
                    )
        return job

    async def savepoint(self, job_id: str, *, stop: bool = False) -> CheckpointReport:
        """Take a savepoint of the running job (see :meth:`.Checkpointer.savepoint`);
        returns its report once it has ended (``completed``, or ``abandoned`` with its
        error: the job runs on). With ``stop``, a completed savepoint stops the job:

        1. the savepoint completes (every task's part durable, its manifest written);
        2. ``commit_checkpoint`` goes to the job's workers (sinks make visible what they
           prepared up to the savepoint);
        3. then ``stop``: on each worker's connection after the commit, so the sinks
           have committed everything up to the savepoint before the job is ``stopped``.

        :class:`CoordinatorError` when the job takes no checkpoints, is not running, or
        cannot take one now (saying why)."""
        job = self._job(job_id)
        if job.checkpointer is None:
            raise CoordinatorError(
                f"job {job_id} takes no checkpoints, and a savepoint is one: submit it "
                "with checkpoints on to take savepoints of it"
            )
        if job.status not in (JobStatus.RUNNING, JobStatus.RECONFIGURING, JobStatus.RECOVERING):
            raise CoordinatorError(f"job {job_id} is {job.status}: only a running job has one")
        # Steps 1-2 (the commit goes out before the savepoint's waiter is told).
        report = await job.checkpointer.savepoint()
        if stop and report.status == "completed":
            await self.stop_job(job_id)  # Step 3.
        return report

    async def inject_barrier(
        self,
        job_id: str,
        kind: BarrierKind = BarrierKind.CHECKPOINT,
        timeout: float = BARRIER_TIMEOUT_S,
    ) -> int:
        """Inject a barrier at the sources and wait until every task has aligned it."""
        job = self._job(job_id)
        if job.status != JobStatus.RUNNING:
            raise CoordinatorError(f"job {job_id} is {job.status}, not running")
        bid = self.next_barrier_id()
        fut = asyncio.get_running_loop().create_future()
        pending = set(job.graph.task_ids()) - job.finished_tasks
        job.barrier_waits[bid] = (pending, fut)
        for wid in job.layout.workers_used():
            self.send(wid, messages.InjectBarrier(job_id, kind, bid))
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            left = sorted(job.barrier_waits.get(bid, (set(), None))[0])
            raise CoordinatorError(
                f"barrier {bid} not acked within {timeout:.0f}s by {left[:10]}"
            ) from None
        finally:
            job.barrier_waits.pop(bid, None)
        return bid

    async def reconfigure(
        self,
        job_id: str,
        layout: Layout,
        *,
        wait: bool = True,
        sync_timeout_s: float | None = None,
        plan: Plan | None = None,
    ) -> RunReport:
        """Change the running job to ``layout`` live (see :mod:`.reconfig`); returns the report."""
        return await reconfigure(
            self, self._job(job_id), layout, wait=wait, plan=plan, sync_timeout_s=sync_timeout_s
        )

    def current_abstraction(self, job_id: str) -> Abstraction:
        """The job's current abstraction version, listing the coordinator's workers as
        they are now (what a plan for it is built on and validated against)."""
        job = self._job(job_id)
        backend = self.backend.name if self.backend is not None else "local"
        return refresh_workers(job.abstraction, self.alive_workers(), backend)

    def validate_plan(self, job_id: str, plan: Plan) -> ValidatedPlan:
        """Check ``plan`` against the job's current abstraction (see :func:`.validation.validate`:
        raises the abstraction's ``PlanError`` subclasses); :meth:`apply_plan` trusts the
        result."""
        return validate(self, self._job(job_id), plan)

    async def apply_plan(
        self,
        job_id: str,
        plan: Plan | ValidatedPlan,
        *,
        wait: bool = True,
        sync_timeout_s: float | None = None,
        restart: bool = False,
        new_workers: bool = False,
        on_change: Listener | None = None,
        cancellation: Cancellation | None = None,
    ) -> RunReport:
        """Carry out ``plan`` live, validated first unless it was (or, with ``restart``, by
        the stop-and-restart baseline, on new worker processes with ``new_workers``); see
        :func:`.plans.apply`."""
        return await apply(
            self,
            self._job(job_id),
            plan,
            wait=wait,
            sync_timeout_s=sync_timeout_s,
            restart=restart,
            new_workers=new_workers,
            on_change=on_change,
            cancellation=cancellation,
        )

    def cancel_plan(self, job_id: str, reason: str = "cancelled on request") -> RunReport | None:
        """Cancel the plan under way on ``job_id`` (or reserved for it) at its next safe
        point; returns its report (see :func:`.plans.cancel`; :class:`ReconfigurationError`
        when it cannot be)."""
        return cancel(self._job(job_id), reason)

    def channel_config(self) -> messages.ChannelConfig:
        """How the workers' channels batch and buffer, and whether keyed tasks sketch hot
        keys, as they are told it."""
        c = self.config
        return messages.ChannelConfig(c.batch_size, c.linger_s, c.credits, c.hot_keys)

    def _job(self, job_id: str) -> RunningJob:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise CoordinatorError(f"no job {job_id!r}") from None

    async def fail(self, job: RunningJob, error: str) -> None:
        """``job`` failed with ``error``: it recovers from its last complete checkpoint if
        it can (:mod:`.recovery`), else it ends failed and is stopped everywhere."""
        failed(self, job, error)

    def stop_everywhere(self, job: RunningJob) -> None:
        """Tell every worker to stop ``job``: also those its tasks are leaving in a change
        under way (a worker forgets a job once none of its tasks is left there)."""
        self.broadcast(messages.Stop(job.id))

    # -- what workers tell (hooks of Cluster, carried out by .inbox) --------------------------

    def _on_registered(self, info: WorkerInfo) -> None:
        inbox.registered(self, info)

    def _on_cause_known(self, info: WorkerInfo, earlier: str | None) -> None:
        inbox.cause_known(self, info, earlier)

    def _on_lost(self, info: WorkerInfo) -> None:
        inbox.lost(self, info)

    def _on_message(self, info: WorkerInfo, msg: messages.ToCoordinator) -> None:
        """React to ``msg`` from worker ``info`` (decoded: see :mod:`runtime.messages`)."""
        inbox.took(self, info, msg)
