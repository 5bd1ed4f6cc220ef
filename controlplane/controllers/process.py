"""A controller's process, seen from the host: spawned with limits, spoken to in JSON lines.

:meth:`ControllerProcess.spawn` starts ``python -m controlplane.controllers.child`` with an
address-space limit and a CPU-time limit (``settings.controller_memory_mb``,
``settings.controller_cpu_s``), in its own session, killed with its parent.
:meth:`ControllerProcess.call` sends one request and waits for the reply (see
:mod:`.child` for the protocol); every way it can go wrong is a :class:`ChildFailed`
saying what happened and whether the process must be restarted. Its stderr (what the
script prints) goes to ``on_line``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import resource
import signal
import sys
from typing import Any

from controlplane.config import Settings
from controlplane.isolation import user_code_env

__all__ = ["ChildFailed", "ControllerProcess"]

STOP_GRACE_S = 3.0  # a child exits once its input closes (or on a kill) within this
_PR_SET_PDEATHSIG = 1


class ChildFailed(Exception):
    """The child died, hung or answered with an error; the message says which."""

    def __init__(self, message: str, *, restart: bool) -> None:
        super().__init__(message)
        self.restart = restart


class ControllerProcess:
    """A controller's process and its JSON-lines protocol (see :mod:`.child`)."""

    def __init__(self, proc: asyncio.subprocess.Process, on_line: Any) -> None:
        self.proc = proc
        self._pump = asyncio.create_task(self._read_stderr(on_line))

    @classmethod
    async def spawn(cls, settings: Settings, on_line: Any) -> ControllerProcess:
        memory = settings.controller_memory_mb * 1024 * 1024
        cpu = settings.controller_cpu_s

        def limits() -> None:  # in the child, between fork and exec
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
            with contextlib.suppress(Exception):
                ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

        # One BLAS thread: numpy's per-thread buffers would eat the address-space limit.
        env = user_code_env()  # none of the control plane's secrets
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "controlplane.controllers.child",
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=limits if sys.platform.startswith("linux") else None,
            start_new_session=True,
            limit=64 * 1024 * 1024,  # a reply carries a plan: allow long lines
        )
        return cls(proc, on_line)

    async def _read_stderr(self, on_line: Any) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            on_line(line.decode("utf-8", "replace").rstrip())

    async def call(self, request: dict[str, Any], timeout: float, doing: str) -> dict[str, Any]:
        """Send one request and return the reply; :class:`ChildFailed` if the child dies,
        hangs past ``timeout`` (it is then killed) or answers with an error."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            await self.kill()
            raise ChildFailed(
                f"{doing} did not return within {timeout:g}s; the process was killed",
                restart=True,
            ) from None
        except (ConnectionError, BrokenPipeError):
            line = b""
        if not line:
            code = await self._exit_code()
            why = {
                -signal.SIGKILL: " (killed: over its memory limit, or by the host)",
                -signal.SIGXCPU: " (over its CPU-time limit)",
            }.get(code, "")
            raise ChildFailed(f"the controller's process exited with {code}{why}", restart=True)
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
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self._pump, STOP_GRACE_S)

    async def close(self) -> None:
        if self.proc.stdin is not None and self.proc.returncode is None:
            self.proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
        await self.kill()
