"""Run a Python module in a bubblewrap sandbox (``bwrap``, Debian's package ``bubblewrap``).

Two calls: :func:`unavailable` says whether sandboxes can start on this machine (None) or
what to install or fix (a message); :func:`command` gives the argv and environment that
start ``python -m <module> <args>`` inside one. The caller starts it with pipes for stdin,
stdout and stderr (the only way in and out) and ``start_new_session=True``, and stops it
by killing the process it started: that is bwrap's monitor, and ``--die-with-parent``
then kills the sandbox's pid 1, whose pid namespace takes every process inside with it
(grandchildren included, whatever pipes they hold). The sandbox also dies with the
thread that started it.

What a sandboxed process gets (each property is tried by ``tests/test_security_controllers.py``):

- **No network**: its own network namespace, with a loopback nobody listens on; abstract
  unix sockets are per namespace too.
- **No other process**: its own pid namespace and ``/proc``; pid 1 is bwrap's reaper.
- **No privilege**: a new session (no terminal to push input into), every capability
  dropped, ``no_new_privs`` (setuid binaries do not elevate).
- **A read-only filesystem**: the host's, read-only, except a private ``/tmp``
  (:data:`TMP_BYTES` of tmpfs) and ``/dev`` reduced to null, zero, random and the like.
  ``/run`` (where PostgreSQL's and MariaDB's unix sockets live; ``/var/run`` points
  there) is an empty tmpfs. The SQLite database file of ``settings.database_url`` with
  its ``-wal``, ``-shm`` and ``-journal`` companions, and ``settings.data_dir``, are
  absent: when their directory holds nothing the child imports, an empty read-only tmpfs
  covers the directory; otherwise (the database in the working directory, next to the
  code) an empty tmpfs covers it and every other entry of it is bound back read-only.
- **A scrubbed environment**: :func:`controlplane.isolation.user_code_env`, ``TMPDIR=/tmp``.
- **Limits**, set inside the sandbox by util-linux's ``prlimit`` before Python starts
  (:class:`Limits`): address space, CPU time (SIGXCPU at the limit, SIGKILL
  :data:`CPU_GRACE_S` later), processes and threads, open files.

Who it runs as. When the server is not root, bwrap runs unprivileged: ``--unshare-all``
with a user namespace of its own (``--disable-userns``: no nested one), and the child is
the server's user, who could read the database, hence the hiding above. When the server
is root, bwrap runs privileged without a user namespace, and the command inside first
drops to ``settings.sandbox_user`` with util-linux's ``setpriv`` (``--clear-groups``,
``--no-new-privs``, empty bounding set); bwrap keeps only ``CAP_SETUID``, ``CAP_SETGID``
and ``CAP_SETPCAP`` for it, which the change of user clears. Root needs this: as root
(even mapped into a user namespace) ``RLIMIT_NPROC`` is not enforced and root's files,
``/etc/shadow`` among them, stay readable. Dropping *inside* rather than before bwrap is
what lets the interpreter live under a directory the sandbox user cannot enter (pyenv
under ``/root``, mode 0700): bwrap, still root, mounts an empty tmpfs over such a
directory and binds back only what the child needs (the interpreter's prefix, the
virtual environment, the import path; their parents in the tmpfs are created 0755), so
the rest of ``/root`` stays out of sight. An unprivileged bwrap could not: it resolves
its sources as the sandbox user. One consequence: ``RLIMIT_NPROC`` counts every process
of the sandbox user, so all sandboxes share it; give ``sandbox_user`` an account of its
own for the count to be theirs alone.

Outside the sandbox's reach nonetheless: files any user may read (the host's ``/etc``,
the code), unix sockets in directories other than ``/run`` and ``/tmp`` that let anyone
connect, and the kernel's system calls (no seccomp filter).
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from controlplane import isolation
from controlplane.config import Settings

__all__ = ["CPU_GRACE_S", "TMP_BYTES", "Command", "Limits", "command", "unavailable"]

TOOLS_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"  # where bwrap, setpriv and prlimit are looked up
TMP_BYTES = 64 << 20  # a sandbox's /tmp: tmpfs pages are memory RLIMIT_AS does not count
CPU_GRACE_S = 5  # past the CPU-time limit, SIGXCPU; this much later, SIGKILL
PROBE_TIMEOUT_S = 15.0  # an empty sandbox starts in milliseconds; past this, something hangs
INSTALL = "install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap)"
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")
# What the child needs of the host besides the import path: this package's source root.
SOURCE_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Limits:
    """Resource limits of a sandbox's processes (``settings.controller_*``)."""

    memory_mb: int
    cpu_s: int
    processes: int
    open_files: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            memory_mb=settings.controller_memory_mb,
            cpu_s=settings.controller_cpu_s,
            processes=settings.controller_max_processes,
            open_files=settings.controller_max_open_files,
        )

    def prlimit(self) -> list[str]:
        """``prlimit`` and its options, up to and including ``--``."""
        memory = self.memory_mb << 20
        return [
            _tool("prlimit"),
            f"--as={memory}:{memory}",
            f"--cpu={self.cpu_s}:{self.cpu_s + CPU_GRACE_S}",
            f"--nproc={self.processes}:{self.processes}",
            f"--nofile={self.open_files}:{self.open_files}",
            "--",
        ]


