"""The DS2 autoscaler on simulated runs: a rate step gets every stage's target parallelism
in one decision, the backlog drains, scale-in waits for its hysteresis and cool-down, a
scale-out whose rates do not hold at the new parallelism is followed by a second one
after the short scale-out cool-down, never by a scale-in before the long one, and a
steady load with noise never makes a second decision."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from controllers_support import rebalanced, task, view_of, window
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers import (
    ConfigError,
    Latency,
    Outcome,
    Plan,
    PlanBuilder,
    SafetyConfig,
    View,
    check_safety,
    decision_of,
)
from controllers.builtin import BUILTINS, Ds2Autoscaler, Ds2AutoscalerConfig
from controllers.builtin.ds2_autoscaler import (
    one_step,
    required_inputs,
    scale_plan,
    sized,
    source_output,
    stages,
)
from controllers.queueing import P99_OVER_MEAN, sojourn_s
from controlplane.abstraction import Abstraction, apply_plan
from controlplane.metrics.schemas import PartitionHealth, TaskMetrics

A = rebalanced(n_workers=3)  # lines (1) -rebalance-> split (3) -key-> count (2, 8) -fwd-> out (2)
SPLIT_SPEED = 1000.0  # sentences per busy second of one split task
COUNT_SPEED = 8000.0  # words per busy second of one count task
WORDS = 4  # words per sentence: split's selectivity
DT = 2.0  # seconds per period: the host's shortest window
LIMIT_MS = 200.0
CONFIG = {"max_latency_ms": LIMIT_MS}


def steady(tasks: int) -> float:
    """Sentences per busy second of one split task, whatever the number of tasks."""
    return SPLIT_SPEED


def contended(tasks: int) -> float:
    """One split task's speed on a machine with room for 3 at full speed: more than 3
    tasks share the cores, each at 60% of it (the rate measured at 3 does not hold)."""
    return SPLIT_SPEED if tasks <= 3 else 0.6 * SPLIT_SPEED


def parallelism(a: Abstraction) -> tuple[int, int]:
    return a.operator("split").parallelism, a.operator("count").parallelism


def at(a: Abstraction, split: int, count: int) -> Abstraction:
    """``a`` with that many split and count (and out) tasks."""
    plan = PlanBuilder(a).scale("split", split).scale("count", count).build()
    return a if plan is None else apply_plan(a, plan)


def metrics(t: TaskMetrics, **changes: float) -> TaskMetrics:
    return t.model_copy(update=changes)


@dataclass
class Pipeline:
    """A fluid model of the job, one period of ``DT`` at a time: sentences arrive at
    ``rate``, wait in split's queue, are split at ``split_speed(tasks)`` per task (default
    SPLIT_SPEED) into WORDS words, which wait in count's queue and are counted at
    COUNT_SPEED per task. Queues are unbounded, so the source is never backpressured;
    tasks upstream of a saturated stage show half of their time blocked. Each view's
    window is its period, as the host's."""

    a: Abstraction
    queues: list[float] = field(default_factory=lambda: [0.0, 0.0])
    split_speed: Callable[[int], float] = steady

    def period(self, rate: float, now: float) -> View:
        k_split, k_count = parallelism(self.a)
        q_split, q_count = self.queues
        speed = self.split_speed(k_split)
        split = min(rate + q_split / DT, k_split * speed)
        words = WORDS * split
        count = min(words + q_count / DT, k_count * COUNT_SPEED)
        self.queues = [q_split + (rate - split) * DT, q_count + (words - count) * DT]
        q_split, q_count = self.queues
        per_split, per_count = split / k_split, count / k_count
        tasks = [metrics(task("lines-0"), out_per_s=rate)]
        tasks += [
            metrics(
                task(f"split-{i}", in_per_s=per_split, busy=per_split / speed),
                out_per_s=WORDS * per_split,
                queued={"lines-0": round(q_split / k_split)},
                backpressure=0.5 if q_count > 0 else 0.0,
            )
            for i in range(k_split)
        ]
        if q_split > 0:
            tasks[0] = metrics(tasks[0], backpressure=0.5)
        tasks += [
            task(
                f"count-{i}",
                in_per_s=per_count,
                busy=per_count / COUNT_SPEED,
                queued=round(q_count / k_count),
            )
            for i in range(k_count)
        ]
        tasks += [
            metrics(task(f"out-{i}", in_per_s=per_count, busy=0.001), out_per_s=0.0)
            for i in range(k_count)
        ]
        if q_split > 0 or q_count > 0:
            p99 = 1000.0 * (q_split / max(split, 1.0) + q_count / max(count, 1.0))
        else:
            mean_s = sojourn_s(rate, speed, k_split) + sojourn_s(words, COUNT_SPEED, k_count)
            # A stage at exactly its capacity has no steady state: a second of queueing.
            p99 = 1000.0 * P99_OVER_MEAN * min(mean_s, 1.0)
        return view_of(self.a, {**window(tasks, p99_ms=p99), "window_s": DT}, now=now)


