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
3. Wait for every ``deployed`` (``DEPLOY_TIMEOUT_S``); any ``deploy_failed`` fails the job
   and stops it everywhere, and so does one of those workers lost, at once.
4. Send ``start`` with a common start time; the job is ``running``.

A job submitted from a savepoint (``from_savepoint``, checked to fit by
:func:`.from_savepoint.incompatibility`) first gets a copy of the savepoint's files
(:func:`.from_savepoint.copy_savepoint`), deploys with its tasks restored from it (step
2), and starts with the savepoint's clock origin (step 4).

A job is ``finished`` when every task has reported it finished (bounded sources exhausted
and every record processed), ``failed`` (with the cause) when a task raises, a data link
breaks or a worker hosting a task dies, and ``stopped`` when asked to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import pickle
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from controlplane.abstraction import Abstraction, Plan, Resolver, resolve_importable
from controlplane.statuses import JobStatus
from runtime import codeload, messages
from runtime.checkpoints.store import CheckpointStoreError
from runtime.dataflow import JobGraph
from runtime.layout import Layout
from runtime.records import BarrierKind

from . import discovery
from .checkpoint_report import CheckpointPolicy, CheckpointReport, RestartPolicy
from .checkpointer import Checkpointer, CheckpointListener, Restorable
from .cluster import HEARTBEAT_TIMEOUT_S, Cluster
from .errors import CoordinatorError, SourceError
from .from_savepoint import copy_savepoint, incompatibility
from .layouts import abstraction_of, refresh_workers
from .listing import listed, took_reply
from .model import DeployInFlight, RunningJob, RuntimeConfig, WorkerInfo
from .plans import apply, cancel
from .reconfig import reconfigure
from .recovery import recover, refusal, restore_of
from .restart import restart_with
from .resume import RESTARTED, resume
from .validation import ValidatedPlan, validate

if TYPE_CHECKING:
    from .report import Listener, RunReport
    from .slot import Cancellation

__all__ = ["Coordinator"]

logger = logging.getLogger(__name__)

