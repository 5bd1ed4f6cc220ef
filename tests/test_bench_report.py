"""The verdict tables of BENCHMARKS.md are computed from the benchmark's rows, not typed in:
these check that they judge the targets (10x the restart on new workers in completion
time and peak latency, p99 under 3x steady; the checkpoints' overhead, the time to first
output after a recovery, nothing lost or twice) as they are stated, that the steady p99
they are judged against is the run's, not one moment's, and that the rendered page stays
short and free of session history."""

from __future__ import annotations

import re

from bench.reconfig import steady_before_changes
from bench.report import hotkeys_overhead_section, recovery_section, render, verdicts
from bench.reporting.controllers import hotkeys_verdict


def row(total_ms: float, max_ms: float, p99_over_steady: float | None, status="completed"):
    return {
        "status": status,
        "steps": 1,
        "timings_ms": {"total": total_ms},
        "latency_after_ms": {"max_ms": max_ms, "p99_ms": 1.0},
        "p99_over_steady": p99_over_steady,
    }


# The verdict columns these tests read, in the order they unpack them.
JUDGED = (
    "change",
    "met",
    "best way",
    "completion",
    "peak latency",
    "p99 / steady",
    "ways that met",
)


def table(*changes: dict) -> list[list[str]]:
    """The verdict rows, each as the cells of the :data:`JUDGED` columns."""
    lines = verdicts({"changes": list(changes)})
    header, *rows = [line for line in lines if line.startswith("| ")]

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    names = cells(header)
    return [[dict(zip(names, cells(r), strict=True))[c] for c in JUDGED] for r in rows]


def test_the_fastest_way_that_meets_every_target_is_named() -> None:
    change = {
        "change": "migrate a task (to a standby worker)",
        "restart_new": row(2000.0, 2000.0, 100.0),
        "live": row(150.0, 60.0, 1.5),  # 13.3x, 33x, p99 1.5x: met
        "fluid_all": row(100.0, 150.0, 1.2),  # 20x but peak 13.3x: met, faster
        "live_nocopy": row(50.0, 400.0, 4.0),  # 40x but peak 5x, p99 4x: missed
    }
    [[name, met, how, completion, peak, p99, ways]] = table(change)
    assert (name, met, how) == ("migrate a task to the spare", "yes", "fluid, 1 step")
    assert (completion, peak, p99, ways) == ("20.0x", "13.3x", "1.2x", "2 of 3")


def test_a_change_that_misses_names_the_fastest_within_the_p99_bound() -> None:
    change = {
        "change": "migrate two tasks (swap workers)",
        "restart_new": row(2000.0, 2000.0, 100.0),
        "live": row(220.0, 60.0, 1.0),  # 9.1x: just short
        "live_nocopy": row(100.0, 100.0, 5.3),  # 20x at p99 5.3x
        "live@20ms": row(250.0, 60.0, 2.0),
    }
    [[name, met, how, completion, _, p99, ways]] = table(change)
    assert name == "swap two tasks' workers (extra)"
    assert (met, how, completion, p99, ways) == ("no", "pause", "9.1x", "1.0x", "0 of 3")


def test_p99_at_three_times_steady_is_not_under_it() -> None:
    change = {
        "change": "scale out 2 -> 4",
        "restart_new": row(3000.0, 3000.0, 100.0),
        "live": row(100.0, 100.0, 3.0),
    }
    assert table(change)[0][1] == "no"


def test_changes_without_a_completed_restart_on_new_workers_are_not_judged() -> None:
    failed = {"change": "rebalance", "restart_new": row(0.0, 0.0, None, status="failed")}
    absent = {"change": "swap logic", "live": row(10.0, 10.0, 1.0)}
    failed_live = {
        "change": "scale in 4 -> 2",
        "restart_new": row(2000.0, 2000.0, 100.0),
        "live": row(100.0, 50.0, 1.0, status="failed"),
    }
    assert table(failed, absent, failed_live) == []


def test_steady_p99_is_the_median_of_the_windows_before_the_changes() -> None:
    """One slow window (or one right after the warm-up) does not move the yardstick, and
    a window that saw no records does not count."""

    def sample(before_p99: float, after_p99: float, count: int = 1000) -> dict:
        return {
            "latency_before_ms": {"p99_ms": before_p99, "count": count},
            "latency_after_ms": {"p99_ms": after_p99, "count": 1000},
        }

    samples = [sample(10.0, 20.0), sample(12.0, 30.0), sample(55.0, 60.0), sample(0.0, 24.0, 0)]
    assert steady_before_changes(samples) == 12.0
    assert [s["p99_over_steady"] for s in samples] == [1.67, 2.5, 5.0, 2.0]
    assert steady_before_changes([sample(0.0, 5.0, count=0)]) is None