@dataclass
class Run:
    """What a controller did over a schedule of rates, each decision applied (or refused by
    the host's safety limits, when given) and its outcome handed back."""

    sizes: list[tuple[int, int]] = field(default_factory=list)
    decisions: list[tuple[int, Plan]] = field(default_factory=list)  # (period, plan)
    split_queue: list[float] = field(default_factory=list)


def drive(
    controller: Ds2Autoscaler,
    a: Abstraction,
    rates: list[float],
    safety: SafetyConfig | None = None,
    split_speed: Callable[[int], float] = steady,
) -> Run:
    pipeline, run, history = Pipeline(a, split_speed=split_speed), Run(), []
    for i, rate in enumerate(rates):
        now = DT * i
        view = replace(pipeline.period(rate, now), history=tuple(history))
        plan = decision_of(controller.decide(view), view)
        if plan is not None:
            run.decisions.append((i, plan))
            verdict = check_safety(plan, pipeline.a, safety or SafetyConfig(0.0), history, now=now)
            if verdict.allowed:
                pipeline.a = apply_plan(pipeline.a, plan)
            status = "completed" if verdict.allowed else "refused"
            history.append(Outcome(now + 0.05, plan, status, verdict.reason, verdict.moves))
            controller.on_result(history[-1])
        run.sizes.append(parallelism(pipeline.a))
        run.split_queue.append(pipeline.queues[0])
    return run


def test_a_rate_step_gets_every_target_in_one_decision() -> None:
    """1,200 sentences/s, then 3,600: split (3 x 1,000/s) saturates; the first period that
    shows it sizes split for 3,600/s plus its backlog drained in 10 s at 70% busy (6 tasks)
    and count for four times that (3 tasks), in one plan."""
    c = Ds2Autoscaler(CONFIG)
    run = drive(c, A, [1200.0] * 10 + [3600.0] * 30)
    assert [i for i, _ in run.decisions] == [10]
    plan = run.decisions[0][1]
    assert plan == PlanBuilder(A).scale("split", 6).scale("count", 3).build()
    assert run.sizes[10:] == [(6, 3)] * 30
    assert apply_plan(A, plan).operator("out").parallelism == 3  # forward group: with count


def test_one_decision_per_step_under_the_safety_limits() -> None:
    """Up 3x, then back down: one decision each way, the scale-in only after its streak of
    periods below the current tasks (and the cool-down), the backlog of the step drained
    within backlog_drain_s of the scale-out."""
    c = Ds2Autoscaler({**CONFIG, "scale_in_periods": 5, "cooldown_s": 10.0})
    schedule = [1200.0] * 10 + [3600.0] * 30 + [1200.0] * 30
    run = drive(c, A, schedule, SafetyConfig(cooldown_s=10.0))
    assert [i for i, _ in run.decisions] == [10, 44]  # 40 + 5 periods of streak - 1
    # 1,200 sentences/s sized at 63% busy: split ceil(1.2 / 0.63), count ceil(0.6 / 0.63).
    assert run.sizes[-1] == (2, 1)
    assert run.split_queue[10] > 0 and max(run.split_queue[10 + int(10 / DT) :]) == 0.0


def test_backlog_and_source_lag_raise_the_required_rate() -> None:
    sel = {"split": 4.0}
    need = required_inputs(A, {"lines": 100.0}, sel, {"split": 50.0})
    assert need == {"split": 150.0, "count": 600.0, "out": 600.0}
    # A queue at split and lag at the source both count, drained within backlog_drain_s.
    base = Pipeline(at(A, 3, 2)).period(1000.0, 0.0)
    cfg = Ds2AutoscalerConfig(backlog_drain_s=5.0)
    lagging = [
        metrics(t, partitions={"p0": PartitionHealth(lag=2000, stalled=None)})
        if t.task == "lines-0"
        else metrics(t, queued={"lines-0": 1000})
        if t.operator == "split"
        else t
        for t in _tasks(base)
    ]
    view = view_of(A, window(lagging, p99_ms=50.0))
    rates = {s.operators: s.rates for s in stages(A, view.metrics, cfg)}
    # 1,000/s emitted + 2,000 behind / 5 s at the source; 3 x 1,000 queued / 5 s at split.
    assert rates[("split",)]["split"][0] == pytest.approx(1000 + 400 + 600)
    assert rates[("count", "out")]["count"][0] == pytest.approx(4 * 2000)


