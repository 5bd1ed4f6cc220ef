"""Processes that run user code: their environment, and a throwaway check of an upload.

Uploaded modules and controller scripts are imported first in a child process, so that a
module that hangs, exits or crashes at import cannot take the control plane with it. The
child (``python -m <module> <args>``) reads its input on stdin and prints, as its last
line of stdout, one JSON object; what the user's code printed comes before it.

Every such process gets :func:`user_code_env`: the variables a Python program needs and
none of the control plane's own (``STREAMPILOT_*`` carries the admin token, the cluster
secret and the database URL), so a script cannot act as the control plane. Where
bubblewrap is installed it also runs in a sandbox (:mod:`controlplane.sandbox`: no
network, no other process, a read-only filesystem without the database, limits).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

from controlplane import sandbox
from controlplane.config import Settings
from controlplane.errors import InvalidRequest

__all__ = ["MAX_SOURCE_BYTES", "USER_CODE_ENV", "python_source", "run_check", "user_code_env"]

logger = logging.getLogger(__name__)

MAX_SOURCE_BYTES = 1 << 20  # an uploaded module or script is source code, not data

# What a child running user code inherits: enough to find Python and its packages.
USER_CODE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH")


def python_source(filename: str, data: bytes, *, error: type[InvalidRequest]) -> str:
    """The text of an uploaded ``.py`` file; ``error`` saying what is wrong with it (not a
    ``.py`` name, over :data:`MAX_SOURCE_BYTES`, not UTF-8)."""
    if not filename.endswith(".py"):
        raise error(f"{filename!r} is not a Python module: upload a .py file")
    if len(data) > MAX_SOURCE_BYTES:
        raise error(f"{filename} is {len(data)} bytes; the limit is {MAX_SOURCE_BYTES}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{filename} is not UTF-8 text (byte {exc.start})") from None


def user_code_env(**extra: str) -> dict[str, str]:
    """The environment of a process running user code: :data:`USER_CODE_ENV` from this
    process, ``PYTHONPATH`` extended with this process's import path (whatever the control
    plane imports, the child can), one BLAS thread, and ``extra``."""
    env = {k: os.environ[k] for k in USER_CODE_ENV if k in os.environ}
    paths = [os.getcwd(), *(p for p in sys.path if p), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **extra)
    return env


def run_check(
    module: str,
    args: list[str],
    stdin: str,
    *,
    timeout: float,
    error: type[InvalidRequest],
    doing: str,
    settings: Settings,
) -> dict[str, Any]:
    """The JSON object ``python -m module *args`` prints last; ``error`` (saying ``doing``
    went wrong) if it runs past ``timeout`` seconds or exits without printing one.

    Where :func:`controlplane.sandbox.unavailable` says sandboxes start, the child runs in
    one configured from ``settings`` (the database and data directory it hides, the user
    it runs as when the server is root, ``settings.controller_*`` limits); on timeout the
    whole sandbox is killed. **Where bubblewrap is missing, the child is a plain process**
    with :func:`user_code_env` and nothing else: it can read what the server's user can,
    reach the network, see and signal other processes (a warning is logged)."""
    missing = sandbox.unavailable(settings)
    if missing is None:
        command = sandbox.command(settings, module, args)
    else:
        logger.warning("%s runs unsandboxed: %s", doing, missing)
        command = sandbox.Command([sys.executable, "-m", module, *args], user_code_env())
    try:
        proc = subprocess.run(
            command.argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=command.env,
            start_new_session=True,  # no signal of the server's terminal reaches it
        )
    except subprocess.TimeoutExpired:  # killed: its sandbox, every process in it, with it
        raise error(
            f"{doing} did not finish within {timeout:.0f}s; move long-running work out of "
            "module level"
        ) from None
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        detail = proc.stderr.strip()[-500:]
        raise error(
            f"{doing}: the interpreter exited with code {proc.returncode} without an answer"
            f"{': ' + detail if detail else ''}; code must not exit or crash at import"
        )
    return result
