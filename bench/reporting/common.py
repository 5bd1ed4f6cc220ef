"""What every section of the page shares: the results files, how a figure is written (a
number, a median with its range, a ratio, a count of rounds), and how a section opens
(its heading, what it measures and the command) and closes (its target and verdict).

Every section has the same shape: a line on what is measured with the command that
re-runs it, its tables, and ``Target: ... Met.`` or ``Missed: ... (reason).``; the page's
index lists each section's one-word verdict (:func:`anchor` links to it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).parent.parent / "results"


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fmt(x: object, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:,.1f}{unit}"
    if isinstance(x, int):
        return f"{x:,}{unit}"
    return f"{x}{unit}"


def day(date: str) -> str:
    """The day of an ISO timestamp (``2026-11-26T08:43:01Z`` -> ``2026-11-26``)."""
    return date.partition("T")[0]


def rerun(command: str) -> str:
    return f"Run: `{command.strip()}`."


def anchor(title: str) -> str:
    """The link target GitHub gives the heading ``title``."""
    return "#" + re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def opening(title: str, what: str, command: str | None, level: int = 2) -> list[str]:
    """A section's heading, then one paragraph: what it measures, and how to re-run it."""
    run = f" {rerun(command)}" if command else ""
    return [f"{'#' * level} {title}", "", f"{what}{run}", ""]


def verdict(target: str, missed: list[str], reason: str = "") -> list[str]:
    """The closing line: the target, then ``Met.`` or what missed it and why."""
    if not missed:
        return [f"**Target:** {target}. **Met.**", ""]
    why = f" ({reason})" if reason else ""
    return [f"**Target:** {target}. **Missed:** {', '.join(missed)}{why}.", ""]


def spread(s: dict, digits: int = 1, scale: float = 1.0) -> str:
    """A median with its [min-max] range (the range only where the values differ at the
    precision shown), to ``digits`` decimals, each times ``scale``."""
    if s.get("median") is None:
        return "n/a"
    median, low, high = (f"{s[k] * scale:,.{digits}f}" for k in ("median", "min", "max"))
    return median if s.get("n", 1) < 2 or low == high else f"{median} [{low}-{high}]"


def times(x: dict) -> str:
    return "n/a" if x.get("median") is None else f"{x['median']:.2f}x"


def fraction(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def rounds_of(n: int) -> str:
    return "1 round" if n == 1 else f"{n} rounds"
