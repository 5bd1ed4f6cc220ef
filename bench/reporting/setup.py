"""The page's opening: where and when the results were measured, how to read them and how
to re-run them."""

from __future__ import annotations

from .common import day


def setup_section(results: list[dict]) -> list[str]:
    """Where and when the results were measured, how to read them, how to re-run them."""
    machines = sorted(
        {(r["machine"]["cpu"], r["machine"]["cores"], r["machine"]["python"]) for r in results}
    )
    days = sorted(day(r["date"]) for r in results)
    on = "; ".join(f"{cpu} ({cores} cores), Python {py}" for cpu, cores, py in machines)
    span = days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"
    return [
        f"Measured on {on}, a shared VM, {span}. Medians of rounds, [min-max] where they "
        "differ; the VM drifts, so compare ratios within a run, not times across runs. All: "
        "`make bench` (~3 h), then `.venv/bin/python bench/report.py`.",
        "",
    ]
