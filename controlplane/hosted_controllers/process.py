"""A controller's process, seen from the host: started in a sandbox, spoken to in JSON lines.

:meth:`ControllerProcess.spawn` starts ``python -m controlplane.hosted_controllers.child`` in a
bubblewrap sandbox (:mod:`controlplane.sandbox`: no network, no other process, a
read-only filesystem without the database, ``settings.controller_*`` limits), or, for a
built-in controller where bubblewrap is missing, unconfined with the same limits
(``unconfined=True``; our code, not the user's). Either way it has a session of its
own, so :meth:`ControllerProcess.kill` kills its process group: in a sandbox that is
bwrap's monitor, whose death takes every process of the sandbox with it.
:meth:`ControllerProcess.call` sends one request and waits for the reply (see
:mod:`.child` for the protocol); every way it can go wrong is a :class:`ChildFailed`
saying what happened and whether the process must be restarted (:class:`ChildHung` when
it did not answer in time, :class:`ChildExited` when it ended without answering). Its
stderr (what the script prints, and what bwrap says if the sandbox cannot start) goes to
``on_line``, which its owner may replace (a process loaded at upload is handed over to
the controller's runner with its output).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from typing import Any

from controlplane import sandbox
from controlplane.config import Settings

__all__ = ["ChildExited", "ChildFailed", "ChildHung", "ControllerProcess"]

logger = logging.getLogger(__name__)

STOP_GRACE_S = 3.0  # a child exits once its input closes (or on a kill) within this
CHILD_MODULE = "controlplane.hosted_controllers.child"


class ChildFailed(Exception):
    """The child died, hung or answered with an error; the message says which."""

    def __init__(self, message: str, *, restart: bool) -> None:
        super().__init__(message)
        self.restart = restart


class ChildHung(ChildFailed):
    """The child did not answer within the timeout; it has been killed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, restart=True)


class ChildExited(ChildFailed):
    """The child's process ended (exit status ``code``, None if unknown) without answering."""

    def __init__(self, message: str, *, code: int | None) -> None:
        super().__init__(message, restart=True)
        self.code = code


class ControllerProcess:
    """A controller's process and its JSON-lines protocol (see :mod:`.child`)."""

    def __init__(self, proc: asyncio.subprocess.Process, on_line: Any) -> None:
        self.proc = proc
        self.on_line = on_line  # called with each line it prints on stderr
        self.last_line = ""  # the last line it printed on stderr: bwrap's, if it failed
        self._pump = asyncio.create_task(self._read_stderr())

    @classmethod
    async def spawn(
        cls, settings: Settings, on_line: Any, *, name: str, unconfined: bool = False
    ) -> ControllerProcess:
        """Start the child; ``name`` (e.g. ``controller-7``) is on its command line, for
        ``ps``. ``unconfined`` only for built-ins, where :func:`sandbox.unavailable`."""
        make = sandbox.unconfined if unconfined else sandbox.command
        command = make(settings, CHILD_MODULE, ["--name", name])
        proc = await asyncio.create_subprocess_exec(
            *command.argv,
            env=command.env,  # none of the control plane's secrets
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=64 * 1024 * 1024,  # a reply carries a plan: allow long lines
        )
        return cls(proc, on_line)

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.last_line = line.decode("utf-8", "replace").rstrip()
            self.on_line(self.last_line)

    async def call(self, request: dict[str, Any], timeout: float, doing: str) -> dict[str, Any]:
        """Send one request and return the reply; :class:`ChildExited` if the child dies,
        :class:`ChildHung` if it hangs past ``timeout`` (it is then killed), and
        :class:`ChildFailed` if it answers with an error or garbage."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            await self.kill()
            raise ChildHung(
                f"{doing} did not return within {timeout:g}s; the process was killed"
            ) from None
        except (ConnectionError, BrokenPipeError):
            line = b""
        if not line:
            code = await self._exit_code()
            why = {  # negative: killed by a signal; 128 + signal: bwrap's report of one
                -signal.SIGKILL: " (killed: over its memory limit, or by the host)",
                128 + signal.SIGKILL: " (killed: over its memory limit, or by the host)",
                -signal.SIGXCPU: " (over its CPU-time limit)",
                128 + signal.SIGXCPU: " (over its CPU-time limit)",
            }.get(code or 0, "")
            if not why and self.last_line:
                why = f" ({self.last_line[-300:]})"
            raise ChildExited(f"the controller's process exited with {code}{why}", code=code)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise ChildFailed(f"{doing}: unreadable reply {line[:200]!r}", restart=True) from None
        if reply.get("type") == "error":
            raise ChildFailed(str(reply.get("error")), restart=False)
        return reply

    async def _exit_code(self) -> int | None:
        try:
            return await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            return None

    async def kill(self) -> None:
        """Kill its process group (in a sandbox: the sandbox) and wait, at most
        :data:`STOP_GRACE_S`, for it to exit and its pipes to close."""
        if self.proc.returncode is None:  # once reaped, its pid may be another's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
        except TimeoutError:  # something outside the group holds its pipes
            logger.warning("controller process %s: its pipes stay open", self.proc.pid)
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._pump, STOP_GRACE_S)

    async def close(self) -> None:
        """Close its input (it exits on its own), then :meth:`kill` what is left."""
        if self.proc.stdin is not None and self.proc.returncode is None:
            self.proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
        await self.kill()
