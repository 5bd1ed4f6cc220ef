"""Keeps the database in step with the engine: the orchestration that spans jobs,
abstraction versions and reconfigurations.

- At start-up (:meth:`Tracker.recover`), before the engine runs: jobs recorded as not
  ended cannot be followed any more (their workers died with the previous process), so
  they are marked failed; reconfigurations not ended are marked failed; workers of earlier
  runs still recorded alive are marked lost.
- While running: job states and the worker registry are mirrored every
  ``MIRROR_INTERVAL_S`` (reads refresh jobs too), each reconfiguration's progress is
  written as the engine reports it, with the new abstraction version when it completes,
  and so is each checkpoint's (in the order the coordinator reports them, by one writer).
- At shutdown (:meth:`Tracker.shutdown`), after the engine has closed: reconfigurations
  and checkpoints cut short are marked failed and abandoned, and jobs get their final
  (stopped) state.

Every write is its own unit of work, run in a worker thread so that the event loop,
which also runs the coordinator, never waits on the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from controlplane import db
from controlplane.checkpoints import service as checkpoints
from controlplane.coordinator import RunReport
from controlplane.coordinator.checkpoint_report import CheckpointReport
from controlplane.engine import Engine, JobState, Progress, Reservation
from controlplane.jobs import service as jobs
from controlplane.reconfigurations import service as reconfigurations
from controlplane.statuses import CheckpointStatus, JobStatus, WorkerStatus
from controlplane.workers import service as workers

__all__ = ["MIRROR_INTERVAL_S", "Tracker"]

logger = logging.getLogger(__name__)

MIRROR_INTERVAL_S = 0.5  # a job's status change reaches the database within this
WRITE_ATTEMPTS = 5  # a reconfiguration's final state is written despite brief database trouble
WRITE_RETRY_S = 1.0  # pause between attempts

RESTARTED = "the control plane restarted; the job's workers are gone (submit it again)"
INTERRUPTED_BY_RESTART = "interrupted: the control plane restarted"
INTERRUPTED_BY_SHUTDOWN = "interrupted: the control plane shut down"
STOPPED_BY_SHUTDOWN = "stopped: the control plane shut down"
WORKER_OF_EARLIER_RUN = "the control plane restarted; its workers exited with it"


class Tracker:
    def __init__(self, engine: Engine, sessions: sessionmaker[Session]) -> None:
        self.engine = engine
        self.sessions = sessions
        self._mirror: asyncio.Task[None] | None = None
        self._mirrored: dict[str, JobState] = {}
        self._workers_mirrored: tuple = ()
        self.instance = uuid.uuid4().hex  # names this run's workers in the database
        # Checkpoint reports and recoveries to write, in order: (job id, a report's fields,
        # a discarded checkpoint's id, or a recovery).
        self._checkpoints: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._checkpoint_writer: asyncio.Task[None] | None = None

    def recover(self) -> None:
        """Mark what the previous process left unfinished as failed (call before start)."""
        with db.unit_of_work(self.sessions) as session:
            n_jobs = jobs.sync_states(session=session, states={}, missing=RESTARTED)
            n_recs = reconfigurations.fail_unfinished(
                session=session, reason=INTERRUPTED_BY_RESTART
            )
            checkpoints.abandon_unfinished(session=session, reason=INTERRUPTED_BY_RESTART)
            workers.end_alive(
                session=session,
                instance=self.instance,
                this_run=False,
                status=WorkerStatus.LOST,
                reason=WORKER_OF_EARLIER_RUN,
            )
        if n_jobs or n_recs:
            logger.warning(
                "marked %d job(s) and %d reconfiguration(s) of a previous run failed",
                n_jobs,
                n_recs,
            )

    async def start(self) -> None:
        """Record the workers started with the engine, then mirror job states and workers
        (on the engine's loop)."""
        await self._mirror_workers()
        self._mirror = asyncio.create_task(self._mirror_states(), name="mirror-job-states")
        self._checkpoint_writer = asyncio.create_task(
            self._write_checkpoints(), name="write-checkpoints"
        )
        self.engine.coordinator.on_checkpoint = self._checkpoint_reported
        self.engine.coordinator.on_recovery = self._recovered

    async def stop(self) -> None:
        self.engine.coordinator.on_checkpoint = None
        self.engine.coordinator.on_recovery = None
        for task in (self._mirror, self._checkpoint_writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _recovered(self, job_id: str, report: RunReport, document: dict[str, Any]) -> None:
        # Called by the coordinator, on the loop, once the job runs again: only queue.
        self._checkpoints.put_nowait(
            (job_id, ("recovery", report.reported(), report.plan, document))
        )

    def _checkpoint_reported(self, job_id: str, what: CheckpointReport | int) -> None:
        # Called by the coordinator, on the loop: only queue (a report changes later).
        self._checkpoints.put_nowait((job_id, what if isinstance(what, int) else what.reported()))

    async def _write_checkpoints(self) -> None:
        while True:
            job_id, what = await self._checkpoints.get()
            final = not isinstance(what, dict) or what["status"] != CheckpointStatus.IN_PROGRESS
            attempts = WRITE_ATTEMPTS if final else 1  # a later report supersedes
            for attempt in range(1, attempts + 1):
                try:
                    await asyncio.to_thread(self._write_checkpoint, job_id, what)
                    break
                except Exception:
                    logger.exception(
                        "could not record checkpoint report %s of job %s (attempt %d of %d)",
                        what,
                        job_id,
                        attempt,
                        attempts,
                    )
                    if attempt < attempts:
                        await asyncio.sleep(WRITE_RETRY_S)

    def _write_checkpoint(self, job_id: str, what: dict[str, Any] | int | tuple) -> None:
        with db.unit_of_work(self.sessions) as session:
            if isinstance(what, tuple):  # a recovery, in order with the checkpoints
                _kind, reported, plan, document = what
                reconfigurations.record_recovery(
                    session=session,
                    job_id=int(job_id),
                    reported=reported,
                    plan=plan,
                    base_version=int(document["job"]["version"]) - 1,
                    document=document,
                )
            elif isinstance(what, int):
                checkpoints.discard(session=session, job_db_id=int(job_id), checkpoint_id=what)
            else:
                checkpoints.record(session=session, job_db_id=int(job_id), reported=what)

    def shutdown(self, states: Mapping[str, JobState]) -> None:
        """Record the end of the run, given the engine's final ``states`` (after it closed)."""
        with db.unit_of_work(self.sessions) as session:
            reconfigurations.fail_unfinished(session=session, reason=INTERRUPTED_BY_SHUTDOWN)
            checkpoints.abandon_unfinished(session=session, reason=INTERRUPTED_BY_SHUTDOWN)
            final = {
                rid: s
                if s.status != JobStatus.STOPPED or s.error
                else _with_error(s, STOPPED_BY_SHUTDOWN)
                for rid, s in states.items()
            }
            jobs.sync_states(session=session, states=final, missing=STOPPED_BY_SHUTDOWN)
            workers.end_alive(
                session=session,
                instance=self.instance,
                this_run=True,
                status=WorkerStatus.STOPPED,
                reason="the control plane shut down",
            )

    def launch(self, reconfiguration_id: int, reservation: Reservation) -> None:
        """Carry out a recorded reconfiguration, writing its progress (thread-safe)."""

        async def report(progress: Progress) -> None:
            attempts = WRITE_ATTEMPTS if progress.done else 1  # a later report supersedes
            for attempt in range(1, attempts + 1):
                try:
                    await asyncio.to_thread(self._write_progress, reconfiguration_id, progress)
                    return
                except Exception:
                    logger.exception(
                        "could not record reconfiguration %s as %s (attempt %d of %d)",
                        reconfiguration_id,
                        progress.status,
                        attempt,
                        attempts,
                    )
                    if attempt < attempts:
                        await asyncio.sleep(WRITE_RETRY_S)

        self.engine.launch(reservation, report)

    def _write_progress(self, reconfiguration_id: int, progress: Progress) -> None:
        with db.unit_of_work(self.sessions) as session:
            reconfigurations.record_progress(
                session=session, reconfiguration_id=reconfiguration_id, progress=progress
            )

    async def _mirror_states(self) -> None:
        while True:
            await asyncio.sleep(MIRROR_INTERVAL_S)
            await self._mirror_workers()
            states = self.engine.states()
            if states == self._mirrored:
                continue
            try:
                await asyncio.to_thread(self._write_states, states)
            except Exception:
                logger.exception("could not record job states; retrying")
                continue
            self._mirrored = states

    async def _mirror_workers(self) -> None:
        views = self.engine.workers_now()
        seen = tuple((v.id, v.status, v.error) for v in views)
        if seen == self._workers_mirrored:
            return
        try:
            await asyncio.to_thread(self._write_workers, views)
        except Exception:
            logger.exception("could not record the workers; retrying")
            return
        self._workers_mirrored = seen

    def _write_workers(self, views: list) -> None:
        with db.unit_of_work(self.sessions) as session:
            workers.mirror(session=session, instance=self.instance, views=views)

    def _write_states(self, states: Mapping[str, JobState]) -> None:
        with db.unit_of_work(self.sessions) as session:
            jobs.sync_states(session=session, states=states)


def _with_error(state: JobState, error: str) -> JobState:
    return replace(state, error=error)
