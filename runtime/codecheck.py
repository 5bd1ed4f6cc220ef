"""``python -m runtime.codecheck FILENAME < source``: try an upload in a throwaway process.

Prints one JSON line, ``{"callables": [...]}`` or ``{"error": "<file>, line N: ..."}``.
The control plane runs it before installing an upload in its own process, so that a module
that hangs, exits or crashes while importing cannot take the control plane with it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from runtime.codeload import CodeError, check


def main() -> int:
    filename = sys.argv[1] if len(sys.argv) > 1 else "<upload>"
    source = sys.stdin.read()
    try:
        result: dict[str, Any] = {"callables": check(source, filename)}
    except CodeError as exc:
        result = {"error": str(exc)}
    sys.stdout.write(
        "\n" + json.dumps(result) + "\n"
    )  # last line: what the module printed is above
    return 0


if __name__ == "__main__":
    sys.exit(main())