def test_a_source_rate_is_read_on_its_channels() -> None:
    """What a source delivered is measured per second of the window on its channels to each
    reader: a task's own rates are per second of the time it accounted for (a source
    blocked on output credit reports more)."""
    tasks = _tasks(Pipeline(A).period(1000.0, 0.0))
    tasks = [metrics(t, out_per_s=20_000.0) if t.task == "lines-0" else t for t in tasks]
    sent = {("lines-0", f"split-{i}"): 10 * 1000.0 / 3 for i in range(3)}  # bytes: 10 a record
    sent[("split-0", "count-0")] = 99_999.0  # not the source's
    measured = view_of(A, window(tasks, traffic=sent, p99_ms=50.0)).metrics
    assert source_output(A, measured, "lines") == pytest.approx(1000.0)
    unmeasured = view_of(A, window(tasks, p99_ms=50.0)).metrics
    assert source_output(A, unmeasured, "lines") == 20_000.0


def _tasks(view: View) -> list[TaskMetrics]:
    return [TaskMetrics(**t.to_dict()) for t in view.metrics.tasks]


def test_forward_groups_take_their_slowest_member() -> None:
    """count and out scale together; a slow sink sizes the group."""
    view = Pipeline(A).period(1000.0, 0.0)
    slow_out = [
        metrics(t, busy=t.in_per_s / 2500.0) if t.operator == "out" else t for t in _tasks(view)
    ]
    chain = stages(A, view_of(A, window(slow_out, p99_ms=50.0)).metrics, Ds2AutoscalerConfig())
    group = next(s for s in chain if s.operators == ("count", "out"))
    # 4,000 words/s: count needs ceil(4000 / 5600) = 1, out (2,500/s a task) ceil(2.3) = 3.
    assert one_step(group, 0.7) == 3
    assert [s.operators for s in chain] == [("split",), ("count", "out")]  # never the source


def test_caps_by_max_tasks_and_key_groups() -> None:
    c = Ds2Autoscaler({**CONFIG, "max_tasks": 4})
    plan = drive(c, A, [1200.0, 6000.0]).decisions[0][1]
    assert parallelism(apply_plan(A, plan)) == (4, 4)
    # 12,000/s and 9,000 more queued in the period at split (10 s to drain): 13,800/s for
    # split (20 tasks at 70%) and four times that for count, capped by its 8 key groups.
    c = Ds2Autoscaler(CONFIG)
    plan = drive(c, A, [1200.0, 12000.0]).decisions[0][1]
    assert parallelism(apply_plan(A, plan)) == (20, 8)
    c = Ds2Autoscaler({**CONFIG, "operators": ["count"]})
    plan = drive(c, A, [1200.0, 12000.0]).decisions[0][1]
    assert parallelism(apply_plan(A, plan)) == (3, 8)


def test_latency_model_adds_tasks_beyond_the_one_step_size() -> None:
    """At 70% busy one split task of 1,000/s holds a record 3.3 ms on average; a mean target
    of 1 ms needs more tasks than the rate alone."""
    view = Pipeline(at(A, 1, 1)).period(600.0, 0.0)
    chain = stages(view.abstraction, view.metrics, Ds2AutoscalerConfig())
    by_rate = {s.operators: k for s, k in sized(chain, 0.7, 1000.0).items()}
    by_latency = {s.operators: k for s, k in sized(chain, 0.7, 1.5).items()}
    assert by_rate == {("split",): 1, ("count", "out"): 1}
    assert by_latency[("split",)] > 1 and by_latency[("count", "out")] >= 1
    total = sum(s.latency_ms(by_latency[s.operators]) for s in chain)
    assert total <= 1.5


