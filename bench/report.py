"""Render BENCHMARKS.md from the JSON results in bench/results/ (figures are never typed in).

Run after the benchmarks: ``.venv/bin/python bench/report.py``. The page is short: the
setup, an index of the benchmarks with their verdicts, then per benchmark a line on what
it measures with the command that re-runs it, its tables, its target and verdict (with
the reason where missed) computed from the rows, and its plot where it has one. What a result file holds beyond that (every round, every way of making a
change, the ``notes`` a run was annotated with) stays in the file, and git keeps the
history of earlier runs; notes are not rendered. The few notes the page has are written
with their sections (:mod:`bench.reporting`, a module each), each a sentence or three,
with their figures read from the results; this module puts the sections together.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.reporting.common import anchor, load
from bench.reporting.connectors import CONNECTORS_TITLE, connectors_section, connectors_verdict
from bench.reporting.controllers import (
    CONTROLLER_INDEX,
    controllers_found,
    controllers_section,
)
from bench.reporting.hotkeys_overhead import (
    HOTKEYS_OVERHEAD_TITLE,
    hotkeys_overhead_section,
    hotkeys_overhead_verdict,
)
from bench.reporting.reconfig import (
    RECONFIG_TITLE,
    reconfig_section,
    reconfig_verdict,
    verdicts,
)
from bench.reporting.recovery import RECOVERY_TITLE, recovery_section, recovery_verdict
from bench.reporting.setup import setup_section
from bench.reporting.shipping import (
    FORK_COPY_TITLE,
    STATE_TRANSFER_TITLE,
    fork_copy_section,
    state_transfer_section,
)
from bench.reporting.throughput import (
    NEXMARK_TITLE,
    SPARK_TITLE,
    THROUGHPUT_TITLE,
    nexmark_section,
    spark_section,
    throughput_section,
    throughput_verdict,
)

__all__ = [
    "connectors_section",
    "controllers_section",
    "fork_copy_section",
    "hotkeys_overhead_section",
    "main",
    "nexmark_section",
    "reconfig_section",
    "recovery_section",
    "render",
    "setup_section",
    "spark_section",
    "state_transfer_section",
    "throughput_section",
    "verdicts",
]

HERE = Path(__file__).parent
PAGE = HERE.parent / "BENCHMARKS.md"


def render() -> str:
    """The page, from whatever results are present: an index of the benchmarks with their
    verdicts, then a section each."""
    tp, rc, st, fc, rv, sp = (
        load(n)
        for n in ("throughput", "reconfig", "state_transfer", "fork_copy", "recovery", "spark")
    )
    cn, nx, hk = load("connectors"), load("nexmark"), load("hotkeys_overhead")
    controllers = controllers_found()
    present = [d for d in (tp, rc, st, fc, rv, sp, cn, nx, hk, *controllers.values()) if d]
    # (title, verdict for the index, the section's lines), in the page's order
    sections: list[tuple[str, str, list[str]]] = []
    if tp:
        sections.append((THROUGHPUT_TITLE, throughput_verdict(tp), throughput_section(tp)))
    sections.append(
        (HOTKEYS_OVERHEAD_TITLE, hotkeys_overhead_verdict(hk), hotkeys_overhead_section(hk))
    )
    if rc:
        sections.append((RECONFIG_TITLE, reconfig_verdict(rc), reconfig_section(rc, st)))
    if st:
        sections.append((STATE_TRANSFER_TITLE, "no target", state_transfer_section(st)))
    if fc:
        sections.append((FORK_COPY_TITLE, "no target", fork_copy_section(fc)))
    if rv:
        sections.append((RECOVERY_TITLE, recovery_verdict(rv), recovery_section(rv)))
    if sp:
        sections.append((SPARK_TITLE, "no target", spark_section(sp)))
    if cn:
        sections.append((CONNECTORS_TITLE, connectors_verdict(cn), connectors_section(cn)))
    if nx:
        sections.append((NEXMARK_TITLE, "no target", nexmark_section(nx)))
    index = [(title, v) for title, v, _ in sections] + [
        (CONTROLLER_INDEX[name][0], CONTROLLER_INDEX[name][1](d)) for name, d in controllers.items()
    ]
    lines = [
        "# Benchmarks",
        "",
        "Rendered by `bench/report.py` from `bench/results/`; how the mechanisms work: "
        "[docs/design.md](docs/design.md).",
        "",
        *(setup_section(present) if present else []),
        "| benchmark | verdict |",
        "|---|---|",
        *(f"| [{title}]({anchor(title)}) | {v} |" for title, v in index),
        "",
    ]
    for _, _, section in sections:
        lines += section
    lines += controllers_section(controllers)
    return "\n".join(lines)


def main() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE.name} ({PAGE.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
