"""Run untrusted user code once in a throwaway interpreter and read its one-line verdict.

Uploaded modules and controller scripts are imported first in a child process, so that a
module that hangs, exits or crashes at import cannot take the control plane with it. The
child (``python -m <module> <args>``) reads its input on stdin and prints, as its last
line of stdout, one JSON object; what the user's code printed comes before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from controlplane.errors import InvalidRequest

__all__ = ["run_check"]


def run_check(
    module: str,
    args: list[str],
    stdin: str,
    *,
    timeout: float,
    error: type[InvalidRequest],
    doing: str,
) -> dict[str, Any]:
    """The JSON object ``python -m module *args`` prints last; ``error`` (saying ``doing``
    went wrong) if it runs past ``timeout`` seconds or exits without printing one."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
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