def test_scale_in_waits_for_the_streak_and_the_cool_down() -> None:
    c = Ds2Autoscaler({**CONFIG, "scale_in_periods": 4, "cooldown_s": 6.0})
    big = at(A, 8, 6)
    run = drive(c, big, [1000.0] * 12)
    assert [i for i, _ in run.decisions] == [3]  # the fourth period in a row below
    # 1,000 sentences/s at 56% busy: split ceil(1000 / 560) = 2, count ceil(4000 / 4480) = 1.
    assert run.sizes[-1] == (2, 1)
    # An overloaded period (a p99 spike) breaks the streak.
    c = Ds2Autoscaler({**CONFIG, "scale_in_periods": 3})
    pipeline = Pipeline(big)
    views = [pipeline.period(1000.0, DT * i) for i in range(6)]
    views[2] = replace(views[2], metrics=replace(views[2].metrics, latency=_spike(views[2])))
    assert [c.decide(v) is not None for v in views] == [False] * 5 + [True]
    # Right after a change of parallelism (anyone's), nothing until the cool-down is over.
    c = Ds2Autoscaler({**CONFIG, "scale_in_periods": 1, "cooldown_s": 10.0})
    assert c.decide(Pipeline(big).period(1000.0, 0.0)) is not None
    other = at(A, 7, 6)
    decided = [c.decide(Pipeline(other).period(1000.0, 2.0 * i)) for i in range(1, 8)]
    assert [p is not None for p in decided] == [False] * 5 + [True, True]


@pytest.mark.parametrize(
    ("rate", "start", "end"),
    [
        (455.0, 2, 1),  # the stock exchange after its step down: one task 45.5% busy
        (455.0, 3, 1),
        (550.0, 3, 1),  # 2 tasks would be 27.5% busy: 3 -> ceil(0.55 / 0.63) = 1
        (550.0, 2, 2),  # 1 task would be 55% busy, over 0.5: 2 stay (the hysteresis)
    ],
)
def test_scale_in_to_the_headroom_size_when_one_task_fewer_is_idle_enough(
    rate: float, start: int, end: int
) -> None:
    """A stage scales in when one task fewer would be busy at most scale_in_utilization
    (0.5), to its size at target_utilization x scale_in_headroom (0.63); where that leaves
    it depends on where it started, and either end is stable."""
    c = Ds2Autoscaler({**CONFIG, "scale_in_periods": 5})
    run = drive(c, at(A, start, 1), [rate] * 30)
    assert run.sizes[-1][0] == end
    assert len(run.decisions) == (start != end)


def test_a_rate_that_does_not_hold_gets_a_second_scale_out_after_the_short_cool_down() -> None:
    """Split's speed drops beyond 3 tasks (contended cores): the step sizes it from the
    rate measured at 3 (6 tasks), which does not hold at 6. The second scale-out, to the
    rate measured at 6, follows once a window of the new configuration was measured (the
    second period after the change: 4 s), under the host's scale-out cooldown of 3 s; with
    the long cool-down for scale-outs too it waits 12 s. The scale-in still waits for its
    streak (and the long cool-down), once."""
    safety = SafetyConfig(cooldown_s=10.0, scale_out_cooldown_s=3.0)
    schedule = [1200.0] * 10 + [3600.0] * 30 + [1200.0] * 30
    c = Ds2Autoscaler({**CONFIG, "cooldown_s": 10.0})
    assert c.config.scale_out_cooldown_s == 3.0
    run = drive(c, A, schedule, safety, contended)
    assert [i for i, _ in run.decisions] == [10, 12, 49]
    assert (run.sizes[10], run.sizes[12], run.sizes[-1]) == ((6, 3), (9, 3), (4, 1))
    slow = Ds2Autoscaler({**CONFIG, "cooldown_s": 10.0, "scale_out_cooldown_s": 10.0})
    assert [i for i, _ in drive(slow, A, schedule, safety, contended).decisions] == [10, 16, 49]
    # Steady speeds: the one-step size holds, the short cool-down adds no decision.
    c = Ds2Autoscaler({**CONFIG, "cooldown_s": 10.0})
    assert [i for i, _ in drive(c, A, schedule, safety).decisions] == [10, 49]


def test_no_scale_in_sooner_than_the_long_cool_down_after_any_change() -> None:
    """A scale-out followed at once by an idle job: the scale-in (a streak of 1 period)
    waits the whole cool-down of 10 s. A scale-in followed at once by a rate step: the
    scale-out waits it too (only a scale-out shortens the cool-down)."""
    c = Ds2Autoscaler({**CONFIG, "scale_in_periods": 1})
    run = drive(c, A, [1200.0] * 10 + [3600.0] + [300.0] * 20)
    assert [i for i, _ in run.decisions] == [10, 16]  # 6 periods: 11.95 s after the outcome
    assert run.sizes[15] == (6, 3) and run.sizes[16] == (1, 1)
    c = Ds2Autoscaler({**CONFIG, "scale_in_periods": 1})
    run = drive(c, at(A, 8, 6), [1000.0] + [3600.0] * 20)
    assert [i for i, _ in run.decisions] == [0, 6]
    assert run.sizes[5] == (2, 1) and run.sizes[6] == (8, 4)


