"""Keeps the database in step with the engine: the orchestration that spans jobs,
abstraction versions and reconfigurations.

- At start-up (:meth:`Tracker.recover`), before the engine runs: the workers of jobs
  recorded as not ended died with the previous process. A job that takes checkpoints and
  has a complete one in the store is marked ``recovering`` and, once the engine runs
  (:meth:`Tracker.start`), resumed from it on the new workers
  (:mod:`controlplane.coordinator.resume`); any other is marked failed, saying why.
  Reconfigurations not ended are marked failed, checkpoints not ended abandoned; workers
  of earlier runs still recorded alive are marked lost.
- While running: job states and the worker registry are mirrored every
  ``MIRROR_INTERVAL_S`` (reads refresh jobs too), each reconfiguration's progress is
  written as the engine reports it, with the new abstraction version when it completes,
  and so is each checkpoint's (in the order the coordinator reports them, by one writer).
- Events of fault tolerance (:func:`_checkpoint_event`, :func:`_recovering_event`): a job's
  first completed checkpoint (not the others: the ``checkpoints`` table lists them), an
  abandoned checkpoint unless the one before it was abandoned too (a job whose every
  checkpoint fails makes one event until one completes again), and ``job.recovering``
  with its cause as each recovery starts (the coordinator's ``on_recovering``), then
  ``job.recovered``.
- A source partition that its task reports it cannot read (``stalled`` in its metrics)
  makes a ``source.stalled`` event, and ``source.resumed`` once it reads again.
- Partitions a source found that no task reads (the coordinator's
  ``on_partitions_found``) are given out by a plan submitted like any other, with origin
  ``discovery`` (:mod:`controlplane.coordinator.discovery`).
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
import re
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import msgpack
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from controlplane import db
from controlplane.abstraction import PlanError, add_partitions
from controlplane.checkpoints import service as checkpoints
from controlplane.checkpoints.models import CheckpointRecord
from controlplane.coordinator import RunReport
from controlplane.coordinator.checkpoint_report import CheckpointReport
from controlplane.engine import Engine, JobState, Progress, Reservation, job_key
from controlplane.errors import ServiceError
from controlplane.events import service as events
from controlplane.jobs import service as jobs
from controlplane.jobs.models import TERMINAL_JOB_STATUSES, JobRecord
from controlplane.reconfigurations import service as reconfigurations
from controlplane.statuses import CheckpointStatus, JobStatus, WorkerStatus
from controlplane.versions import service as versions
from controlplane.workers import service as workers
from runtime.checkpoints.store import CheckpointStoreError, open_store

__all__ = ["MIRROR_INTERVAL_S", "Tracker"]

logger = logging.getLogger(__name__)

MIRROR_INTERVAL_S = 0.5  # a job's status change reaches the database within this
WRITE_ATTEMPTS = 5  # a reconfiguration's final state is written despite brief database trouble
WRITE_RETRY_S = 1.0  # pause between attempts

RESTARTED = "the control plane restarted; the job's workers are gone"
INTERRUPTED_BY_RESTART = "interrupted: the control plane restarted"
DISCOVERY = "discovery"  # the origin of the plans that give out partitions a source found
INTERRUPTED_BY_SHUTDOWN = "interrupted: the control plane shut down"
STOPPED_BY_SHUTDOWN = "stopped: the control plane shut down"
_CHECKPOINT_DIR = re.compile(r"[^/]+/chk-(\d+)/")
_MANIFEST = re.compile(r"[^/]+/chk-(\d+)/_manifest\.msgpack$")
WORKER_OF_EARLIER_RUN = "the control plane restarted; its workers exited with it"
TIMED = "checkpoint"  # the kind of report that makes checkpoint events (not savepoints)


class Tracker:
    def __init__(self, engine: Engine, sessions: sessionmaker[Session]) -> None:
        self.engine = engine
        self.sessions = sessions
        self._mirror: asyncio.Task[None] | None = None
        self._mirrored: dict[str, JobState] = {}
        self._workers_mirrored: tuple = ()
        self.instance = uuid.uuid4().hex  # names this run's workers in the database
        # Checkpoint reports and recoveries to write, in order: (job id, a report's fields,
        # a discarded checkpoint's id, a recovery begun or a recovery made).
        self._checkpoints: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._adding_partitions: set[str] = set()  # jobs whose found partitions are submitted
        self._stalled: set[tuple[str, str, str]] = set()  # (job, source, partition) stalled
        self._checkpoint_writer: asyncio.Task[None] | None = None
        # Jobs of an earlier run to resume: job id -> (its newest manifest, the
        # checkpoints whose directories are in the store).
        self._to_resume: dict[int, tuple[str, set[int]]] = {}
        self._resumer: asyncio.Task[None] | None = None

    def recover(self) -> None:
        """Sort out what the previous process left unfinished (call before start): jobs to
        resume, jobs failed, reconfigurations failed, checkpoints abandoned."""
        with db.unit_of_work(self.sessions) as session:
            n_failed = 0
            for job in session.scalars(
                select(JobRecord).where(JobRecord.status.not_in(TERMINAL_JOB_STATUSES))
            ):
                found = self._last_checkpoint(job)
                if isinstance(found, str):
                    jobs.mark_unreachable(job, found)
                    n_failed += 1
                else:
                    job.status, job.error = JobStatus.RECOVERING, None
                    self._to_resume[job.id] = found
                    _recovering_event(session, job, RESTARTED)
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
        if n_failed or n_recs or self._to_resume:
            logger.warning(
                "a previous run left %d job(s) to resume, %d failed, %d reconfiguration(s) failed",
                len(self._to_resume),
                n_failed,
                n_recs,
            )

    def _last_checkpoint(self, job: JobRecord) -> tuple[str, set[int]] | str:
        """Where the last complete checkpoint of ``job`` is in the store (the newest
        manifest: a manifest is written last, so its presence makes a checkpoint
        complete, whatever the database heard) and which checkpoints' directories are
        there; or why the job cannot resume."""
        policy, _restart = jobs.policies_of(job, self.engine.settings)
        if policy is None:
            return f"{RESTARTED} (it took no checkpoints to resume from)"
        try:
            store = open_store(self.engine.settings.checkpoint_location())
            paths = store.list(job_key(job.id))
        except CheckpointStoreError as exc:
            return f"{RESTARTED} (its checkpoints cannot be read: {exc})"
        present = {int(m.group(1)) for p in paths if (m := _CHECKPOINT_DIR.match(p))}
        manifests = sorted((int(m.group(1)), p) for p in paths if (m := _MANIFEST.match(p)))
        if not manifests:
            return f"{RESTARTED} (it had no complete checkpoint to resume from)"
        return manifests[-1][1], present

    async def start(self) -> None:
        """Record the workers started with the engine, then mirror job states and workers
        (on the engine's loop)."""
        await self._mirror_workers()
        self._mirror = asyncio.create_task(self._mirror_states(), name="mirror-job-states")
        self._checkpoint_writer = asyncio.create_task(
            self._write_checkpoints(), name="write-checkpoints"
        )
        self.engine.coordinator.on_checkpoint = self._checkpoint_reported
        self.engine.coordinator.on_recovering = self._recovering
        self.engine.coordinator.on_recovery = self._recovered
        self.engine.coordinator.on_partitions_found = self._partitions_found
        if self._to_resume:
            self._resumer = asyncio.create_task(self._resume_all(), name="resume-jobs")

    async def stop(self) -> None:
        self.engine.coordinator.on_checkpoint = None
        self.engine.coordinator.on_recovering = None
        self.engine.coordinator.on_recovery = None
        self.engine.coordinator.on_partitions_found = None
        for task in (self._resumer, self._mirror, self._checkpoint_writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _resume_all(self) -> None:
        for job_id, (manifest, present) in sorted(self._to_resume.items()):
            try:
                await self._resume(job_id, manifest, present)
            except Exception as exc:
                logger.warning("job %s could not resume: %s", job_id, exc, exc_info=True)
                why = f"{RESTARTED}; resuming from its checkpoint failed: {exc}"
                await asyncio.to_thread(self._write_unreachable, job_id, why)
        self._to_resume.clear()

    async def _resume(self, job_id: int, path: str, present: set[int]) -> None:
        settings = self.engine.settings

        def load() -> tuple[Any, ...]:
            with db.unit_of_work(self.sessions) as session:
                job = jobs.get_row(session=session, job_id=job_id)
                policy, restart = jobs.policies_of(job, settings)
                graph = jobs.rebuild_graph(settings=settings, job=job)
                store = open_store(settings.checkpoint_location())
                manifest = msgpack.unpackb(store.get(path), strict_map_key=False)
                at = versions.get_version(
                    session=session, job_id=job_id, version=int(manifest["version"])
                ).document
                return graph, manifest, at, int(job.version or 1), policy, restart

        graph, manifest, at, latest, policy, restart = await asyncio.to_thread(load)
        state = await self.engine.resume(
            graph,
            job_key(job_id),
            manifest=manifest,
            at_checkpoint=at,
            latest_version=latest,
            checkpoints=policy,
            restart=restart,
            present=present,
        )
        logger.warning(
            "job %s resumed from checkpoint %s: %s", job_id, manifest["checkpoint_id"], state.status
        )

    def _write_unreachable(self, job_id: int, why: str) -> None:
        with db.unit_of_work(self.sessions) as session:
            jobs.mark_unreachable(jobs.get_row(session=session, job_id=job_id), why)

    def _partitions_found(self, job_id: str, operator: str, names: tuple[str, ...]) -> None:
        # Called by the coordinator, on the loop: the plan is submitted off it, once at a
        # time per job (the source reports them again until a change gives them out).
        if job_id in self._adding_partitions:
            return
        self._adding_partitions.add(job_id)
        work = asyncio.ensure_future(
            asyncio.to_thread(self._request_partitions, job_id, operator, names)
        )
        work.add_done_callback(lambda _w: self._adding_partitions.discard(job_id))

    def _request_partitions(self, job_id: str, operator: str, names: tuple[str, ...]) -> None:
        """Submit the plan giving ``names`` out, recorded with origin ``discovery`` (see
        :mod:`controlplane.coordinator.discovery`)."""
        try:
            with db.unit_of_work(self.sessions) as session:
                reconfigurations.request_reconfiguration(
                    session=session,
                    engine=self.engine,
                    launch=self.launch,
                    job_id=int(job_id),
                    origin=DISCOVERY,
                    build=lambda view: add_partitions(view.abstraction, operator, names),
                    may_start_workers=False,
                )
        except (ServiceError, PlanError) as exc:  # busy, or given out meanwhile: next time
            logger.info("job %s: partitions %s not added yet: %s", job_id, names, exc)

    def _recovering(self, job_id: str, cause: str) -> None:
        # Called by the coordinator, on the loop, as a recovery starts: only queue.
        self._checkpoints.put_nowait((job_id, ("recovering", cause)))

    def _recovered(self, job_id: str, report: RunReport, document: dict[str, Any]) -> None:
        # Called by the coordinator, on the loop, once the job runs again: only queue.
        self._checkpoints.put_nowait(
            (job_id, ("recovery", report.reported(), report.plan, document))
        )

    def _saw_stalls(self) -> None:
        """Queue ``source.stalled`` for each partition that a source task now reports it
        cannot read (with why), and ``source.resumed`` once it reads again (on the loop:
        the coordinator's metrics are read where they are kept)."""
        for job_id, job in list(self.engine.coordinator.jobs.items()):
            if job.done:
                continue
            latest: dict[tuple[str, str], str | None] = {}
            for _t, task, snap in list(job.metrics.samples):  # oldest first: the last wins
                for partition, health in (snap.get("partitions") or {}).items():
                    latest[(task.rpartition("-")[0], str(partition))] = health.get("stalled")
            for (operator, partition), why in latest.items():
                key = (job_id, operator, partition)
                if bool(why) == (key in self._stalled):
                    continue
                if why:
                    self._stalled.add(key)
                else:
                    self._stalled.discard(key)
                self._checkpoints.put_nowait((job_id, ("stall", operator, partition, why)))

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
            match what:
                case ("recovering", cause):  # in order with the checkpoints and recoveries
                    _recovering_event(
                        session, jobs.get_row(session=session, job_id=int(job_id)), cause
                    )
                case ("recovery", reported, plan, document):
                    reconfigurations.record_recovery(
                        session=session,
                        job_id=int(job_id),
                        reported=reported,
                        plan=plan,
                        base_version=int(document["job"]["version"]) - 1,
                        document=document,
                    )
                case ("stall", operator, partition, why):
                    _stall_event(session, int(job_id), operator, partition, why)
                case int():
                    checkpoints.discard(session=session, job_db_id=int(job_id), checkpoint_id=what)
                case _:
                    before = _status_of(session, int(job_id), int(what["checkpoint_id"]))
                    rec = checkpoints.record(session=session, job_db_id=int(job_id), reported=what)
                    if rec.status != before and what.get("kind", TIMED) == TIMED:
                        _checkpoint_event(session, rec)

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
            self._saw_stalls()
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


def _recovering_event(session: Session, job: JobRecord, cause: str | None) -> None:
    """Record that ``job`` went ``recovering`` after the failure ``cause``."""
    why = f": {cause}" if cause else ""
    events.record(
        session=session,
        kind="job.recovering",
        job_id=job.id,
        message=f"job {job.id} ({job.name}) recovering{why}",
        data={"cause": cause},
    )


def _stall_event(
    session: Session, job_id: int, operator: str, partition: str, why: str | None
) -> None:
    """Record that partition ``partition`` of source ``operator`` cannot be read now
    (``why``), or (None) that it reads again."""
    where = f"job {job_id}: partition {partition!r} of source {operator!r}"
    events.record(
        session=session,
        kind="source.stalled" if why else "source.resumed",
        job_id=job_id,
        message=f"{where} cannot be read: {why}" if why else f"{where} is read again",
        data={"operator": operator, "partition": partition, "stalled": why},
    )


def _status_of(session: Session, job_id: int, checkpoint_id: int) -> str | None:
    """The recorded status of a checkpoint (None: not recorded yet)."""
    return session.scalar(
        select(CheckpointRecord.status).where(
            CheckpointRecord.job_id == job_id, CheckpointRecord.checkpoint_id == checkpoint_id
        )
    )


def _checkpoint_event(session: Session, rec: CheckpointRecord) -> None:
    """The event of checkpoint ``rec`` just recorded in a new status, if it makes one (see
    the module docstring): ``checkpoint.first_completed`` for the job's first completed
    checkpoint, ``checkpoint.abandoned`` for one abandoned after one that was not."""
    cid, job_id = rec.checkpoint_id, rec.job_id
    data = {"checkpoint_id": cid, "version": rec.version}
    if rec.status == CheckpointStatus.COMPLETED:
        done = (CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED)
        if checkpoints.count(session=session, job_id=job_id, statuses=done) > 1:
            return
        took = f" in {rec.duration_ms:.0f} ms" if rec.duration_ms is not None else ""
        events.record(
            session=session,
            kind="checkpoint.first_completed",
            job_id=job_id,
            message=f"job {job_id} completed its first checkpoint, {cid} (version "
            f"{rec.version}, {rec.full_bytes} bytes to restore){took}; "
            f"GET /jobs/{job_id}/checkpoints lists the later ones",
            data={
                **data,
                "bytes": rec.bytes,
                "full_bytes": rec.full_bytes,
                "duration_ms": rec.duration_ms,
            },
        )
    elif rec.status == CheckpointStatus.ABANDONED:
        newest, _total = checkpoints.list_for_job(session=session, job_id=job_id, limit=2, offset=0)
        previous = [c.status for c in newest if c.checkpoint_id < cid]
        if previous == [CheckpointStatus.ABANDONED]:  # told with the first of the run
            return
        events.record(
            session=session,
            kind="checkpoint.abandoned",
            job_id=job_id,
            message=f"checkpoint {cid} of job {job_id} abandoned: {rec.error} (those "
            f"abandoned right after it are not told: GET /jobs/{job_id}/checkpoints lists them)",
            data={**data, "error": rec.error},
        )
