"""Render BENCHMARKS.md from the JSON results in bench/results/ (figures are never typed in).

Run after the benchmarks: ``.venv/bin/python bench/report.py``. The page is short: the
setup, one table per question, the verdicts computed from the rows, and how to re-run
each benchmark. What a result file holds beyond that (every round, every way of making a
change, the ``notes`` a run was annotated with) stays in the file, and git keeps the
history of earlier runs; notes are not rendered. The few notes the page has are written
with their sections (:mod:`bench.reporting`, a module each), each a sentence or three,
with their figures read from the results; this module puts the sections together.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.reporting.common import load
from bench.reporting.connectors import connectors_section
from bench.reporting.controllers import CONTROLLER_SECTIONS, controllers_section
from bench.reporting.reconfig import reconfig_section, verdicts
from bench.reporting.recovery import recovery_section
from bench.reporting.setup import setup_section
from bench.reporting.shipping import fork_copy_section, state_transfer_section
from bench.reporting.throughput import nexmark_section, spark_section, throughput_section

__all__ = [
    "connectors_section",
    "controllers_section",
    "fork_copy_section",
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
    """The page, from whatever results are present."""
    tp, rc, st, fc, rv, sp = (
        load(n)
        for n in ("throughput", "reconfig", "state_transfer", "fork_copy", "recovery", "spark")
    )
    cn, nx = load("connectors"), load("nexmark")
    controllers = [d for n in CONTROLLER_SECTIONS if (d := load(f"controllers_{n}"))]
    present = [d for d in (tp, rc, st, fc, rv, sp, cn, nx, *controllers) if d]
    lines = [
        "# Benchmarks",
        "",
        "Rendered by `bench/report.py` from the JSON files in `bench/results/`, which the "
        "benchmarks write; no figure here is typed in. How the mechanisms measured here work "
        "is in [docs/design.md](docs/design.md).",
        "",
    ]
    if present:
        lines += setup_section(present)
    if tp:
        lines += throughput_section(tp)
    if rc:
        lines += reconfig_section(rc, st)
    if st:
        lines += state_transfer_section(st)
    if fc:
        lines += fork_copy_section(fc)
    if rv:
        lines += recovery_section(rv)
    if sp:
        lines += spark_section(sp)
    if cn:
        lines += connectors_section(cn)
    if nx:
        lines += nexmark_section(nx)
    lines += controllers_section()
    return "\n".join(lines)


def main() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE.name} ({PAGE.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
