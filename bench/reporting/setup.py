"""The page's setup section: where and when the results were measured, and how to read
them."""

from __future__ import annotations

from .common import day


def setup_section(results: list[dict]) -> list[str]:
    """Where and when the results were measured, and how to read them."""
    machines = sorted(
        {(r["machine"]["cpu"], r["machine"]["cores"], r["machine"]["python"]) for r in results}
    )
    days = sorted(day(r["date"]) for r in results)
    on = "; ".join(f"{cpu} ({cores} cores), Python {py}" for cpu, cores, py in machines)
    span = days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"
    return [
        "## Setup",
        "",
        f"Measured on {on}, a shared VM, from {span}. Local workers are processes on that "
        "machine. Figures are medians of rounds, with [min-max] ranges where a table shows "
        "them; the VM's speed drifts from run to run, so compare figures measured in the "
        "same run (the ratios) rather than absolute times across runs.",
        "",
        "Re-run everything with `make bench` (about three hours; it installs the `bench` "
        "extra), or one benchmark with the command under its table, then "
        "`.venv/bin/python bench/report.py` to render this page.",
        "",
    ]
