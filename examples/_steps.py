"""What the connector examples share: comparing an output with its reference, and their
``produce`` / ``check`` command line (``python -m examples.<example> produce|check -p
NAME=VALUE ...``)."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["differences", "main"]


def differences(what: str, have: Iterable[Any], want: Iterable[Any]) -> str | None:
    """None if ``have`` holds each of ``want`` once and nothing else (as multisets), else
    what differs, naming ``what`` (e.g. "trades")."""
    got, expected = Counter(have), Counter(want)
    missing, extra = expected - got, got - expected
    if not missing and not extra:
        return None
    return (
        f"{sum(missing.values())} {what} missing (e.g. {sorted(missing)[:3]}), "
        f"{sum(extra.values())} extra or twice (e.g. {sorted(extra)[:3]})"
    )


def main(
    prog: str,
    produce: Callable[[dict[str, Any]], str],
    check: Callable[[dict[str, Any]], str | None],
    checked: Callable[[dict[str, Any]], str],
    argv: list[str] | None = None,
) -> int:
    """Run ``produce`` (it says what it wrote) or ``check`` (None: equal; ``checked``
    then says what was checked) with the ``-p NAME=VALUE`` params; exit code 1 when the
    output differs from the reference."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("step", choices=("produce", "check"))
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    if bad := [item for item in args.param if "=" not in item]:
        parser.error(f"expected NAME=VALUE, got {bad[0]!r}")
    params = dict(item.split("=", 1) for item in args.param)
    if args.step == "produce":
        print(produce(params))
        return 0
    problem = check(params)
    print(problem or checked(params))
    return 1 if problem else 0