def test_within_the_cool_down_of_a_scale_out_a_decision_only_adds_tasks() -> None:
    """Someone scaled count out to 8 (seen in the view); an overload at split 4 s later is
    met by scaling split out alone (count, which the model would shrink to 3, keeps its
    tasks until the cool-down is over), not before the window holds only the new
    configuration (its 2 s plus a report's second after the change)."""
    c = Ds2Autoscaler(CONFIG)
    assert c.decide(Pipeline(A).period(1200.0, 0.0)) is None
    wide = at(A, 3, 8)
    assert c.decide(Pipeline(wide).period(3600.0, 2.0)) is None  # the change: now
    assert c.cooling(Pipeline(wide).period(3600.0, 4.9)) == "all"
    late = c.decide(Pipeline(wide).period(3600.0, 6.0))
    assert late is not None and parallelism(apply_plan(wide, late)) == (6, 8)
    c = Ds2Autoscaler(CONFIG)
    c.decide(Pipeline(A).period(1200.0, 0.0))
    c.decide(Pipeline(wide).period(3600.0, 2.0))
    after = c.decide(Pipeline(wide).period(3600.0, 12.0))
    assert after is not None and parallelism(apply_plan(wide, after)) == (6, 3)


def changes(sizes: list[tuple[int, int]]) -> list[tuple[int, bool]]:
    """(period, whether it only added tasks) of each change of parallelism in a run."""
    return [
        (i, all(n >= m for n, m in zip(sizes[i], sizes[i - 1], strict=True)))
        for i in range(1, len(sizes))
        if sizes[i] != sizes[i - 1]
    ]


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from([300.0, 1200.0, 2400.0, 3600.0, 6000.0]), st.integers(1, 12)),
        min_size=1,
        max_size=6,
    ),
    speed=st.sampled_from([steady, contended]),
    scale_in_periods=st.integers(1, 4),
)
def test_only_a_scale_out_follows_a_scale_out_before_the_long_cool_down(
    steps: list[tuple[float, int]],
    speed: Callable[[int], float],
    scale_in_periods: int,
) -> None:
    """Whatever the rate steps: two changes of parallelism are at least the short
    cool-down apart (4 s: the second period), and a change that removes tasks, or any
    change after one that did, at least the long one (no flapping)."""
    c = Ds2Autoscaler({**CONFIG, "cooldown_s": 10.0, "scale_in_periods": scale_in_periods})
    rates = [1200.0] * 3 + [rate for rate, n in steps for _ in range(n)]
    found = changes(drive(c, A, rates, split_speed=speed).sizes)
    for (p, grew), (q, grows) in itertools.pairwise(found):
        age = (q - p) * DT - 0.05  # outcomes are known 0.05 s into their period
        assert age >= c.config.scale_out_cooldown_s, found
        if not (grew and grows):
            assert age >= c.config.cooldown_s, found


def _spike(view: View) -> Latency:
    return replace(view.metrics.latency, p99_ms=5 * LIMIT_MS)


@settings(max_examples=40, deadline=None)
@given(
    rate=st.floats(300.0, 5000.0),
    split=st.integers(1, 12),
    noise=st.lists(st.floats(-0.1, 0.1), min_size=40, max_size=40),
)
def test_steady_noisy_load_never_decides_twice(rate: float, split: int, noise: list[float]) -> None:
    """A load that varies by +-10% around a steady rate, from any parallelism that keeps up
    with it: at most one decision (sizing to the load), never a second."""
    split = max(split, int(1.1 * rate / SPLIT_SPEED) + 1)
    count = min(8, int(1.1 * WORDS * rate / COUNT_SPEED) + 1)
    c = Ds2Autoscaler({**CONFIG, "scale_in_periods": 3, "cooldown_s": 4.0})
    run = drive(c, at(A, split, count), [rate * (1 + e) for e in noise])
    assert len(run.decisions) <= 1, (run.decisions, run.sizes)