@dataclass(frozen=True)
class Command:
    """What to start: ``argv`` with exactly ``env`` as its environment."""

    argv: list[str]
    env: dict[str, str]


def unavailable(settings: Settings) -> str | None:
    """None when sandboxes start on this machine; otherwise why not and what to install or
    set. The answer is probed once (an empty sandbox is started) and remembered."""
    missing = [t for t in ("bwrap", "prlimit", "setpriv") if not shutil.which(t, path=TOOLS_PATH)]
    if "bwrap" in missing:
        return f"bubblewrap (bwrap) is not installed, so user code cannot be sandboxed: {INSTALL}"
    if missing:
        return f"{', '.join(missing)} not found: install util-linux"
    try:
        user = _sandbox_user(settings)
    except ValueError as exc:
        return str(exc)
    return _probe(user)


def command(settings: Settings, module: str, args: Sequence[str] = ()) -> Command:
    """The command that runs ``python -m module *args`` in a sandbox configured from
    ``settings`` (hidden paths, user, :class:`Limits`). Call it only when
    :func:`unavailable` returned None (else the command fails when started)."""
    python = [sys.executable, "-m", module, *args]
    return Command(argv=_argv(settings, python), env=isolation.user_code_env(TMPDIR="/tmp"))


def unconfined(settings: Settings, module: str, args: Sequence[str] = ()) -> Command:
    """``python -m module *args`` with the sandbox's :class:`Limits` and environment but no
    namespace: for our own code (built-in controllers) where bubblewrap is missing."""
    python = [sys.executable, "-m", module, *args]
    prlimit = Limits.of(settings).prlimit() if shutil.which("prlimit", path=TOOLS_PATH) else []
    return Command(argv=[*prlimit, *python], env=isolation.user_code_env())


# -- the bwrap command line --------------------------------------------------------------


def _argv(settings: Settings, program: list[str]) -> list[str]:
    user = _sandbox_user(settings)
    needed = _needed()
    argv = [_tool("bwrap"), *_namespaces(user), "--die-with-parent", "--new-session"]
    argv += ["--ro-bind", "/", "/"]
    covered = _reachable(needed, user) if user is not None else {}
    for top, paths in covered.items():
        argv += ["--tmpfs", str(top), *paths]
    argv += _hide(_hidden(settings), needed)
    for top in covered:  # last: hiding may have created directories in them
        argv += ["--remount-ro", str(top)]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run"]
    argv += ["--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--chdir", "/tmp"]
    argv += ["--", *_drop(user), *Limits.of(settings).prlimit(), *program]
    return argv


