"""The autoscaler scenario's summary reads the task counts of its samples: a window that
missed one task's report is neither a scale-in nor fewer task-seconds."""

from __future__ import annotations

from bench.controllers import Run, scaled_in_s, task_counts


def sample(t: float, match: int, reported: int | None = None) -> dict:
    """A sample at ``t`` with ``match`` live match tasks, of which ``reported`` reported
    (all by default), and one stats task."""
    names = [f"match-{i}" for i in range(match)][: match if reported is None else reported]
    tasks = {name: 1000.0 for name in [*names, "stats-0"]}
    return {"t": t, "tasks": tasks, "workers": dict.fromkeys(tasks, "w1")}


def test_a_task_missing_from_one_sample_still_counts() -> None:
    samples = [sample(0, 2), sample(1, 2, reported=1), sample(2, 2), sample(3, 1)]
    assert task_counts(samples, "match") == [2, 2, 2, 1]


def test_scaled_in_when_the_tasks_are_back_for_good() -> None:
    up, down = 10.0, 20.0
    samples = [sample(t, 1) for t in range(10)]
    samples += [sample(t, 2) for t in range(10, 20)]
    # Two reports missed after the step down, then the real scale-in at 30.
    samples += [sample(t, 2, reported=1 if t in (22, 23) else None) for t in range(20, 30)]
    samples += [sample(t, 1) for t in range(30, 40)]
    assert scaled_in_s(Run(samples=samples), up, down) == 10.0
    assert scaled_in_s(Run(samples=samples[:30]), up, down) is None
    assert scaled_in_s(Run(samples=[sample(t, 1) for t in range(40)]), up, down) == 0.0
