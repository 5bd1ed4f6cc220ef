"""A worker's local copies of the checkpoint parts it wrote to a remote store.

:class:`~runtime.checkpoints.taking.CheckpointWriter` keeps a copy of each part it
writes to a store not on a local disk, so that a task restored on the worker that took
its checkpoint reads its state from there (Flink's task-local recovery). The copies of a
worker process are one directory in the system's temporary directory
(``tempfile.gettempdir()``, so ``TMPDIR``), made on its first write to such a store:

- named ``streampilot-local-checkpoints-<pid>-<random>`` after its owner, which holds
  an exclusive ``flock`` on the directory's ``owner.lock`` for as long as it lives (the
  kernel lets go of it when the process ends, however it ends, so a pid given again to
  another process, a clock that moves or a process in another PID namespace sharing the
  directory cannot make a live owner look dead);
- removed when the writer closes (the worker exits: the coordinator told it to, or went
  away, or a signal stopped it);
- removed, if its owner died first (SIGKILL, out of memory, a parent killed with
  ``PR_SET_PDEATHSIG``), by the next :class:`LocalCopies` made in the same temporary
  directory: before making its own, it sweeps those whose lock it can take
  (:func:`sweep_orphans`). A live owner's are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import psutil

__all__ = ["LOCK", "PREFIX", "LocalCopies", "sweep_orphans"]

logger = logging.getLogger(__name__)

PREFIX = "streampilot-local-checkpoints-"
_OWNED = re.compile(re.escape(PREFIX) + r"(\d+)-[^/]+")  # the owner's pid
LOCK = "owner.lock"  # in the directory: its owner holds an exclusive flock on it


class LocalCopies:
    """The copies of one worker process (module docstring), in a directory of its own
    under ``parent`` (default: the system's temporary directory), removed by
    :meth:`close`. Made, it first removes the directories of owners that are gone. Used
    from the writer's thread only."""

    def __init__(self, parent: str | Path | None = None) -> None:
        parent = Path(parent if parent is not None else tempfile.gettempdir())
        sweep_orphans(parent)
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent))
        # The lock appears under its name already held, so a sweeper never takes a live
        # owner's; without it yet, a sweeper asks whether the pid lives.
        taking = self.root / f"{LOCK}.new"
        self._lock = os.open(taking, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        taking.rename(self.root / LOCK)
        self._refs: dict[str, deque[set[str]]] = {}  # task -> paths its last chains name

    def _file(self, path: str) -> Path:
        return self.root.joinpath(*path.split("/"))

    def keep(self, path: str, chunks: Iterable[bytes | memoryview]) -> None:
        """Copy a part just written (best effort: a copy that fails is only missing)."""
        file = self._file(path)
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            with file.open("wb") as f:
                for chunk in chunks:
                    f.write(chunk)
        except OSError as exc:
            logger.warning("no local copy of checkpoint part %s: %s", path, exc)
            with contextlib.suppress(OSError):
                file.unlink()

    def read(self, path: str, offset: int, length: int) -> bytes | None:
        """A segment of a copy, or None when there is no (whole) copy."""
        try:
            with self._file(path).open("rb") as f:
                f.seek(offset)
                data = f.read(length)
        except OSError:
            return None
        return data if len(data) == length else None

    def referenced(self, task: str, paths: set[str]) -> None:
        """The parts ``task``'s chains name as of its last capture: copies that neither
        these nor those of its capture before (nor any other task's) name are removed."""
        self._refs.setdefault(task, deque(maxlen=2)).append(paths)
        wanted = {LOCK}.union(*(r for refs in self._refs.values() for r in refs))
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                file = Path(dirpath, name)
                if file.relative_to(self.root).as_posix() not in wanted:
                    with contextlib.suppress(OSError):
                        file.unlink()

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        os.close(self._lock)


def sweep_orphans(parent: Path) -> list[Path]:
    """Remove, best effort, the directories of copies in ``parent`` whose owner is gone:
    their lock can be taken (:data:`LOCK`), or, for one made but not locked yet, no
    process has the pid in its name. Only this user's directories named as
    :class:`LocalCopies` names them are looked at. Returns those removed."""
    try:
        entries = list(os.scandir(parent))
    except OSError as exc:
        logger.warning("cannot look for local checkpoint copies left in %s: %s", parent, exc)
        return []
    removed = []
    for entry in entries:
        owner = _OWNED.fullmatch(entry.name)
        if owner is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:  # removed meanwhile
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if not _orphaned(Path(entry.path), int(owner[1])):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        logger.info("removed the local checkpoint copies of a dead worker: %s", entry.path)
        removed.append(Path(entry.path))
    return removed


def _orphaned(root: Path, pid: int) -> bool:
    """Whether the owner of the copies in ``root``, process ``pid``, is gone."""
    try:
        fd = os.open(root / LOCK, os.O_RDWR)
    except FileNotFoundError:  # being made (or its owner died as it made it)
        return not psutil.pid_exists(pid)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its owner lives
        return False
    finally:
        os.close(fd)
    return True
