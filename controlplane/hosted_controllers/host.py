"""The controller host: runs each ``running`` controller in its own subprocess.

One :class:`_Runner` (an asyncio task on the server's loop) per running controller; its
child is ``python -m controlplane.hosted_controllers.child`` in a bubblewrap sandbox
(:mod:`controlplane.sandbox`; see :mod:`.process`), killed with the host. Where
bubblewrap is missing, built-in controllers run unconfined (with the same limits) and
uploaded ones are marked ``failed`` with the reason, never run.

An uploaded script is checked by the process that will run it, so that its import-time
code runs once per process serving the controller and never in a throwaway one:

1. While the upload's unit of work is open (the controller's row flushed, not committed),
   :meth:`ControllerHost.load` starts the controller's child and loads the script in it;
   a script that does not load is refused with the reason and line, and its process is
   killed.
2. The loaded process is kept (its output buffered) until the unit of work ends: once it
   commits, :meth:`ControllerHost.wake` hands it to the controller's runner, which
   decides with it (its buffered output goes to the controller's log); if it rolls back,
   :meth:`ControllerHost.discard` kills it.

A new process (after a crash or a hang, a stop and a start, or a restart of the server)
imports the script again: each process that serves the controller imports it once.
Built-ins are checked at attach as before (:func:`.service.check_script`) and their
runner starts their process. Each period, in order:

1. Build the view (the job's current abstraction, its metrics window, the workers, the
   outcomes of this controller's earlier plans). A job that has ended stops its
   controllers (status ``stopped``, with the reason).
2. Send it to the child; ``decide`` must answer within ``settings.controller_timeout_s``.
3. Check the answer: a plan (JSON) against the view's version, or nothing.
4. Apply the safety limits (:func:`controllers.check_safety`): a refusal is recorded,
   a dry run is recorded, else the plan goes through the same validation as REST
   (:func:`controlplane.reconfigurations.service.request_reconfiguration`, on this
   controller's job only) and is carried out.
5. Wait for the reconfiguration to end, record the outcome, and hand it to the child's
   ``on_result``.

A controller that raises, hangs (its child is killed and restarted), dies, returns garbage
or a plan validation refuses has a failure recorded with the reason, and never touches the
job; ``settings.controller_max_failures`` failures in a row mark it ``failed`` and stop
it. Nothing a child does can raise out of its runner: the server never crashes with it;
an error of the runner itself marks the controller ``failed`` with that error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from controllers import (
    DecisionError,
    SafetyConfig,
    View,
    check_safety,
    decision_of,
    preview,
    state_sizes,
)
from controlplane import db, sandbox
from controlplane.abstraction import AbstractionError, Plan, PlanError
from controlplane.config import Settings
from controlplane.engine import Engine, job_key
from controlplane.errors import BadController, Conflict, PlanRefused, ServiceError
from controlplane.jobs import service as jobs
from controlplane.jobs.models import TERMINAL_JOB_STATUSES
from controlplane.metrics import service as metrics
from controlplane.reconfigurations import service as reconfigurations
from controlplane.statuses import ControllerStatus, DecisionStatus
from controlplane.tracking import Tracker
from controlplane.versions import service as versions

from . import service
from .process import STOP_GRACE_S, ChildExited, ChildFailed, ChildHung, ControllerProcess

__all__ = ["ControllerHost"]

logger = logging.getLogger(__name__)

SPAWN_TIMEOUT_S = 30.0  # a child loads its script (imports, constructor) within this
LOAD_WAIT_S = SPAWN_TIMEOUT_S + 3 * STOP_GRACE_S  # an upload waits for a load, then for
# the killing of a child that hung or died (its exit, then the end of its output)
MAX_LOAD_OUTPUT = 500  # characters of a dead child's output an upload's refusal quotes
OUTCOME_TIMEOUT_S = 150.0  # a reconfiguration ends within this (prepare + sync + update)
OUTCOME_POLL_S = 0.2  # how often the outcome of a submitted plan is looked up
MIN_WINDOW_S = 2.0  # a view's window: its period (two per-second reports at least), so
# the windows of consecutive views do not overlap and one spike is seen once
MAX_WINDOW_S = 300.0  # and at most what the coordinator keeps
LOG_FLUSH_S = 1.0  # a child's output is written to the database this often


@dataclass
class _Loaded:
    """A process that has loaded an uploaded script, waiting for its controller's commit."""

    child: ControllerProcess
    lines: list[str]  # what it printed meanwhile