def test_registered_and_config_checked() -> None:
    assert BUILTINS["ds2_autoscaler"] is Ds2Autoscaler
    c = Ds2Autoscaler()
    assert c.interval_s == 1.0 and c.config.model_target_ms == pytest.approx(500 / P99_OVER_MEAN)
    for bad, fragment in [
        ({"target_utilization": 0}, "config.target_utilization: must be in (0, 1]"),
        ({"scale_out_utilization": 0.5}, "config.scale_out_utilization: must be in [target"),
        ({"overload_periods": 0}, "config.overload_periods: must be >= 1"),
        ({"scale_in_headroom": 1.5}, "config.scale_in_headroom: must be in (0, 1]"),
        ({"backlog_drain_s": 0}, "config.backlog_drain_s: must be > 0"),
        ({"cooldown_s": -1}, "config.cooldown_s: must be >= 0"),
        ({"scale_out_cooldown_s": -1}, "config.scale_out_cooldown_s: must be >= 0"),
        ({"batch_size": 4}, "config.batch_size: must be >= 1 and needs mode 'fluid'"),
        ({"max_tasks": "many"}, "config.max_tasks: expected a number"),
    ]:
        with pytest.raises(ConfigError) as info:
            Ds2Autoscaler(bad)
        assert fragment in str(info.value)


def test_a_source_falling_behind_is_sized_for_what_arrives_not_what_it_delivers() -> None:
    """A throttled generator that cannot deliver its rate reports its backlog as lag: its
    growth per second (records that arrived and could not go out) counts in the rate to
    sustain, so the first decision sizes for the offered rate, not the delivered one."""
    pipeline = Pipeline(at(A, 3, 2))
    c = Ds2Autoscaler({**CONFIG, "backlog_drain_s": 10.0})

    def view(lag: int, now: float) -> View:
        tasks = _tasks(pipeline.period(1000.0, 0.0))
        tasks = [metrics(t, lag=lag) if t.task == "lines-0" else t for t in tasks]
        return view_of(pipeline.a, window(tasks, p99_ms=50.0), now=now)

    first = view(0, 10_000.0)
    assert stages(first.abstraction, first.metrics, Ds2AutoscalerConfig())  # measured
    assert first.metrics.source_lag("lines") == {"lines-0": 0}
    c.decide(first)
    second = view(6_000, 10_000.0 + DT)  # 3,000 records/s more arrived than went out
    behind = c._falling_behind(second)
    assert behind == {"lines": pytest.approx(3000.0)}
    rates = {
        s.operators: s.rates for s in stages(second.abstraction, second.metrics, c.config, behind)
    }
    # 1,000/s delivered + 3,000/s falling behind + 6,000 behind / 10 s.
    assert rates[("split",)]["split"][0] == pytest.approx(1000 + 3000 + 600)
    plan = c.decide(second)
    assert plan is not None
    assert apply_plan(pipeline.a, plan).operator("split").parallelism >= 7


def task_loads(a: Abstraction, loads: dict[int, float]) -> dict[str, float]:
    return {t.id: sum(loads[g] for g in t.workload.key_groups) for t in a.operator("count").tasks}


def test_a_scale_out_spreads_the_measured_load_of_skewed_key_groups() -> None:
    """Hot key groups all on one task: an even split by count leaves most of their load
    there, which the model sized as if it were even; with the measured loads the new
    tasks take enough of the hot groups that no task holds much more than its share."""
    a = at(A, 3, 2)
    owned = {t.id: t.workload.key_groups for t in a.operator("count").tasks}
    hot = set(owned["count-0"][:12])
    loads = {g: 100.0 if g in hot else 1.0 for gs in owned.values() for g in gs}
    group = tuple(a.forward_group("count"))
    even = apply_plan(a, scale_plan(a, {group: 3}, "test"))
    balanced = apply_plan(a, scale_plan(a, {group: 3}, "test", loads={"count": loads}))
    assert balanced.operator("count").parallelism == even.operator("count").parallelism == 3
    share = sum(loads.values()) / 3
    assert max(task_loads(even, loads).values()) > 1.5 * share  # the skew stays
    assert max(task_loads(balanced, loads).values()) <= share + 100.0  # within one group
    assert sorted(g for t in balanced.operator("count").tasks for g in t.workload.key_groups) == (
        sorted(loads)
    )


def test_without_measured_loads_a_scale_out_splits_key_groups_evenly() -> None:
    a = at(A, 3, 2)
    group = tuple(a.forward_group("count"))
    even = apply_plan(a, scale_plan(a, {group: 3}, "test"))
    unmeasured = apply_plan(a, scale_plan(a, {group: 3}, "test", loads={"count": {}}))
    assert unmeasured == even
