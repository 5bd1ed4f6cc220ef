"""The control plane's handle on the cluster: a coordinator, its worker backend, and the
bridge between request threads and the coordinator's event loop.

The coordinator runs on the server's event loop (the app's lifespan calls :meth:`Engine.start`
and :meth:`Engine.close` there). Routes and services run in a thread pool and call the
engine's synchronous methods, which run the work on the loop and wait for it, each wait
bounded by a named timeout. The engine knows nothing of the database or of HTTP: it raises
:mod:`controlplane.errors` exceptions, and :mod:`controlplane.tracking` persists what it
reports.

A plan is carried out in three steps:

1. :meth:`Engine.reserve` (request thread) builds and validates the plan against the job's
   current abstraction on the loop and marks the job busy; a refusal raises at once and
   changes nothing.
2. The caller records the reconfiguration and, once that is committed, calls
   :meth:`Engine.launch` (or :meth:`Engine.release` if it rolled back).
3. :meth:`Engine.carry_out` (on the loop) runs ``coordinator.apply_plan``, reports a
   :class:`Progress` at each phase change it observes and a final one, then frees the job.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from controlplane.abstraction import AbstractionError, Plan, apply_plan, diff
from controlplane.backends import LocalBackend
from controlplane.config import Settings
from controlplane.coordinator import Coordinator, CoordinatorError, Job
from controlplane.coordinator.plans import refresh_workers
from controlplane.coordinator.reconfig import ReconfigurationError
from controlplane.errors import (
    JobNotRunning,
    PlanRefused,
    ReconfigurationInProgress,
    Unavailable,
    from_abstraction_error,
)
from runtime.dataflow import JobGraph

__all__ = [
    "CALL_TIMEOUT_S",
    "PROGRESS_POLL_S",
    "SUBMIT_TIMEOUT_S",
    "Engine",
    "JobState",
    "JobView",
    "PlanBuilder",
    "Progress",
    "Reservation",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CALL_TIMEOUT_S = (
    10.0  # a quick question to the coordinator (state, stop, validate) answers within this
)
SUBMIT_TIMEOUT_S = 45.0  # a submission deploys within this (the coordinator's own limit is 30 s)
PROGRESS_POLL_S = 0.05  # a reconfiguration's phase changes are noticed within this
CLOSE_TIMEOUT_S = 30.0  # in-flight reconfigurations wind down within this at shutdown


@dataclass(frozen=True)
class JobState:
    """A job as the coordinator sees it; ``abstraction`` (the current version's document)
    is filled by :meth:`Engine.submit` only."""

    runtime_id: str
    status: str
    error: str | None
    version: int | None
    abstraction: dict[str, Any] | None = None


@dataclass(frozen=True)
class Reservation:
    """A validated plan for a job that is now reserved for it (see :meth:`Engine.reserve`).
    ``affected`` are the tasks the plan touches (from the abstraction diff)."""

    runtime_id: str
    plan: Plan
    affected: tuple[str, ...]


@dataclass(frozen=True)
class Progress:
    """Where a reconfiguration stands. ``version`` and ``abstraction`` (the new current
    version and its document) are set on the final report of a completed one."""

    status: str
    error: str | None = None
    affected: tuple[str, ...] | None = None
    timings_ms: Mapping[str, float] = field(default_factory=dict)
    pause_ms: Mapping[str, float] = field(default_factory=dict)
    runtime_id: int | None = None
    version: int | None = None
    abstraction: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        return self.status in ("completed", "failed", "aborted")

    @classmethod
    def of(cls, rec: Any) -> Progress:
        """The progress of a coordinator ``Reconfiguration`` record."""
        return cls(
            status=rec.status,
            error=rec.error,
            affected=tuple(sorted(rec.affected)),
            timings_ms=dict(rec.timings_ms),
            pause_ms=dict(sorted(rec.pause_ms.items())),
            runtime_id=rec.id,
        )


class JobView:
    """What a :data:`PlanBuilder` may read of a running job: its current abstraction (with
    the coordinator's current workers) and measured loads."""

    def __init__(self, job: Job, abstraction: Any) -> None:
        self._job = job
        self.abstraction = abstraction

    def key_group_loads(self, operator: str, window_s: float) -> dict[int, float]:
        """Records per second of each key group of ``operator`` over the last ``window_s``
        (empty when no task of it reported per-key-group counts in that window)."""
        since = time.time() - window_s
        loads: dict[int, float] = {}
        operator_of = self._job.metrics.operator_of
        for t, task, snap in list(self._job.metrics.samples):
            if t < since or operator_of.get(task) != operator:
                continue
            for group, count in dict(snap.get("key_groups") or {}).items():
                loads[int(group)] = loads.get(int(group), 0.0) + float(count) / window_s
        return loads


PlanBuilder = Callable[[JobView], Plan]


class Engine:
    """The coordinator and its local worker backend, started on the caller's event loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        secret = settings.cluster_secret
        self._secret = secret.get_secret_value() if secret is not None else secrets.token_hex(16)
        self.coordinator = Coordinator(
            self._secret, host=settings.coordinator_host, port=settings.coordinator_port
        )
        self.backend: LocalBackend | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._busy: set[str] = set()  # runtime ids of jobs with a reserved or running plan
        self._runs: set[asyncio.Task[None]] = set()

    # -- lifecycle (on the loop) -----------------------------------------------------------

    async def start(self) -> None:
        """Listen for workers, start ``settings.local_workers`` local ones and wait until
        they have registered (``settings.workers_timeout_s``); on failure nothing is left
        running and the error propagates."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        address = await self.coordinator.start()
        self.backend = LocalBackend(address, self._secret, log_level=self.settings.worker_log_level)
        self.coordinator.backend = self.backend
        try:
            n = self.settings.local_workers
            if n:
                await self.backend.start_workers(n)
                await self.coordinator.wait_for_workers(n, self.settings.workers_timeout_s)
        except BaseException:
            await self.close()
            raise
        logger.info("coordinator at %s:%s with %d local workers", *address, n)

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
        """Every job the coordinator knows, by runtime id (call on the loop)."""
        return {rid: _state(job) for rid, job in list(self.coordinator.jobs.items())}

    def alive_workers(self) -> int:
        return len(self.coordinator.alive_workers())

    # -- synchronous API, for request threads --------------------------------------------

    def submit(self, graph: JobGraph) -> JobState:
        """Deploy and start ``graph``; the job may come back ``failed`` with its cause.
        Raises :class:`Unavailable` when no worker is registered."""

        async def submit() -> JobState:
            try:
                job = await self.coordinator.submit(graph)
            except CoordinatorError as exc:
                raise Unavailable(f"{exc}") from None
            document = job.abstraction.to_dict() if job.abstraction is not None else None
            return replace(_state(job), abstraction=document)

        return self._call(submit, SUBMIT_TIMEOUT_S)

    def stop(self, runtime_id: str) -> JobState | None:
        """Stop the job (a no-op once it has ended); None if the coordinator does not know it."""

        async def stop() -> JobState | None:
            job = self.coordinator.jobs.get(runtime_id)
            if job is None:
                return None
            await self.coordinator.stop_job(runtime_id)
            return _state(job)

        return self._call(stop, CALL_TIMEOUT_S)

    def state(self, runtime_id: str) -> JobState | None:
        async def state() -> JobState | None:
            job = self.coordinator.jobs.get(runtime_id)
            return None if job is None else _state(job)

        return self._call(state, CALL_TIMEOUT_S)

    def all_states(self) -> dict[str, JobState]:
        async def states() -> dict[str, JobState]:
            return self.states()

        return self._call(states, CALL_TIMEOUT_S)

    def workers(self) -> int:
        async def count() -> int:
            return self.alive_workers()

        return self._call(count, CALL_TIMEOUT_S)

    def reserve(self, runtime_id: str, build: PlanBuilder) -> Reservation:
        """Build the plan (``build`` gets the job's current abstraction, with the
        coordinator's current workers), validate it, and reserve the job for it.

        Raises :class:`JobNotRunning`, :class:`ReconfigurationInProgress`,
        :class:`StaleBaseVersion` or :class:`PlanRefused` (whose message names the key
        group, task or worker at fault; code ``no_change`` for a plan with nothing to do).
        """

        async def reserve() -> Reservation:
            job = self.coordinator.jobs.get(runtime_id)
            if job is None:
                raise JobNotRunning(
                    "the job is not deployed on this control plane (it ended, or the control "
                    "plane restarted since); submit it again"
                )
            if runtime_id in self._busy or job.lock.locked() or job.status == "reconfiguring":
                raise ReconfigurationInProgress(
                    "another reconfiguration of this job is under way; wait until it ends, "
                    "then build the plan on the version it leaves"
                )
            if job.status != "running" or job.abstraction is None:
                raise JobNotRunning(
                    f"the job is {job.status}: only a running job can be reconfigured"
                )
            backend = self.backend.name if self.backend is not None else "local"
            current = refresh_workers(job.abstraction, self.coordinator.alive_workers(), backend)
            try:
                plan = build(JobView(job, current))
                if not plan.ops:
                    raise PlanRefused(
                        f"the plan has no operations: version {current.version} already is "
                        "what was asked",
                        code="no_change",
                    )
                new = apply_plan(current, plan)
                affected = tuple(sorted(diff(current, new).affected))
            except AbstractionError as exc:
                raise from_abstraction_error(exc) from None
            self._busy.add(runtime_id)
            return Reservation(runtime_id, plan, affected)

        return self._call(reserve, CALL_TIMEOUT_S)

    def release(self, reservation: Reservation) -> None:
        """Give up a reservation that will not be carried out (thread-safe)."""
        self._when_on_loop(lambda: self._busy.discard(reservation.runtime_id))

    def launch(
        self, reservation: Reservation, report: Callable[[Progress], Awaitable[None]]
    ) -> None:
        """Carry out a reservation in the background (thread-safe; see :meth:`carry_out`)."""

        def spawn() -> None:
            run = asyncio.create_task(
                self.carry_out(reservation, report), name=f"plan-{reservation.runtime_id}"
            )
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)
            run.add_done_callback(_log_failure)

        self._when_on_loop(spawn)

    # -- on the loop -------------------------------------------------------------------------

    async def carry_out(
        self, reservation: Reservation, report: Callable[[Progress], Awaitable[None]]
    ) -> None:
        """Run the reserved plan; ``report`` is awaited at each observed phase change and
        once at the end (unless cancelled: then the run is cancelled too and whoever
        cancelled records the outcome). The job is freed after the final report."""
        rid, plan = reservation.runtime_id, reservation.plan
        try:
            job = self.coordinator.jobs[rid]
            run = asyncio.create_task(self.coordinator.apply_plan(rid, plan))
            last: Progress | None = None
            try:
                while not run.done():
                    await asyncio.wait({run}, timeout=PROGRESS_POLL_S)
                    rec = _record_of(job, plan)
                    if rec is None or run.done():
                        continue
                    now = Progress.of(rec)
                    if now != last:
                        await report(now)
                        last = now
            except asyncio.CancelledError:
                run.cancel()
                raise
            await report(_outcome(job, plan, run))
        finally:
            self._busy.discard(rid)

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


def _log_failure(run: asyncio.Task[None]) -> None:
    if not run.cancelled() and run.exception() is not None:
        logger.error("carrying out a plan failed", exc_info=run.exception())


def _state(job: Job) -> JobState:
    version = job.abstraction.version if job.abstraction is not None else None
    return JobState(job.id, job.status, job.error, version)


def _record_of(job: Job, plan: Plan) -> Any:
    """The coordinator's record of the reconfiguration carrying out ``plan``, once it exists."""
    return next((r for r in reversed(job.reconfigurations) if r.plan is plan), None)


def _outcome(job: Job, plan: Plan, run: asyncio.Task[Any]) -> Progress:
    try:
        rec = run.result()
    except AbstractionError as exc:
        return Progress("failed", error=f"the plan was refused when applied: {exc}")
    except (ReconfigurationError, CoordinatorError) as exc:
        return Progress("failed", error=str(exc))
    except Exception as exc:
        logger.exception("reconfiguration of job %s raised", job.id)
        return Progress("failed", error=f"internal error: {type(exc).__name__}: {exc}")
    progress = Progress.of(rec)
    if rec.status != "completed":
        return progress
    current = job.abstraction
    document = current.to_dict() if current is not None and current.version == rec.version else None
    return replace(progress, version=rec.version, abstraction=document)
