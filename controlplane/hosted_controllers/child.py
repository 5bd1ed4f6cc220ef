"""The controller's own process: ``python -m controlplane.hosted_controllers.child``.

The host starts one per running controller (with memory and CPU-time limits) and talks to
it in JSON lines: requests on stdin, replies on stdout. What the script prints, and what
it (or a built-in) logs at INFO or above (``logger.info(...)``, as ``name: message``), goes
to stderr, which the host keeps as the controller's log: a built-in says there why it
decided what it did. Requests and replies, in order:

1. ``{"type": "load", "source", "filename"}`` or ``{"type": "load", "builtin"}``, with
   ``"config"``: load the script (it must define exactly one ``controllers.Controller``
   subclass) and construct it -> ``{"type": "loaded", "class", "interval_s"}``. For an
   upload, the host sends it while the upload is being checked and keeps the process to
   run the controller: the script's import-time code runs once in each process.
2. ``{"type": "decide", "view": View.to_dict(), "first": bool}``: ``on_start(view)`` first
   when ``first``, then ``decide(view)`` -> ``{"type": "plan", "plan": Plan.to_dict() |
   null}``.
3. ``{"type": "result", "outcome": Outcome.to_dict()}``: ``on_result(outcome)`` ->
   ``{"type": "ok"}``.

Any request that fails gets ``{"type": "error", "error": "<what, with the script's line>"}``
and the process goes on; the host decides whether to go on with it. ``--check`` runs step 1
alone on a request read from stdin and prints its reply (a built-in's check at attach).
``--name NAME`` (the host's ``controller-<id>``) changes nothing: it shows in ``ps``
whose process it is.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import types
from typing import Any

__all__ = ["load_controller", "main"]

SCRIPT_MODULE = "streampilot_controller"
LOG_FORMAT = "%(name)s: %(message)s"  # a log line of the controller's; the host adds the time


class LoadError(Exception):
    """The script cannot be used as a controller; the message says why and where."""


def _where(exc: BaseException, filename: str) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    return f"{filename}, line {frames[-1].lineno}: " if frames else ""


def _describe(exc: BaseException, filename: str, doing: str) -> str:
    return f"{_where(exc, filename)}{doing} raised {type(exc).__name__}: {exc}"


def load_controller(msg: dict[str, Any]) -> Any:
    """The controller instance a ``load`` request describes (:class:`LoadError` if none)."""
    from controllers import BUILTINS, Controller

    config = msg.get("config")
    if msg.get("builtin") is not None:
        cls = BUILTINS.get(msg["builtin"])
        if cls is None:
            raise LoadError(
                f"no built-in controller {msg['builtin']!r}; built-ins: {', '.join(sorted(BUILTINS))}"
            )
        filename = f"<builtin {msg['builtin']}>"
    else:
        filename = str(msg.get("filename") or "controller.py")
        try:
            code = compile(str(msg["source"]), filename, "exec")
        except SyntaxError as exc:
            raise LoadError(f"{filename}, line {exc.lineno}: {exc.msg}") from None
        module = types.ModuleType(SCRIPT_MODULE)
        module.__file__ = filename
        sys.modules[SCRIPT_MODULE] = module  # dataclasses and pickling look it up
        try:
            exec(code, module.__dict__)
        except BaseException as exc:
            raise LoadError(_describe(exc, filename, "importing the script")) from None
        found = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, Controller)
            and obj is not Controller
            and obj.__module__ == SCRIPT_MODULE
        ]
        if len(found) != 1:
            names = ", ".join(sorted(c.__name__ for c in found)) or "none"
            raise LoadError(
                f"{filename}: define exactly one subclass of controllers.Controller "
                f"(found {len(found)}: {names})"
            )
        cls = found[0]
    try:
        return cls(config)
    except BaseException as exc:
        raise LoadError(_describe(exc, filename, f"{cls.__name__}(config)")) from None


class _Session:
    def __init__(self) -> None:
        self.controller: Any = None
        self.filename = "controller.py"

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        from controllers import Outcome, View

        kind = msg.get("type")
        if kind == "load":
            self.filename = str(msg.get("filename") or f"<builtin {msg.get('builtin')}>")
            self.controller = load_controller(msg)
            return {
                "type": "loaded",
                "class": type(self.controller).__name__,
                "interval_s": float(self.controller.interval_s),
            }
        if self.controller is None:
            return {"type": "error", "error": "no controller loaded"}
        if kind == "decide":
            view = View.from_dict(msg["view"])
            if msg.get("first"):
                self._call(self.controller.on_start, view, doing="on_start(view)")
            plan = self._call(self.controller.decide, view, doing="decide(view)")
            if plan is not None and not hasattr(plan, "to_dict"):
                return {
                    "type": "error",
                    "error": f"decide returned {type(plan).__name__}, expected a Plan or None",
                }
            return {"type": "plan", "plan": None if plan is None else plan.to_dict()}
        if kind == "result":
            outcome = Outcome.from_dict(msg["outcome"])
            self._call(self.controller.on_result, outcome, doing="on_result(outcome)")
            return {"type": "ok"}
        return {"type": "error", "error": f"unknown request {kind!r}"}

    def _call(self, fn: Any, arg: Any, *, doing: str) -> Any:
        try:
            return fn(arg)
        except Exception as exc:
            raise LoadError(_describe(exc, self.filename, doing)) from None


def _reply(out: Any, msg: dict[str, Any]) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The protocol owns the real stdout; the script's prints go to stderr (its log).
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout.reconfigure(line_buffering=True)  # each printed line reaches the log now
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=LOG_FORMAT)
    session = _Session()
    if argv[:1] == ["--check"]:
        filename = argv[1] if len(argv) > 1 else "controller.py"
        request = json.loads(sys.stdin.read())
        request.update(type="load", filename=filename)
        _reply(out, _safely(session, request))
        return 0
    for line in sys.stdin:
        if line.strip():
            _reply(out, _safely(session, json.loads(line)))
    return 0


def _safely(session: _Session, msg: dict[str, Any]) -> dict[str, Any]:
    try:
        return session.handle(msg)
    except LoadError as exc:
        return {"type": "error", "error": str(exc)}
    except Exception as exc:  # a view or outcome the SDK refused, a plan that won't serialize
        return {"type": "error", "error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    sys.exit(main())