DEPLOY_TIMEOUT_S = 30.0  # workers import the job's modules and open channels within this
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
        """Steps 2-3: deploy ``layout`` on its workers as the job's next attempt; returns
        an error, or None when deployed. A worker it deploys to that is lost meanwhile
        fails it at once, the error naming the worker (see :meth:`_on_lost`).

        ``restore`` (task -> its key groups' state and source position) seeds tasks with
        state, for a restart from a snapshot.
        """
        used = layout.workers_used()
        missing = [w for w in used if not self.connected(w)]
        if missing:
            return f"workers {missing} are not connected"
        job.attempt += 1
        graph = pickle.dumps(job.graph)
        base = messages.Deploy(
            job_id=job.id,
            graph=graph,
            code=codeload.sources_for([graph, *layout.logic.values()]),
            layout=layout,
            workers=self.data_addresses(),
            config=self.channel_config(),
            attempt=job.attempt,
            checkpoints=job.checkpoint_config,
        )
        deploying = job.deploying = DeployInFlight(used)
        # Step 2. Deploy everywhere.
        for wid in used:
            msg = base
            if restore:
                mine = {t: r for t, r in restore.items() if layout.placement.get(t) == wid}
                msg = dataclasses.replace(base, restore=mine)
            self.send(wid, msg)
        # Step 3. Wait for every worker's answer, or for one of them lost.
        try:
            return await asyncio.wait_for(deploying.outcome, DEPLOY_TIMEOUT_S)
        except TimeoutError:
            return (
                f"deploy timed out after {DEPLOY_TIMEOUT_S:.0f}s: no answer from workers "
                f"{deploying.waiting}"
            )
        finally:
            if job.deploying is deploying:
                job.deploying = None

    def start_deployed(self, job: RunningJob) -> None:
        """Step 4: tell the workers of ``job``'s layout to start it (``job.started_at`` is
        the clock origin); warm the others."""
        for wid in job.layout.workers_used():
            self.send(wid, messages.Start(job.id, job.started_at))
        self._warm(job, [w.id for w in self.alive_workers()])

    def _warm(self, job: RunningJob, workers: list[str]) -> None:
        """Send the job's code to those of ``workers`` that host none of its tasks: each
        imports it at once, so that a task moved there later (a migration to a spare, a
        scale out) does not wait for the imports in the prepare (tens of milliseconds on a
        fresh worker, against a few for the rest of a prepare)."""
        used = set(job.layout.workers_used())
        idle = [w for w in workers if w not in used and self.connected(w)]
        if not idle:
            return
        graph = pickle.dumps(job.graph)
        msg = messages.Warm(
            job.id, graph, codeload.sources_for([graph, *job.layout.logic.values()])
        )
        for wid in idle:
            self.send(wid, msg)

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
        """How the workers' channels batch and buffer, as they are told it."""
        return messages.ChannelConfig(
            self.config.batch_size, self.config.linger_s, self.config.credits
        )

    def _job(self, job_id: str) -> RunningJob:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise CoordinatorError(f"no job {job_id!r}") from None

    async def fail(self, job: RunningJob, error: str) -> None:
        """``job`` failed with ``error``: it recovers from its last complete checkpoint if
        it can (:mod:`.recovery`), else it ends failed and is stopped everywhere."""
        self._failed(job, error)

    def _failed(self, job: RunningJob, error: str, *, lost: bool = False) -> None:
        """See :meth:`fail`; ``lost``: ``error`` is the loss of a worker. A failure while
        the job recovers is of its tasks before the recovery (they are being stopped):
        the recovery goes on, and its reason tells it (a worker's loss first:
        :meth:`.Failures.reason`)."""
        if job.done:
            return
        rec = job.failures
        if job.status == JobStatus.RECOVERING:
            logger.info("job %s (recovering): %s", job.id, error)
            rec.hear(error, lost=lost)
            return
        rec.add(asyncio.get_running_loop().time(), error, lost=lost)
        why = refusal(job) if job.status != JobStatus.STARTING else "it never started"
        if why is None:
            if job.active is not None:  # a reconfiguration under way ends with the error
                job.active.fail(error)
            job.status = JobStatus.RECOVERING
            logger.warning("job %s recovers: %s", job.id, error)
            self._tell_recovering(job, error)
            rec.running = asyncio.ensure_future(recover(self, job))
            return
        if job.checkpointer is not None:
            error = f"{error} (not recovered: {why})"
        if job.end(JobStatus.FAILED, error):
            logger.warning("job %s failed: %s", job.id, error)
            self.stop_everywhere(job)

    def _tell_recovering(self, job: RunningJob, cause: str) -> None:
        if self.on_recovering is None:
            return
        try:
            self.on_recovering(job.id, cause)
        except Exception:
            logger.exception("job %s: the recovering listener failed", job.id)

    def stop_everywhere(self, job: RunningJob) -> None:
        """Tell every worker to stop ``job``: also those its tasks are leaving in a change
        under way (a worker forgets a job once none of its tasks is left there)."""
        self.broadcast(messages.Stop(job.id))

    # -- what workers tell (hooks of Cluster) -----------------------------------------------------

    def _on_registered(self, info: WorkerInfo) -> None:
        for job in self.jobs.values():
            if job.status == JobStatus.RUNNING:
                self._warm(job, [info.id])

    def _on_cause_known(self, info: WorkerInfo, earlier: str | None) -> None:
        before = _lost_message(info, earlier)
        for job in self.jobs.values():
            if job.error == before:
                job.error = _lost_message(info, info.error)

    def _on_lost(self, info: WorkerInfo) -> None:
        for job in self.jobs.values():  # a stop waiting for this worker's last counts
            fut = job.stop_replies.get(info.id)
            if fut is not None and not fut.done():
                fut.set_result(None)
        for job in self.jobs.values():
            msg = _lost_message(info, info.error)
            run = job.active
            if run is not None and info.id in run.workers:  # e.g. a migration's target
                run.fail(msg)
            if job.done:
                continue
            deploying = job.deploying
            if deploying is not None and info.id in deploying.workers:
                # Of the layout being deployed, which job.layout becomes only once it is
                # (a recovery's spare, say): the deploy fails now, and whoever deploys
                # (a submit, a recovery, a resume, a restart) takes it from there.
                deploying.lost(info.id, msg)
                continue
            if info.id in job.layout.workers_used():
                self._failed(job, msg, lost=True)

    def _on_message(self, info: WorkerInfo, msg: messages.ToCoordinator) -> None:
        """React to ``msg`` from worker ``info`` (decoded: see :mod:`runtime.messages`)."""
        match msg:
            case messages.Metrics():
                self._took_metrics(info, msg)
                return
            case messages.PartitionsListed():
                took_reply(self, msg)
                return
            case messages.Register() | messages.Heartbeat():
                logger.warning("worker %s: unexpected %s message, dropped", info.id, msg.TYPE)
                return
        job = self.jobs.get(msg.job_id)  # type: ignore[attr-defined]
        if job is None:
            return
        match msg:
            case messages.Deployed() | messages.DeployFailed():
                if msg.attempt != job.attempt:  # the answer to an earlier deploy
                    return
                if isinstance(msg, messages.Deployed) and msg.restored:
                    job.restored[info.id] = dict(msg.restored)
                if job.deploying is not None:
                    error = msg.error if isinstance(msg, messages.DeployFailed) else None
                    job.deploying.answered(info.id, error)
            case messages.TaskFinished(task=task, metrics=metrics):
                job.metrics.add(time.time(), task, metrics)
                job.finished_tasks.add(task)
                self._end_idle_sources(job, task)
                if job.active is not None:
                    job.active.task_finished(task)
                if job.checkpointer is not None:
                    job.checkpointer.task_finished(task)
                self._check_barriers(job, task, None)
                if len(job.finished_tasks) == len(job.layout.placement) and job.end(
                    JobStatus.FINISHED
                ):
                    logger.info("job %s finished", job.id)
                    self.stop_everywhere(job)
            case messages.TaskFailed(task=task, error=error):
                job.failed_tasks[task] = error
                if job.active is not None:  # a reconfiguration under way ends with its error
                    job.active.fail(error)
                self._failed(job, error)
            case messages.WorkerError(error=error):
                self._failed(job, error)
            case messages.Stopped(metrics=metrics):
                for task, snap in metrics.items():
                    job.metrics.add(time.time(), task, snap)
                fut = job.stop_replies.get(info.id)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            case messages.Snapshot(task=task, metrics=metrics):
                job.metrics.add(time.time(), task, metrics)
                snap = job.snapshot
                if snap is not None:
                    snap.add(msg)
            case messages.BarrierAck(task=task, barrier_id=bid):
                self._check_barriers(job, task, bid)
            case messages.PartitionsFound():
                discovery.found(self, job, msg)
            case (
                messages.CheckpointCaptured()
                | messages.CheckpointAck()
                | messages.CheckpointFailed()
            ):
                if job.checkpointer is not None:
                    job.checkpointer.on_message(msg)
            case (
                messages.Prepared()
                | messages.PrepareFailed()
                | messages.Paused()
                | messages.Updated()
                | messages.UpdateFailed()
                | messages.StageDone()
                | messages.StageWithdrawn()
            ):
                self._reconfiguration_reply(job, info, msg)

    def _end_idle_sources(self, job: RunningJob, finished: str) -> None:
        """Once every task of a partitioned source that reads a partition has finished
        (a bounded source), its tasks left without partitions are told to end."""
        operator = finished.rpartition("-")[0]
        spec = next((op for op in job.graph.operators if op.name == operator), None)
        if spec is None or spec.partitions is None:
            return
        tasks = job.layout.tasks_of(operator)
        reading = [t for t in tasks if job.layout.partitions.get(t)]
        if any(t not in job.finished_tasks for t in reading):
            return
        for t in tasks:
            if t not in reading and t not in job.finished_tasks:
                self.send(job.layout.placement[t], messages.EndInput(job.id, t))

    def _took_metrics(self, info: WorkerInfo, msg: messages.Metrics) -> None:
        info.cpu_percent = msg.cpu_percent
        info.rss_mb = msg.rss_mb
        for job in self.jobs.values():
            if info.id in job.layout.workers_used():
                job.metrics.add_worker(info.id, info.cpu_percent, info.rss_mb)
        for job_id, tasks in msg.jobs.items():
            job = self.jobs.get(job_id)
            if job is None:
                continue
            for task, snap in tasks.items():
                job.metrics.add(msg.time, task, snap)

    def _reconfiguration_reply(
        self, job: RunningJob, info: WorkerInfo, msg: messages.ToCoordinator
    ) -> None:
        """A worker's reply in the reconfiguration under way; one of an earlier (ended)
        reconfiguration is dropped."""
        run = job.active
        if run is None or run.report.id != msg.rid:  # type: ignore[attr-defined]
            return
        if isinstance(msg, messages.Updated) and msg.metrics is not None:
            job.metrics.add(time.time(), msg.task, msg.metrics)
        run.deliver(info.id, msg)

    def _check_barriers(self, job: RunningJob, task: str, bid: int | None) -> None:
        for b, (pending, fut) in job.barrier_waits.items():
            if bid is None or b == bid:
                pending.discard(task)
                if not pending and not fut.done():
                    fut.set_result(b)


def _lost_message(info: WorkerInfo, cause: str | None) -> str:
    """A job's error when ``info``'s worker, hosting some of its tasks, was lost."""
    cause = cause or "control connection lost"
    return f"worker {info.id} (pid {info.pid} on {info.host}) died: {cause}"