def test_the_rendered_page_is_short_and_without_session_history() -> None:
    """From the results in bench/results/: under 25 KB (ten sections, with room for the
    hot-key sketch's tables once measured; tables are most of it), no paragraph of more
    than a few sentences, no session numbers, commit hashes or issue references."""
    page = render()
    assert len(page.encode()) < 25_000
    paragraphs = [p for p in page.split("\n\n") if not p.lstrip().startswith("|")]
    assert max(len(p) for p in paragraphs) < 1_000
    assert not re.search(r"\bsession \d+", page, re.IGNORECASE)
    assert not re.search(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", page)
    assert "issue" not in page.lower()


def spread(median: float | None, n: int = 3) -> dict:
    return {"median": median, "min": median, "max": median, "n": n}


def overhead(throughput: float, p99: float) -> dict:
    return {
        "max_words_per_s": spread(1_000_000 * throughput),
        "p99_ms": spread(20 * p99),
        "p50_ms": spread(8.0),
        "throughput_ratio": spread(throughput),
        "p99_ratio": spread(p99),
        "checkpoints_completed": 4,
        "checkpoints_abandoned": 0,
        "duration_ms": spread(100.0),
        "bytes_written": spread(2**20),
        "bytes_restore_reads": spread(2**22),
        "written_over_restore_reads": spread(0.25),
    }


def recovered(first_output_s: float) -> dict:
    return {
        "first_output_s": spread(first_output_s),
        "caught_up_s": spread(first_output_s + 0.5),
        "p99_back_s": spread(first_output_s + 2),
        "replayed_s": spread(0.6),
        "steady_p99_ms": spread(20.0),
        "detect_ms": spread(20.0),
        "timings_ms": {k: spread(10.0) for k in ("halt", "place", "restore", "total")},
        "restore_reads_bytes": spread(2**22),
        "recovered": 3,
        "rounds": 3,
    }


def size(mb: float, overheads: tuple, firsts: tuple, twice: int = 0) -> dict:
    """A state size's results, as bench/recovery.py writes them: (throughput, p99) ratios
    of every 10 s and every 1 s, first output onto a spare worker and onto a new one."""
    (t10, p10), (t1, p1) = overheads
    return {
        "state_mb_per_task": mb,
        "state_bytes": 2 * mb * 2**20,
        "rate_words_per_s": 500_000.0,
        "load_average": {"start": [1.5, 1.0, 1.0], "end": [1.5, 1.0, 1.0]},
        "overhead": {
            "none": overhead(1.0, 1.0),
            "every_10s": overhead(t10, p10),
            "every_1s": overhead(t1, p1),
            "every_1s_whole": overhead(0.8, 2.5),
        },
        "recovery": {"spare": recovered(firsts[0]), "new_worker": recovered(firsts[1])},
        "exactly_once": {
            "sentences": 300_000,
            "rate_sentences_per_s": 20_000.0,
            "status": "finished",
            "killed": True,
            "recoveries": 1,
            "records_written": 2_400_000 + twice,
            "records_expected": 2_400_000,
            "missing": 0,
            "twice": twice,
        },
    }


def test_the_recovery_section_judges_its_targets_as_stated() -> None:
    """Overhead: every 10 s at least 95% throughput and at most 1.5x p99, every 1 s 85%
    and 2x (the bounds themselves pass); first output under 1 s onto a spare worker and
    2 s onto a new one at 10 MB (and 1 MB), under 5 s at 100 MB (the bound fails)."""
    result = {
        "command": "python bench/recovery.py",
        "rounds": 3,
        "seconds": 20.0,
        "warmup_s": 6.0,
        "recovery_policy": {"interval_s": 1.0},
        "kill_at_checkpoint": 10,
        "kill_after_s": 0.5,
        "state_sizes": [
            size(1, ((0.95, 1.5), (0.85, 2.0)), (0.99, 1.9)),
            size(10, ((0.94, 1.0), (0.9, 2.1)), (1.0, 1.5)),
            size(100, ((1.0, 1.0), (1.0, 1.0)), (4.9, 5.0), twice=3),
        ],
    }
    lines = recovery_section(result)

    def met(*first_cells: str) -> str:
        prefix = "| " + " | ".join(first_cells) + " |"
        row = next(line for line in lines if line.startswith(prefix))  # the first table's
        cells = [c.strip() for c in row.strip("|").split("|")]
        return cells[-1] if "every" in first_cells[1] else cells[4]

    assert met("1 MB", "every 10 s") == "yes" and met("1 MB", "every 1 s") == "yes"
    assert met("10 MB", "every 10 s") == "no" and met("10 MB", "every 1 s") == "no"
    assert met("100 MB", "every 10 s") == "yes"
    assert met("1 MB", "the spare worker") == "yes"
    assert met("1 MB", "a new worker process") == "yes"
    assert met("10 MB", "the spare worker") == "no"
    assert met("10 MB", "a new worker process") == "yes"
    assert met("100 MB", "the spare worker") == "yes"
    assert met("100 MB", "a new worker process") == "no"
    verdicts_ = [line.partition(". ")[2] for line in lines if line.startswith("**Target:**")]
    missed = [v for v in verdicts_ if v.startswith("**Missed:**")]
    assert missed == [
        "**Missed:** 10 MB every 10 s (throughput 0.94x), 10 MB every 1 s (p99 2.10x).",
        "**Missed:** 10 MB onto the spare worker (1.0 s), 100 MB onto a new worker process "
        "(5.0 s).",
        "**Missed:** 100 MB (3 records twice, 0 missing).",
    ]
    exact = {
        line.split("|")[1].strip(): line.split("|")[-2].strip()
        for line in lines
        if "| yes, 1 |" in line
    }
    assert exact == {"1 MB": "yes", "10 MB": "yes", "100 MB": "no"}


def test_where_the_job_fell_behind_without_checkpoints_only_throughput_is_judged() -> None:
    """p50 in seconds without checkpoints: the job was behind its rate, its p99 is the
    backlog's; the p99 bound is not applied, the throughput bound is, and a note says so."""
    slow = size(10, ((0.96, 3.0), (0.8, 1.0)), (0.5, 1.5))
    slow["overhead"]["none"]["p50_ms"] = spread(1_800.0)
    result = {
        "command": "python bench/recovery.py",
        "rounds": 3,
        "seconds": 20.0,
        "warmup_s": 6.0,
        "recovery_policy": {"interval_s": 1.0},
        "kill_at_checkpoint": 10,
        "kill_after_s": 0.5,
        "state_sizes": [slow],
    }
    lines = recovery_section(result)
    rows: dict[str, str] = {}
    for line in lines:  # the first table's row of each configuration
        if line.startswith("| 10 MB |"):
            rows.setdefault(line.split("|")[2].strip(), line)
    assert rows["every 10 s"].rstrip(" |").endswith("yes, throughput only")
    assert rows["every 1 s"].rstrip(" |").endswith("no, throughput only")
    assert any("fell behind" in line and "1,800.0 ms" in line for line in lines)


def test_the_hot_key_sketch_section_says_not_measured_until_its_results_exist() -> None:
    """Without bench/results/hotkeys_overhead.json the section names the command to run;
    with results, a row per workload (on, off, on / off, µs per batch) and one per count
    tasks of the payload."""
    absent = "\n".join(hotkeys_overhead_section(None))
    assert "Not measured yet: `python bench/hotkeys_overhead.py`." in absent
    assert "| keys |" not in absent

    def words(x: float) -> dict:
        return {"median": x, "min": x * 0.9, "max": x * 1.1, "n": 3}

    result = {
        "command": "python bench/hotkeys_overhead.py",
        "workers": 2,
        "rounds": 3,
        "batch_size": 512,
        "workload": {"words_per_sentence": 8, "keys": 10_000},
        "end_to_end": {
            "zipf": {
                "zipf": 1.0,
                "on_words_per_s": words(980_000),
                "off_words_per_s": words(1_000_000),
                "on_over_off": words(0.98),
            }
        },
        "per_batch": {
            "zipf": {
                "keyed_us_per_batch": words(160.0),
                "sketch_us_per_batch": words(2.4),
                "sketch_over_keyed": 0.015,
            }
        },
        "payload": {
            "max_parallelism": 128,
            "words_per_s": 800_000.0,
            "series_window_s": 300.0,
            "series_step_s": 2.0,
            "metrics_window_s": 5.0,
            "by_tasks": {
                "2": {"heat_map_bytes": 137_356, "heat_map_gzip_bytes": 48_167,
                      "heat_map_cells": 19_200, "metrics_tasks_bytes": 3_750,
                      "hot_keys_bytes": 1_716},
            },
        },
    }  # fmt: skip
    lines = hotkeys_overhead_section(result)
    assert (
        "| zipf, Zipf 1 | 980,000 [882,000-1,078,000] | 1,000,000 [900,000-1,100,000] | "
        "0.980 [0.882-1.078] | 160.0 [144.0-176.0] | 2.4 [2.2-2.6] | 1.5% |" in lines
    )
    assert "| 2 | 137,356 (19,200) | 48,167 | 3,750 | 1,716 |" in lines


def test_the_hot_key_split_is_met_only_when_each_way_more_counts_more() -> None:
    def result(*rates: float) -> dict:
        names = ["1 way", "2 ways", "3 ways"][: len(rates)]
        return {
            "summary": {
                n: {"words_per_s": {"median": r}} for n, r in zip(names, rates, strict=True)
            }
        }

    assert hotkeys_verdict(result(57_701.2, 71_620.7, 74_770.0)) == "met"
    assert hotkeys_verdict(result(57_701.2, 71_620.7, 70_000.0)) == (
        "missed: 3 ways (70,000.0 <= 71,620.7)"
    )