class ControllerHost:
    """Starts, stops and supervises controller runners (see the module docstring).

    :meth:`start` and :meth:`close` run on the server's event loop; :meth:`wake` and
    :meth:`discard` may be called from any thread (request handlers, after their unit of
    work ended), :meth:`load` from any thread but the loop's."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        tracker: Tracker,
        sessions: sessionmaker[Session],
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.tracker = tracker
        self.sessions = sessions
        self.runners: dict[int, _Runner] = {}
        self.retired: set[_Runner] = set()  # replaced runners still winding down
        self.loaded: dict[int, _Loaded] = {}  # by controller id: loaded, not yet committed
        self.discarded: set[asyncio.Task[None]] = set()  # their kills, under way
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Start the controllers recorded ``running`` (their jobs permitting)."""
        self.loop = asyncio.get_running_loop()
        ids = await asyncio.to_thread(self._call, service.running_ids)
        for cid in ids:
            self._ensure(cid)

    async def close(self) -> None:
        """Stop every runner and wait until their processes, and those loaded for uploads
        not yet committed, have exited."""
        runners, self.runners = [*self.runners.values(), *self.retired], {}
        for r in runners:
            r.task.cancel()
        for cid in list(self.loaded):
            self._discard(cid)
        await asyncio.gather(
            *(r.finished() for r in runners), *self.discarded, return_exceptions=True
        )

    def wake(self, controller_id: int) -> None:
        """Start or stop the runner of a controller to match its recorded status; the
        process :meth:`load` kept for it, if any, becomes its runner's."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._ensure, controller_id)

    def load(self, controller_id: int, request: dict[str, Any]) -> dict[str, Any]:
        """Step 1 of an upload (module docstring): start controller ``controller_id``'s
        process in the sandbox and load the script of ``request`` (``source``,
        ``filename``, ``config``) in it. Returns its ``loaded`` reply (``class``,
        ``interval_s``) and keeps the process for :meth:`wake` or :meth:`discard`; a
        script that does not load is a :class:`BadController` with the reason and line,
        and leaves no process. Blocks the calling thread (never the loop's) for at most
        :data:`LOAD_WAIT_S`."""
        if self.loop is None:
            raise RuntimeError("the controller host has not started")
        future = asyncio.run_coroutine_threadsafe(self._load(controller_id, request), self.loop)
        try:
            return future.result(LOAD_WAIT_S)
        except TimeoutError:  # _load is bounded more tightly: a loop too busy to run it
            future.cancel()  # its process is killed
            raise BadController(
                f"{request.get('filename')}: loading the controller did not finish within "
                f"{LOAD_WAIT_S:.0f}s"
            ) from None

    def discard(self, controller_id: int) -> None:
        """Step 2 of an upload that rolled back: kill the process :meth:`load` kept."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._discard, controller_id)

    async def _load(self, controller_id: int, request: dict[str, Any]) -> dict[str, Any]:
        doing = f"{request.get('filename')}: loading the controller"
        lines: list[str] = []
        child = await ControllerProcess.spawn(
            self.settings, lines.append, name=f"controller-{controller_id}"
        )
        self.loaded[controller_id] = _Loaded(child, lines)  # close() kills it from now on
        try:
            return await child.call({**request, "type": "load"}, SPAWN_TIMEOUT_S, doing)
        except BaseException as exc:
            self.loaded.pop(controller_id, None)
            await child.kill()  # its output has all been read when this returns
            if isinstance(exc, ChildFailed):
                raise _refusal(exc, doing, lines) from None
            raise

    def _discard(self, controller_id: int) -> None:
        loaded = self.loaded.pop(controller_id, None)
        if loaded is not None:
            task = asyncio.create_task(loaded.child.kill())
            self.discarded.add(task)
            task.add_done_callback(self.discarded.discard)

    def _ensure(self, controller_id: int) -> None:
        runner = self.runners.get(controller_id)
        if runner is not None and not runner.task.done():
            runner.task.cancel()  # it re-reads its row: restart with the latest status
            self.retired.add(runner)
            runner.task.add_done_callback(lambda _t, r=runner: self.retired.discard(r))
        loaded = self.loaded.pop(controller_id, None)
        self.runners[controller_id] = _Runner(self, controller_id, loaded)

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        with db.unit_of_work(self.sessions) as session:
            return fn(session=session, **kwargs)


def _refusal(exc: ChildFailed, doing: str, lines: list[str]) -> BadController:
    """Why an upload is refused, as the upload check has always said it."""
    if isinstance(exc, ChildHung):
        return BadController(
            f"{doing} did not finish within {SPAWN_TIMEOUT_S:.0f}s; move long-running work "
            "out of module level"
        )
    if isinstance(exc, ChildExited):
        detail = "\n".join(lines).strip()[-MAX_LOAD_OUTPUT:]
        return BadController(
            f"{doing}: the interpreter exited with code {exc.code} without an answer"
            f"{': ' + detail if detail else ''}; code must not exit or crash at import"
        )
    return BadController(str(exc))


class _Runner:
    """Drives one controller: the numbered steps of the module docstring, forever; with
    the process an upload loaded (``loaded``), or else one it starts."""

    def __init__(
        self, host: ControllerHost, controller_id: int, loaded: _Loaded | None = None
    ) -> None:
        self.host = host
        self.id = controller_id
        self.settings = host.settings
        self.child: ControllerProcess | None = None
        self.logs: list[tuple[str, str]] = []
        if loaded is not None:
            self.child = loaded.child
            self.logs += [("script", line) for line in loaded.lines]
            self.child.on_line = self._on_line
        self.task = asyncio.create_task(self._main(), name=f"controller-{controller_id}")
        self._flusher = asyncio.create_task(self._flush_logs())

    async def finished(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    # -- the loop -------------------------------------------------------------------------

    async def _main(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug of the host itself: report it, never crash the server
            logger.exception("controller %s: host error", self.id)
            await self._give_up(f"its host failed: {type(exc).__name__}: {exc}")
        finally:
            if self.child is not None:
                await self.child.close()
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._flusher
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._write_logs)

    async def _loop(self) -> None:
        row = await self._db(service.get_controller, controller_id=self.id)
        # A plan submitted before a stop or a restart may have ended since: record how.
        await self._db(service.settle_pending, controller_id=self.id)
        if row.status != ControllerStatus.RUNNING:
            return
        spec = {
            "type": "load",
            "config": row.config,
            **(
                {"builtin": row.builtin}
                if row.builtin
                else {"source": row.source, "filename": row.filename}
            ),
        }
        missing = await asyncio.to_thread(sandbox.unavailable, self.settings)
        if missing is not None and not row.builtin:
            await self._give_up(f"uploaded controllers run only in a sandbox: {missing}")
            return
        interval, first = float(row.interval_s), True
        while True:
            try:
                if self.child is None:
                    self.child = await self._spawn(unconfined=missing is not None)
                    loaded = await self.child.call(spec, SPAWN_TIMEOUT_S, "loading the controller")
                    interval = float(loaded["interval_s"])
                    first = True
                await asyncio.sleep(interval)
                if not await self._period(first):
                    return
                first = False
            except ChildFailed as exc:
                if not await self._failed(str(exc), restart=exc.restart):
                    return

    async def _spawn(self, *, unconfined: bool) -> ControllerProcess:
        try:
            return await ControllerProcess.spawn(
                self.settings, self._on_line, name=f"controller-{self.id}", unconfined=unconfined
            )
        except OSError as exc:
            raise ChildFailed(f"its process could not start: {exc}", restart=True) from None

    async def _period(self, first: bool) -> bool:
        """One period (steps 1 to 5); False when the controller must stop."""
        assert self.child is not None
        # Step 1. The view (unless the controller was stopped or failed meanwhile).
        built = await self._db(self._build_view)
        if built is None:
            return False
        if isinstance(built, str):
            await self._db(
                service.set_status,
                controller_id=self.id,
                status=ControllerStatus.STOPPED,
                error=built,
            )
            self._host_log(f"stopped: {built}")
            return False
        view_doc, view = built
        # Step 2. Decide.
        reply = await self.child.call(
            {"type": "decide", "view": view_doc, "first": first},
            self.settings.controller_timeout_s,
            "decide(view)",
        )
        # Step 3. A plan, or nothing.
        plan = self._plan_of(reply, view)
        if plan is None:
            await self._db(service.note_decided, controller_id=self.id, with_plan=False)
            await self._db(service.note_success, controller_id=self.id)
            return True
        await self._db(service.note_decided, controller_id=self.id, with_plan=True)
        # Step 4. Safety, then validation.
        outcome = await self._submit(plan, view, view_doc)
        # Step 5. Outcome.
        await self.child.call(
            {"type": "result", "outcome": outcome},
            self.settings.controller_timeout_s,
            "on_result(outcome)",
        )
        return True

    def _plan_of(self, reply: dict[str, Any], view: Any) -> Any:
        """The plan in ``decide``'s reply, checked as the SDK checks it
        (:func:`controllers.decision_of`); None for no decision."""
        if reply.get("type") != "plan":
            raise ChildFailed(f"decide: unexpected reply {str(reply)[:200]}", restart=True)
        if reply.get("plan") is None:
            return None
        try:
            return decision_of(Plan.from_dict(reply["plan"]), view)
        except AbstractionError as exc:
            raise ChildFailed(f"decide returned an unreadable plan: {exc}", restart=False) from None
        except DecisionError as exc:
            raise ChildFailed(str(exc), restart=False) from None

    async def _submit(self, plan: Any, view: Any, view_doc: dict[str, Any]) -> dict[str, Any]:
        row = await self._db(service.get_controller, controller_id=self.id)
        record = {"controller_id": self.id, "view": _summary(view), "plan": plan.to_dict()}
        try:
            preview(view.abstraction, plan)
        except PlanError as exc:  # the controller's fault: count it
            decision = await self._db(
                service.record_decision,
                **record,
                status=DecisionStatus.REFUSED,
                moves=0,
                error=str(exc),
            )
            await self._failed(f"plan refused by validation: {exc}", restart=False)
            return service.outcome_of(decision)
        verdict = check_safety(
            plan,
            view.abstraction,
            SafetyConfig.from_dict(row.safety),
            view.history,
            now=view.now,
            sizes=state_sizes(view),
        )
        if verdict.action == "refuse":
            self._host_log(f"plan refused by the safety limits: {verdict.reason}")
            decision = await self._db(
                service.record_decision,
                **record,
                status=DecisionStatus.REFUSED,
                moves=verdict.moves,
                error=verdict.reason,
            )
            return service.outcome_of(decision)
        if verdict.action == "dry_run":
            self._host_log(f"dry run: plan with {len(plan.ops)} operations recorded, not applied")
            decision = await self._db(
                service.record_decision,
                **record,
                status=DecisionStatus.DRY_RUN,
                moves=verdict.moves,
            )
            return service.outcome_of(decision)
        try:
            decision = await asyncio.to_thread(self._request, plan, record, verdict.moves)
        except ServiceError as exc:
            decision = await self._db(
                service.record_decision,
                **record,
                status=DecisionStatus.REFUSED,
                moves=verdict.moves,
                error=exc.message,
            )
            self._host_log(f"plan refused: {exc.message}")
            if isinstance(exc, PlanRefused):  # the controller's fault: count it
                await self._failed(f"plan refused by validation: {exc.message}", restart=False)
            elif not isinstance(exc, Conflict):
                raise
            return service.outcome_of(decision)
        self._host_log(f"plan applied as reconfiguration {decision.reconfiguration_id}")
        deadline = time.monotonic() + OUTCOME_TIMEOUT_S
        while time.monotonic() < deadline:
            settled = await self._db(service.settle_decision, decision_id=decision.id)
            if settled is not None:
                await self._db(service.note_success, controller_id=self.id)
                return service.outcome_of(settled)
            await asyncio.sleep(OUTCOME_POLL_S)
        raise ChildFailed(
            f"reconfiguration {decision.reconfiguration_id} did not end within "
            f"{OUTCOME_TIMEOUT_S:g}s",
            restart=False,
        )

    def _request(self, plan: Any, record: dict[str, Any], moves: int) -> Any:
        """Submit ``plan`` for this controller's job, as REST does, and record the decision
        in the same unit of work."""
        with db.unit_of_work(self.host.sessions) as session:
            row = service.get_controller(session=session, controller_id=self.id)
            rec = reconfigurations.request_reconfiguration(
                session=session,
                engine=self.host.engine,
                launch=self.host.tracker.launch,
                job_id=row.job_id,
                origin=f"controller {self.id}",
                build=lambda _view: plan,
                may_start_workers=True,  # attaching a controller takes an admin token
            )
            return service.record_decision(
                session=session,
                **record,
                status=DecisionStatus.PENDING,
                moves=moves,
                reconfiguration_id=rec.id,
            )

    def _build_view(self, *, session: Session) -> tuple[dict[str, Any], Any] | str | None:
        """(view JSON, View); or why the controller must stop; or None if it is no longer
        ``running`` (stopped, or failed by its last plan)."""
        row = service.get_controller(session=session, controller_id=self.id)
        if row.status != ControllerStatus.RUNNING:
            return None
        job = jobs.get_job(session=session, engine=self.host.engine, job_id=row.job_id)
        if job.status in TERMINAL_JOB_STATUSES:
            return f"job {job.id} is {job.status}"
        document = versions.get_version(session=session, job_id=job.id).document
        window = min(max(float(row.interval_s), MIN_WINDOW_S), MAX_WINDOW_S)
        try:
            window_doc: dict[str, Any] | None = metrics.job_metrics(
                session=session, engine=self.host.engine, job_id=job.id, window_s=window
            ).model_dump(mode="json")
        except ServiceError:
            window_doc = None
        view_doc = {
            "job_id": job_key(job.id),
            "now": time.time(),
            "abstraction": document,
            "metrics": window_doc,
            "history": service.history(session=session, controller_id=self.id),
        }
        return view_doc, View.from_dict(view_doc)

    # -- failures and logs --------------------------------------------------------------------

    async def _failed(self, reason: str, *, restart: bool) -> bool:
        """Record a failure; False when the controller is now failed (stop running it)."""
        self._host_log(f"failure: {reason}")
        if restart and self.child is not None:
            await self.child.kill()
            self.child = None
        row = await self._db(
            service.note_failure,
            controller_id=self.id,
            reason=reason,
            max_failures=self.settings.controller_max_failures,
            restarted=restart,
        )
        if row.status != ControllerStatus.RUNNING:
            self._host_log(f"marked {row.status}: {row.error}")
            return False
        return True

    async def _give_up(self, reason: str) -> None:
        """Mark the controller ``failed`` with ``reason`` (if it is still running)."""
        self._host_log(f"failed: {reason}")
        with contextlib.suppress(Exception):
            await self._db(service.fail, controller_id=self.id, reason=reason)

    def _on_line(self, line: str) -> None:
        self.logs.append(("script", line))

    def _host_log(self, message: str) -> None:
        logger.info("controller %s: %s", self.id, message)
        self.logs.append(("host", message))

    async def _flush_logs(self) -> None:
        while True:
            await asyncio.sleep(LOG_FLUSH_S)
            try:
                await asyncio.to_thread(self._write_logs)
            except Exception:
                logger.exception("controller %s: could not write its log", self.id)

    def _write_logs(self) -> None:
        lines, self.logs = self.logs, []
        if lines:
            with db.unit_of_work(self.host.sessions) as session:
                service.add_logs(session=session, controller_id=self.id, lines=lines)

    async def _db(self, fn: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.host._call, fn, **kwargs)


def _summary(view: Any) -> dict[str, Any]:
    """What a decision records of the view it was made on."""
    m = view.metrics
    summary: dict[str, Any] = {"version": view.abstraction.version, "time": view.now}
    if m is not None:
        summary["latency_p99_ms"] = m.latency.p99_ms
        summary["operators"] = {
            o.operator: {"in_per_s": o.in_per_s, "busy": o.busy} for o in m.operators
        }
    return summary
