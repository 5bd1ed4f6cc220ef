"""The local backend: worker subprocesses on this machine (the embedded default).

Each worker is ``python -m runtime.worker`` started with the coordinator's address; the
cluster secret reaches it through a pipe it inherits (``--secret-fd``), never its command
line or environment, which other users and the job's own subprocesses can read. Workers die with their parent even if it is killed (``PR_SET_PDEATHSIG``
on Linux) and exit by themselves when the coordinator's connection closes; :meth:`close`
terminates, then kills, whatever is left, so no worker outlives a run or a failed test.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys

from .base import BackendError, WorkerBackend

__all__ = ["LocalBackend", "die_with_parent", "secret_pipe"]

logger = logging.getLogger(__name__)

STOP_GRACE_S = 3.0  # a worker exits on SIGTERM within this, or is killed
_PR_SET_PDEATHSIG = 1


def secret_pipe(secret: str) -> int:
    """The read end of a pipe holding ``secret`` (its write end closed), for a child to
    inherit as ``--secret-fd`` (pass it in ``pass_fds``, then close it here). A secret
    fits a pipe's buffer: writing it does not wait for the reader."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, secret.encode())
    except OSError:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return read_fd


def die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class LocalBackend(WorkerBackend):
    name = "local"

    def __init__(
        self,
        coordinator: tuple[str, int],
        secret: str,
        *,
        log_level: str = "WARNING",
        python: str = sys.executable,
        extra_args: list[str] | None = None,
        reserve_mb: int = 0,
    ) -> None:
        self.coordinator = coordinator
        self.secret = secret
        self.log_level = log_level
        self.python = python
        self.extra_args = (extra_args or []) + (
            ["--reserve-mb", str(reserve_mb)] if reserve_mb else []
        )
        self.procs: dict[int, asyncio.subprocess.Process] = {}

    async def start_workers(self, n: int) -> list[int]:
        if n < 0:
            raise BackendError(f"cannot start {n} workers")
        # Whatever the control plane can import, its local workers can import too.
        env = dict(os.environ)
        paths = [os.getcwd(), *(p for p in sys.path if p), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
        pids = []
        for _ in range(n):
            secret_fd = secret_pipe(self.secret)
            try:
                proc = await asyncio.create_subprocess_exec(
                    self.python,
                    "-m",
                    "runtime.worker",
                    "--coordinator",
                    f"{self.coordinator[0]}:{self.coordinator[1]}",
                    "--secret-fd",
                    str(secret_fd),
                    "--log-level",
                    self.log_level,
                    *self.extra_args,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    pass_fds=(secret_fd,),
                    preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
                    start_new_session=True,  # a Ctrl+C aimed at the control plane is its to handle
                )
            except OSError as exc:
                raise BackendError(f"cannot start a worker with {self.python}: {exc}") from exc
            finally:
                os.close(secret_fd)
            self.procs[proc.pid] = proc
            pids.append(proc.pid)
        return pids

    async def stop_worker(self, pid: int) -> None:
        proc = self.procs.pop(pid, None)
        if proc is None:
            raise BackendError(f"no local worker with pid {pid}")
        await _terminate(proc)

    def owns(self, pid: int) -> bool:
        return pid in self.procs

    def kill_worker(self, pid: int) -> None:
        """SIGKILL one worker at once (fault injection)."""
        proc = self.procs.get(pid)
        if proc is None:
            raise BackendError(f"no local worker with pid {pid}")
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    async def close(self) -> None:
        procs, self.procs = list(self.procs.values()), {}
        await asyncio.gather(*(_terminate(p) for p in procs))


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