def _namespaces(user: tuple[int, int] | None) -> list[str]:
    if user is None:  # unprivileged: a user namespace of bwrap's own, no nested one
        return ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    # Root: no user namespace (setpriv must become a real user); what setpriv needs, only.
    caps = [a for c in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP") for a in ("--cap-add", c)]
    unshare = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    return [*unshare, "--unshare-cgroup-try", "--cap-drop", "ALL", *caps]


def _drop(user: tuple[int, int] | None) -> list[str]:
    if user is None:
        return []
    uid, gid = user
    return [
        _tool("setpriv"),
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--no-new-privs",
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--",
    ]


def _sandbox_user(settings: Settings) -> tuple[int, int] | None:
    """(uid, gid) of ``settings.sandbox_user`` when this process is root; None otherwise.
    ValueError when that user does not exist or is root."""
    if os.geteuid() != 0:
        return None
    name = settings.sandbox_user
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise ValueError(
            f"sandbox_user {name!r} is not a user on this machine: set "
            "STREAMPILOT_SANDBOX_USER to an unprivileged account (e.g. nobody)"
        ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ValueError(f"sandbox_user {name!r} is root: name an unprivileged account")
    return entry.pw_uid, entry.pw_gid


def _needed() -> list[Path]:
    """What the child reads: the interpreter (its prefix and the virtual environment's),
    the import path :func:`user_code_env` gives it, this package's source root.
    Existing directories only, none inside another."""
    exe = Path(sys.executable).resolve()
    env_path = isolation.user_code_env()["PYTHONPATH"].split(os.pathsep)
    found = [exe.parent.parent, Path(sys.base_prefix), Path(sys.prefix), SOURCE_ROOT]
    found += [Path(p) for p in env_path if p]
    dirs = sorted({p.resolve() for p in found if p.is_dir()}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for d in dirs:
        if not any(d.is_relative_to(k) for k in kept):
            kept.append(d)
    return kept


def _hidden(settings: Settings) -> list[Path]:
    """``settings.data_dir``, and the SQLite database file with its companions."""
    paths = [Path(settings.data_dir)]
    url = make_url(settings.database_url)
    name = url.database or ""
    if url.get_backend_name() == "sqlite" and name and name != ":memory:":
        db = Path(name.removeprefix("file:").split("?")[0])
        paths += [db, *(db.with_name(db.name + s) for s in SQLITE_COMPANIONS)]
    # Relative paths are the server's working directory's, as SQLAlchemy opens them;
    # resolved, a mount covers every path that leads to the file.
    return [p.resolve() for p in paths]


def _hide(hidden: Iterable[Path], needed: list[Path]) -> list[str]:
    """bwrap options that make ``hidden`` absent (see the module docstring)."""
    by_dir: dict[Path, set[str]] = {}
    for p in hidden:
        by_dir.setdefault(p.parent, set()).add(p.name)
    argv: list[str] = []
    for parent in sorted(by_dir, key=lambda p: len(p.parts)):
        names = by_dir[parent]  # hidden whether they exist yet or not
        if not parent.is_dir():
            continue
        if parent == Path("/"):  # cannot cover /: cover the files themselves
            for n in sorted(names):
                if (parent / n).is_file():
                    argv += ["--ro-bind", "/dev/null", str(parent / n)]
            continue
        mode = stat.S_IMODE(parent.stat().st_mode)
        argv += ["--perms", f"{mode:04o}", "--tmpfs", str(parent)]
        if any(n.is_relative_to(parent) for n in needed):  # code lives there: bind it back
            argv += _bind_back(parent, names)
        argv += ["--remount-ro", str(parent)]
    return argv


def _bind_back(parent: Path, hidden: set[str]) -> list[str]:
    argv: list[str] = []
    with os.scandir(parent) as entries:
        for e in sorted(entries, key=lambda e: e.name):
            if e.name in hidden:
                continue
            path = os.path.join(parent, e.name)
            if e.is_symlink():
                argv += ["--symlink", os.readlink(path), path]
            elif e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False):
                argv += ["--ro-bind", path, path]
            # sockets, fifos and devices stay out: connecting needs no write access
    return argv


def _reachable(needed: list[Path], user: tuple[int, int]) -> dict[Path, list[str]]:
    """For root dropping to ``user``: {directory ``user`` cannot enter that holds needed
    paths: the bwrap options that bind those paths back into a tmpfs over it (their
    parents in the tmpfs created 0755)}."""
    cover: dict[Path, list[Path]] = {}
    for path in needed:
        closed = next((a for a in reversed(path.parents) if not _enterable(a, user)), None)
        if closed is not None:
            cover.setdefault(closed, []).append(path)
    options: dict[Path, list[str]] = {}
    for top in sorted(cover, key=lambda p: len(p.parts)):
        argv = options[top] = []
        made: set[Path] = set()
        for path in sorted(cover[top]):
            for d in reversed(path.parents):
                if d.is_relative_to(top) and d != top and d not in made:
                    argv += ["--perms", "0755", "--dir", str(d)]
                    made.add(d)
            argv += ["--ro-bind", str(path), str(path)]
    return options


def _enterable(directory: Path, user: tuple[int, int]) -> bool:
    st = directory.stat()
    uid, gid = user
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _tool(name: str) -> str:
    return shutil.which(name, path=TOOLS_PATH) or name


@functools.lru_cache(maxsize=8)
def _probe(user: tuple[int, int] | None) -> str | None:
    """Start an empty sandbox (``true``) with the namespaces and user of a real one."""
    argv = [_tool("bwrap"), *_namespaces(user), "--die-with-parent", "--ro-bind", "/", "/"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--", *_drop(user), _tool("true")]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False, env={}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap cannot start a sandbox here ({exc}); {INSTALL}"
    if done.returncode != 0:
        why = done.stderr.strip()[-300:] or f"exit status {done.returncode}"
        return (
            f"bubblewrap cannot start a sandbox here ({why}): user namespaces may be disabled "
            "(sysctl user.max_user_namespaces) or restricted (AppArmor)"
        )
    return None
