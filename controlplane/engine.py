"""The control plane's handle on the cluster: a coordinator, its worker backend, and the
bridge between request threads and the coordinator's event loop.

The coordinator runs on the server's event loop (the app's lifespan calls :meth:`Engine.start`
and :meth:`Engine.close` there). Routes and services run in a thread pool and call the
engine's synchronous methods, which run the work on the loop and wait for it, each wait
bounded by a named timeout. The engine knows nothing of the database or of HTTP: it raises
:mod:`controlplane.errors` exceptions, and :mod:`controlplane.tracking` persists what it
reports.

A plan is carried out in three steps:

1. :meth:`Engine.reserve` (request thread) builds the plan and has the coordinator
   validate it against the job's current abstraction (the one validation: a
   :class:`~controlplane.coordinator.ValidatedPlan`, trusted from then on), then reserves
   the job's :class:`~controlplane.coordinator.slot.ChangeSlot`, the one owner of "one
   reconfiguration at a time"; a refusal raises at once and changes nothing.
2. The caller records the reconfiguration and, once that is committed, calls
   :meth:`Engine.launch` (or :meth:`Engine.release` if it rolled back).
3. :meth:`Engine.carry_out` (on the loop) runs ``coordinator.apply_plan``, reports a
   :class:`Progress` at every phase the coordinator's report passes through (its
   ``on_change`` listener; the reports are written one after another, in order) and a
   final one, then frees the job.

Savepoints (:meth:`Engine.savepoint`) are taken by the job's checkpointer, on request
(see :meth:`controlplane.coordinator.Coordinator.savepoint`); the request waits for the
savepoint to end.

A plan is cancelled one way, reserved or under way: :meth:`Engine.cancel` asks the
coordinator (:func:`controlplane.coordinator.plans.cancel`).

Jobs are named by the caller: the control plane submits each under its database id
(:func:`job_key`), so the abstraction's ``job.id`` is the API's id and ids never restart
with the process.

This module is the synchronous facade; what runs on the loop for it (checking a plan,
carrying it out with its progress reports, the views copied from the coordinator) is
:mod:`controlplane.engine_loop`, and the views themselves are
:mod:`controlplane.engine_views`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from controlplane.abstraction import (
    Abstraction,
)
from controlplane.backends import BackendError, WorkerBackend, make_backend, tls_files
from controlplane.config import Settings
from controlplane.coordinator import (
    Coordinator,
    CoordinatorError,
    ReconfigurationError,
    RuntimeConfig,
    SourceError,
)
from controlplane.coordinator.checkpoint_report import CheckpointPolicy, RestartPolicy
from controlplane.engine_loop import (
    carry_out_plan,
    check_plan,
    check_room,
    free,
    job_state,
    log_failure,
    metrics_view,
    preview_plan,
    registered_workers,
)
from controlplane.engine_views import (
    JobState,
    JobView,
    MetricsView,
    PlanBuilder,
    Preview,
    Progress,
    Reservation,
    WorkerView,
    job_key,
)
from controlplane.errors import (
    BadJob,
    Conflict,
    JobNotRunning,
    NotCancellable,
    NotFound,
    Unavailable,
    WorkerBusy,
)
from controlplane.statuses import CheckpointStatus, WorkerStatus
from runtime.dataflow import JobGraph

__all__ = [
    "CALL_TIMEOUT_S",
    "SUBMIT_TIMEOUT_S",
    "Engine",
    "JobState",
    "JobView",
    "MetricsView",
    "PlanBuilder",
    "Progress",
    "Reservation",
    "WorkerView",
    "job_key",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CALL_TIMEOUT_S = (
    10.0  # a quick question to the coordinator (state, stop, validate) answers within this
)
SUBMIT_TIMEOUT_S = 45.0  # a submission deploys within this (the coordinator's own limit is 30 s)
WORKER_POLL_S = 0.05  # a newly started worker's registration is noticed within this
CLOSE_TIMEOUT_S = 30.0  # in-flight reconfigurations wind down within this at shutdown
SAVEPOINT_QUEUE_S = 30.0  # a savepoint waits at most this for the checkpoint or change before it


class Engine:
    """The coordinator and its worker backend (``settings.backend``), started on the
    caller's event loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        secret = settings.cluster_secret
        self._secret = secret.get_secret_value() if secret is not None else secrets.token_hex(16)
        self.coordinator = Coordinator(
            self._secret,
            host=settings.coordinator_host,
            port=settings.coordinator_port,
            config=RuntimeConfig(
                precopy_min_bytes=settings.precopy_min_bytes,
                precopy_pause_ms=settings.precopy_pause_ms,
                stage_window=settings.stage_window,
                hot_keys=settings.hot_keys,
                checkpoint_store=settings.checkpoint_location(),
            ),
            tls=tls.server() if (tls := tls_files(settings)) is not None else None,
        )
        self.backend: WorkerBackend | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._runs: set[asyncio.Task[None]] = set()  # plans carried out, until recorded

    # -- lifecycle (on the loop) -----------------------------------------------------------

    async def start(self) -> None:
        """Listen for workers, start ``settings.local_workers`` with the backend and wait
        until they have registered (``settings.workers_timeout_s``); on failure (e.g. a
        :class:`~controlplane.backends.BackendError` when Spark cannot start) nothing is left
        running and the error propagates."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        address = await self.coordinator.start()
        try:
            self.backend = await make_backend(self.settings, self.coordinator, self._secret)
            self.coordinator.backend = self.backend
            n = self.settings.local_workers
            if n:
                await self.backend.start_workers(n)
                await self.coordinator.wait_for_workers(n, self.settings.workers_timeout_s)
        except BaseException:
            await self.close()
            raise
        logger.info("coordinator at %s:%s with %d %s workers", *address, n, self.backend.name)

    async def close(self) -> None:
        """Cancel in-flight reconfigurations, stop every job, then every worker."""
        runs = list(self._runs)
        for run in runs:
            run.cancel()
        if runs:
            await asyncio.wait(runs, timeout=CLOSE_TIMEOUT_S)
        await self.coordinator.close()
        if self.backend is not None:
            await self.backend.close()

    def states(self) -> dict[str, JobState]:
        """Every job the coordinator knows, by its id (call on the loop)."""
        return {job_id: job_state(job) for job_id, job in list(self.coordinator.jobs.items())}

    def alive_workers(self) -> int:
        return len(self.coordinator.alive_workers())

    def workers_now(self) -> list[WorkerView]:
        """Every worker that has registered, lost ones too (call on the loop)."""
        return registered_workers(self.coordinator)

    # -- synchronous API, for request threads --------------------------------------------

    def submit(
        self,
        graph: JobGraph,
        job_id: str,
        checkpoints: CheckpointPolicy | None = None,
        restart: RestartPolicy | None = None,
        from_savepoint: dict[str, Any] | None = None,
    ) -> JobState:
        """Deploy and start ``graph`` as job ``job_id`` (a new id), checkpointed as
        ``checkpoints`` says (None: never) and recovering from failures as ``restart``
        allows (None: the default), from the savepoint whose manifest is
        ``from_savepoint`` if given (checked to fit ``graph`` by the caller); the job may
        come back ``failed`` with its cause. Raises :class:`Unavailable` when no worker is
        registered or the id is taken."""

        async def submit() -> JobState:
            try:
                job = await self.coordinator.submit(
                    graph,
                    job_id=job_id,
                    checkpoints=checkpoints,
                    restart=restart,
                    from_savepoint=from_savepoint,
                )
            except SourceError as exc:
                raise BadJob(f"{exc}", code="bad_source") from None
            except CoordinatorError as exc:
                raise Unavailable(f"{exc}") from None
            document = job.abstraction.to_dict() if job.abstraction is not None else None
            return replace(job_state(job), abstraction=document)

        return self._call(submit, SUBMIT_TIMEOUT_S)

    async def resume(
        self,
        graph: JobGraph,
        job_id: str,
        *,
        manifest: dict[str, Any],
        at_checkpoint: dict[str, Any],
        latest_version: int,
        checkpoints: CheckpointPolicy,
        restart: RestartPolicy | None,
        present: set[int],
    ) -> JobState:
        """(On the loop.) Run job ``job_id`` of an earlier run of the control plane from
        its last complete checkpoint (see :mod:`controlplane.coordinator.resume`); the
        job may come back ``failed`` with its cause."""
        try:
            job = await self.coordinator.resume(
                graph,
                job_id,
                manifest=manifest,
                at_checkpoint=Abstraction.from_dict(at_checkpoint),
                latest_version=latest_version,
                checkpoints=checkpoints,
                restart=restart,
                present=present,
            )
        except CoordinatorError as exc:
            raise Unavailable(f"{exc}") from None
        return job_state(job)

    def stop(self, job_id: str) -> JobState | None:
        """Stop the job (a no-op once it has ended); None if the coordinator does not know it."""

        async def stop() -> JobState | None:
            job = self.coordinator.jobs.get(job_id)
            if job is None:
                return None
            await self.coordinator.stop_job(job_id)
            return job_state(job)

        return self._call(stop, CALL_TIMEOUT_S)

    def savepoint(self, job_id: str, *, stop: bool, timeout_s: float) -> dict[str, Any]:
        """Take a savepoint of the running job and wait for it (a job whose checkpoint
        timeout is ``timeout_s``); with ``stop``, stop the job once it completed (its
        sinks committed up to it first). Returns the completed savepoint's report
        (:meth:`~controlplane.coordinator.checkpoint_report.CheckpointReport.reported`).

        Raises :class:`JobNotRunning` for a job not deployed here; :class:`Conflict`
        ``savepoint_refused`` saying why none can be taken (no checkpoints, not running,
        one already under way, tasks finished), ``savepoint_abandoned`` with its error
        when it could not complete (the job runs on, not stopped)."""

        async def take() -> dict[str, Any]:
            if self.coordinator.jobs.get(job_id) is None:
                raise JobNotRunning(
                    "the job is not deployed on this control plane (it ended, or the control "
                    "plane restarted since)"
                )
            try:
                report = await self.coordinator.savepoint(job_id, stop=stop)
            except CoordinatorError as exc:
                raise Conflict(f"{exc}", code="savepoint_refused") from None
            if report.status != CheckpointStatus.COMPLETED:
                raise Conflict(
                    f"savepoint {report.id} of job {job_id} was abandoned: {report.error}; "
                    f"the job runs on{' (not stopped)' if stop else ''}: try again",
                    code="savepoint_abandoned",
                )
            return report.reported()

        return self._call(take, SAVEPOINT_QUEUE_S + timeout_s + CALL_TIMEOUT_S)

    def release_savepoint(self, job_id: str, checkpoint_id: int) -> bool:
        """Savepoint ``checkpoint_id`` of job ``job_id`` was deleted: if the job runs
        here, its checkpointer lets go of it (see
        :meth:`~controlplane.coordinator.checkpointer.Checkpointer.unpin`) and this returns True;
        False when no running job here takes care of its files."""

        async def release() -> bool:
            job = self.coordinator.jobs.get(job_id)
            if job is None or job.done or job.checkpointer is None:
                return False
            job.checkpointer.unpin(checkpoint_id)
            return True

        return self._call(release, CALL_TIMEOUT_S)

    def state(self, job_id: str) -> JobState | None:
        async def state() -> JobState | None:
            job = self.coordinator.jobs.get(job_id)
            return None if job is None else job_state(job)

        return self._call(state, CALL_TIMEOUT_S)

    def all_states(self) -> dict[str, JobState]:
        async def states() -> dict[str, JobState]:
            return self.states()

        return self._call(states, CALL_TIMEOUT_S)

    def workers(self) -> int:
        async def count() -> int:
            return self.alive_workers()

        return self._call(count, CALL_TIMEOUT_S)

    def metrics(self, job_ids: list[str], window_s: float) -> dict[str, MetricsView]:
        """The recent metrics of each of ``job_ids`` the coordinator knows."""

        async def metrics() -> dict[str, MetricsView]:
            now = time.time()
            views = {}
            for job_id in job_ids:
                job = self.coordinator.jobs.get(job_id)
                if job is not None:
                    views[job_id] = metrics_view(job, now, window_s)
            return views

        return self._call(metrics, CALL_TIMEOUT_S)

    def worker_views(self) -> list[WorkerView]:
        """Every worker that has registered (lost ones too), by id."""

        async def views() -> list[WorkerView]:
            return registered_workers(self.coordinator)

        return self._call(views, CALL_TIMEOUT_S)

    def add_workers(self, count: int) -> list[WorkerView]:
        """Start ``count`` workers with the backend and wait until they have registered
        (``settings.workers_timeout_s``); :class:`Unavailable` if they do not, or the
        backend cannot start them (its reason: e.g. Spark's); :class:`WorkerLimit` if
        they would pass ``settings.max_workers``."""

        async def add() -> list[WorkerView]:
            if self.backend is None:
                raise Unavailable("the worker backend is not running")
            check_room(self.coordinator, count, self.settings.max_workers)
            try:
                pids = set(await self.backend.start_workers(count))
            except BackendError as exc:
                raise Unavailable(f"cannot start workers: {exc}") from None
            deadline = time.monotonic() + self.settings.workers_timeout_s
            while True:
                new = [
                    w
                    for w in registered_workers(self.coordinator)
                    if w.pid in pids and w.status == WorkerStatus.ALIVE
                ]
                if len(new) == len(pids):
                    return new
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"only {len(new)} of {count} new workers registered within "
                        f"{self.settings.workers_timeout_s:g}s; see the server log"
                    )
                await asyncio.sleep(WORKER_POLL_S)

        return self._call(add, self.settings.workers_timeout_s + CALL_TIMEOUT_S)

    def drain_worker(self, worker_id: str) -> WorkerView:
        """Ask an idle worker to exit. :class:`NotFound` for an unknown (or already lost)
        worker; :class:`WorkerBusy` naming the tasks while live jobs have tasks on it (move
        them first, e.g. with a migrate plan)."""

        async def drain() -> WorkerView:
            view = next(
                (w for w in registered_workers(self.coordinator) if w.id == worker_id), None
            )
            if view is None or view.status != WorkerStatus.ALIVE:
                raise NotFound(f"worker {worker_id!r} is not registered (see GET /workers)")
            if view.tasks:
                raise WorkerBusy(
                    f"worker {worker_id!r} hosts tasks {', '.join(view.tasks)} of running "
                    "jobs: move them first (POST /jobs/{id}/migrate or a plan), then drain"
                )
            if self.backend is None or not self.backend.owns(view.pid):
                raise Unavailable(
                    f"worker {worker_id!r} (pid {view.pid}) was not started by this control "
                    "plane's backend: stop it where it was started"
                )
            try:
                await self.backend.stop_worker(view.pid)
            except BackendError as exc:
                raise Unavailable(f"cannot stop worker {worker_id!r}: {exc}") from None
            return replace(view, status=WorkerStatus.STOPPED)

        return self._call(drain, CLOSE_TIMEOUT_S)

    def reserve(self, job_id: str, build: PlanBuilder, *, may_start_workers: bool) -> Reservation:
        """Build the plan (``build`` gets the job's current abstraction, with the
        coordinator's current workers), validate it, and reserve the job for it.

        Raises :class:`JobNotRunning`, :class:`ReconfigurationInProgress`,
        :class:`StaleBaseVersion` or :class:`PlanRefused` (whose message names the key
        group, task or worker at fault; code ``no_change`` for a plan with nothing to do);
        for a plan that starts workers (``"new"``), :class:`Forbidden` unless
        ``may_start_workers`` and :class:`WorkerLimit` past ``settings.max_workers``.
        """

        async def reserve() -> Reservation:
            job, _, validated = check_plan(
                self.coordinator, job_id, build, True, may_start_workers, self.settings.max_workers
            )
            return Reservation(job_id, validated, job.slot.reserve())

        return self._call(reserve, CALL_TIMEOUT_S)

    def preview(
        self, job_id: str, build: PlanBuilder, state_window_s: float, *, may_start_workers: bool
    ) -> Preview:
        """What the plan ``build`` makes would do, validated as :meth:`reserve` does but
        neither reserved nor carried out (a preview may be asked while a change runs): the
        diff, the versions and the state it would ship, estimated from the sizes measured
        over the last ``state_window_s``."""

        async def preview() -> Preview:
            return preview_plan(
                self.coordinator,
                job_id,
                build,
                state_window_s,
                may_start_workers,
                self.settings.max_workers,
            )

        return self._call(preview, CALL_TIMEOUT_S)

    def release(self, reservation: Reservation) -> None:
        """Give up a reservation that will not be carried out (thread-safe)."""

        self._when_on_loop(lambda: free(self.coordinator, reservation))

    def cancel(self, job_id: str, reason: str) -> None:
        """Cancel the job's plan under way, or reserved and not started yet (then it never
        starts: it is reported ``cancelled``); see
        :func:`controlplane.coordinator.plans.cancel`. :class:`NotCancellable` says why
        not: nothing under way, a pause-mode update under way, a stop-and-restart."""

        async def cancel() -> None:
            job = self.coordinator.jobs.get(job_id)
            if job is None or not job.slot.busy:
                raise NotCancellable("no reconfiguration of the job is under way")
            try:
                self.coordinator.cancel_plan(job_id, reason)
            except ReconfigurationError as exc:
                raise NotCancellable(str(exc)) from None

        self._call(cancel, CALL_TIMEOUT_S)

    def launch(
        self, reservation: Reservation, report: Callable[[Progress], Awaitable[None]]
    ) -> None:
        """Carry out a reservation in the background (thread-safe; see :meth:`carry_out`)."""

        def spawn() -> None:
            run = asyncio.create_task(
                self.carry_out(reservation, report), name=f"plan-{reservation.job_id}"
            )
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)
            run.add_done_callback(log_failure)

        self._when_on_loop(spawn)

    # -- on the loop -------------------------------------------------------------------------

    async def carry_out(
        self, reservation: Reservation, report: Callable[[Progress], Awaitable[None]]
    ) -> None:
        """Run the reserved plan, reporting its progress to ``report`` (see
        :func:`controlplane.engine_loop.carry_out_plan`); the job is freed after the final
        report."""
        await carry_out_plan(self.coordinator, reservation, report)

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float) -> T:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise Unavailable("the control plane is not running (starting up or shutting down)")
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("Engine's synchronous methods are for threads, not the event loop")
        future = asyncio.run_coroutine_threadsafe(fn(), loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise Unavailable(
                f"the coordinator did not answer within {timeout:.0f}s; try again"
            ) from None

    def _when_on_loop(self, action: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise Unavailable("the control plane is not running (starting up or shutting down)")
        if threading.get_ident() == self._loop_thread:
            action()
        else:
            loop.call_soon_threadsafe(action)
