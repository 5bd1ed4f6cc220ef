"""A seeded random schedule of live plans and worker kills on a bounded word count: its
output, read from the committed sink files, is the reference, every (word, running
count) once.

A seeded generator (``random.Random(seed)``: the same schedule every run) picks each
action: a plan (scale, rebalance, migrate, a change of logic; key-group moves in pause
or fluid mode), a worker of the job SIGKILLed while it runs, or a plan with a worker of
the job SIGKILLed as the plan enters a phase it picks (prepare, sync, update). Between
two actions the job makes progress: a checkpoint started after the action completes
(after a kill, that is after the recovery). Each plan not interrupted completes; each
kill ends in a recovery. The job recovers as often as it needs (its restart policy is
generous); lost workers are replaced by spares or new ones from the backend.

The cluster is the module's own: 3 local workers at the start of each schedule.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controlplane.abstraction import migrate, rebalance, scale, update_logic
from controlplane.coordinator.checkpoint_report import RestartPolicy
from controlplane.statuses import JobStatus
from controlplane.statuses import ReconfigurationStatus as Status
from controlplane.testing import BackgroundCluster
from runtime.sinks import read_parts
from tests.faults_support import (
    Events,
    apply_killing,
    assert_exact,
    finish_job,
    kill,
    start_job,
    wait_for_progress,
    wordcount_job,
    wordcount_reference,
)

pytestmark = pytest.mark.slow

ACTIONS = 8  # per schedule: a minute or so on a loaded 2-core machine
PARAMS = {"records": 16_000, "rate": 1_000, "keys": 2_000, "seed": 5}  # 128,000 words
GENEROUS = RestartPolicy(max_failures=20, window_s=300)
LOGIC = ("examples.wordcount:count_word_v2", "examples.wordcount:count_word_v3")
PHASES = (Status.PREPARING, Status.SYNCING, Status.UPDATING)


@pytest.fixture(scope="module")
def expected() -> list[tuple[str, int]]:
    return wordcount_reference(PARAMS)


def random_plan(rng: random.Random, a: Any, alive: list[str]) -> tuple[str, Any]:
    """A plan of a kind ``rng`` picks, on abstraction ``a``; half of those that move key
    groups in fluid mode, in batches of 4 or 16."""
    count = a.operator("count")
    kind = rng.choice(["scale", "rebalance", "migrate", "logic"])
    if kind == "scale":
        plan = scale(a, "count", rng.choice([n for n in (1, 2, 3) if n != len(count.tasks)]))
    elif kind == "rebalance":
        loads = {g: rng.random() for t in count.tasks for g in t.workload.key_groups}
        plan = rebalance(a, "count", loads)
    elif kind == "migrate":
        task = rng.choice(count.tasks)
        others = [w for w in alive if w != task.resources.worker]
        if not others:
            return "migrate (nowhere to go)", None
        plan = migrate(a, task.id, rng.choice(others), with_forward=True)
    else:
        current = {t.logic.ref for t in count.tasks}
        plan = update_logic(a, "count", rng.choice([r for r in LOGIC if r not in current]))
    if kind != "logic" and rng.random() < 0.5:
        kind, plan = f"{kind} (fluid)", replace(plan, mode="fluid", batch_size=rng.choice([4, 16]))
    return kind, plan


class Schedule:
    """Runs a job's schedule on a cluster; ``log`` says what was done, for failures."""

    def __init__(
        self, cluster: BackgroundCluster, events: Events, job: Any, rng: random.Random
    ) -> None:
        self.cluster, self.events, self.job, self.rng = cluster, events, job, rng
        self.co = cluster.coordinator
        self.log: list[str] = []

    def progressed(self, what: str, victim: str | None = None) -> None:
        """Wait for a checkpoint started after now to complete (see
        :func:`tests.faults_support.wait_for_progress`)."""
        wait_for_progress(self.cluster, self.events, self.job, what, self.log, victim)

    def kill(self) -> None:
        victim = self.rng.choice(self.job.layout.workers_used())
        self.log.append(f"kill {victim}")
        kill(self.co.workers[victim].pid)
        self.progressed("a kill", victim)

    def plan(self, phase: Status | None) -> None:
        alive = [w.id for w in self.co.alive_workers()]
        kind, plan = random_plan(self.rng, self.co.current_abstraction(self.job.id), alive)
        if plan is None or not plan.ops:
            self.log.append(f"{kind}: nothing to do")
            return
        victim = self.rng.choice(self.job.layout.workers_used()) if phase else None
        self.log.append(f"{kind}" + (f", killing {victim} as it is {phase}" if phase else ""))
        if apply_killing(self.cluster, self.job, plan, victim, phase, self.log):
            self.progressed(kind, victim)
        else:
            self.progressed(kind)

    def run(self, actions: int) -> None:
        for _ in range(actions):
            action = self.rng.choice(["plan", "plan", "kill", "plan and kill"])
            if action == "kill":
                self.kill()
            else:
                self.plan(self.rng.choice(PHASES) if action == "plan and kill" else None)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_seeded_schedule_of_plans_and_kills_keeps_the_word_count_exact(
    faults: BackgroundCluster,
    fault_events: Events,
    tmp_path: Path,
    held_end: Path,
    expected: list,
    seed: int,
) -> None:
    out = tmp_path / "out"
    graph = wordcount_job(PARAMS, out, held_end)
    job, _, _ = start_job(faults, fault_events, graph, restart=GENEROUS)
    schedule = Schedule(faults, fault_events, job, random.Random(seed))
    schedule.run(ACTIONS)
    assert any(entry.startswith("kill") or "killing" in entry for entry in schedule.log)
    assert job.status == JobStatus.RUNNING, (job.status, job.error, schedule.log)
    finish_job(faults, job, held_end)
    assert_exact(read_parts(out), expected)
