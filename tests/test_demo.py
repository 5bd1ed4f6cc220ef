"""The demo's stream: a rate step whose sentences all fall due within the run."""

from __future__ import annotations

import pytest

from controlplane.cli.demo import _schedule
from runtime.sources import Generator


@pytest.mark.parametrize(("rate", "step", "duration"), [(4000.0, 4.0, 40.0), (1500.0, 4.0, 6.0)])
def test_rate_step_schedule_makes_the_records_of_the_run(
    rate: float, step: float, duration: float
) -> None:
    schedule, records = _schedule(rate, step, duration)
    reader = Generator(rate=rate, schedule=schedule, keys=10).open(0, 1, 0.0)
    due = reader.poll(duration, 10**9)
    assert due is not None
    assert abs(len(due[0]) - records) <= 1  # the last one falls due at the very end
    quarter = Generator(rate=rate, schedule=schedule, keys=10).open(0, 1, 0.0)
    before_step = quarter.poll(0.25 * duration, 10**9)
    assert before_step is not None and abs(len(before_step[0]) - rate * 0.25 * duration) <= 1
