"""The checkpoint protocol's state machine (controlplane.coordinator.checkpoint_protocol),
driven with events alone: no workers, no loop, no clock."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.coordinator.checkpoint_protocol import (
    Abandon,
    Abandoned,
    Acked,
    AllowChange,
    Captured,
    ChangeEnded,
    ChangeWanted,
    CheckpointMachine,
    DeleteFiles,
    Discarded,
    Inject,
    JobEnded,
    ManifestWritten,
    Report,
    SavepointRefused,
    SavepointWanted,
    TaskError,
    TaskFinished,
    Tick,
    TimedOut,
    Unpinned,
    WakeAt,
    WriteManifest,
)
from controlplane.coordinator.checkpoint_report import CheckpointKind, CheckpointPolicy
from controlplane.statuses import CheckpointStatus

TASKS = frozenset({"src-0", "count-0", "count-1"})
POLICY = CheckpointPolicy(interval_s=10.0, timeout_s=5.0, retained=2)


def part(*refs: int, task: str = "count-0") -> dict:
    """A task's part whose group 0 chain has links in the checkpoints ``refs``."""
    return {
        "groups": {0: [[f"j/chk-{r}/{task}.part", 0, 10, i == 0, 1] for i, r in enumerate(refs)]}
    }


def of(kind, commands):
    return [c for c in commands if isinstance(c, kind)]


class Run:
    """A machine and a clock, with helpers that play the workers' part."""

    def __init__(self, policy: CheckpointPolicy = POLICY) -> None:
        self.now = 0.0
        self.ids = itertools.count(1)
        self.m = CheckpointMachine("j", policy, self.now)

    def at(self, now: float, event):
        self.now = now
        return self.m.handle(event, now)

    def tick(self, now: float, tasks=TASKS):
        return self.at(now, Tick(next(self.ids), tasks, 7))

    def complete(self, cid: int, now: float, parts: dict | None = None):
        out = []
        for t in sorted(TASKS):
            out += self.at(now, Acked(t, cid, (parts or {}).get(t, {"groups": {}}), 5, 50))
        out += self.at(now, ManifestWritten(cid, f"j/chk-{cid}/_manifest.msgpack"))
        return out


def test_a_checkpoint_starts_when_due_and_completes_once_every_task_acked_and_the_manifest_is_written():
    run = Run()
    assert not of(Inject, run.tick(3.0))
    out = run.tick(10.0)
    (inject,) = of(Inject, out)
    (report,) = [c.report for c in of(Report, out)]
    assert report.status is CheckpointStatus.IN_PROGRESS and report.version == 7
    assert report.tasks == 3
    cid = inject.checkpoint_id
    for t in ["src-0", "count-0"]:
        assert not of(WriteManifest, run.at(11.0, Acked(t, cid, {"groups": {}}, 5, 50)))
    (write,) = of(WriteManifest, run.at(11.5, Acked("count-1", cid, {"groups": {}}, 5, 50)))
    assert set(write.manifest["tasks"]) == TASKS and write.manifest["version"] == 7
    out = run.at(12.0, ManifestWritten(cid, "j/chk-2/_manifest.msgpack"))
    (done,) = [c.report for c in of(Report, out)]
    assert done.status is CheckpointStatus.COMPLETED
    assert (done.bytes, done.full_bytes, done.duration_ms) == (15, 150, 2000.0)
    assert done.path == "j/chk-2/_manifest.msgpack"
    # The next one is due an interval after this one started.
    assert of(WakeAt, out)[-1].at == 20.0
    assert not of(Inject, run.tick(19.0)) and of(Inject, run.tick(20.0))


def test_a_checkpoint_not_complete_within_its_timeout_is_abandoned_and_the_job_goes_on():
    run = Run()
    cid = of(Inject, run.tick(10.0))[0].checkpoint_id
    run.at(11.0, Acked("src-0", cid, {"groups": {}}, 0, 0))
    out = run.at(15.0, TimedOut(cid))
    assert of(Abandon, out) == [Abandon(cid)] and of(Abandoned, out) == [Abandoned(cid)]
    (report,) = [c.report for c in of(Report, out)]
    assert report.status is CheckpointStatus.ABANDONED
    assert "count-0, count-1" in report.error and "5s" in report.error
    # A late ack of it changes nothing; the next one starts when due.
    assert run.at(15.5, Acked("count-0", cid, {"groups": {}}, 0, 0)) == []
    assert of(Inject, run.tick(20.0))


def test_a_task_that_cannot_write_its_part_abandons_the_checkpoint_with_its_error():
    run = Run()
    cid = of(Inject, run.tick(10.0))[0].checkpoint_id
    out = run.at(10.5, TaskError("count-1", cid, "disk full"))
    (report,) = [c.report for c in of(Report, out)]
    assert report.status is CheckpointStatus.ABANDONED and report.error == "task count-1: disk full"


def test_a_manifest_that_cannot_be_written_abandons_the_checkpoint():
    run = Run()
    cid = of(Inject, run.tick(10.0))[0].checkpoint_id
    for t in sorted(TASKS):
        run.at(10.5, Acked(t, cid, {"groups": {}}, 0, 0))
    out = run.at(10.6, ManifestWritten(cid, None, "OSError: read-only"))
    assert of(Abandon, out) and "read-only" in of(Report, out)[0].report.error


def test_retention_keeps_the_last_completed_and_the_files_they_refer_to():
    run = Run(CheckpointPolicy(interval_s=10.0, timeout_s=5.0, retained=2))
    ids = []
    deleted: list[int] = []
    discarded: list[int] = []
    for n in range(4):
        t = 10.0 * (n + 1)
        cid = of(Inject, run.tick(t))[0].checkpoint_id
        ids.append(cid)
        # count-0's group 0 was written whole at the first checkpoint, then deltas.
        parts = {"count-0": part(*ids)}
        out = run.complete(cid, t + 1, parts)
        deleted += [d for c in of(DeleteFiles, out) for d in c.checkpoint_ids]
        discarded += [c.checkpoint_id for c in of(Discarded, out)]
    assert discarded == ids[:2]
    # Every retained checkpoint's chain goes back to the first: nothing can be deleted.
    assert deleted == []
    # Now count-0 writes its group whole: once no retained checkpoint reaches back to
    # the old chain, its checkpoints' files go.
    cid = of(Inject, run.tick(50.0))[0].checkpoint_id
    out = run.complete(cid, 51.0, {"count-0": part(cid)})
    assert not of(DeleteFiles, out)  # the other retained one still refers to them all
    out = run.complete(of(Inject, run.tick(60.0))[0].checkpoint_id, 61.0, {"count-0": part(cid)})
    assert [d for c in of(DeleteFiles, out) for d in c.checkpoint_ids] == ids


def test_an_abandoned_checkpoint_s_files_stay_while_a_later_one_refers_to_them():
    run = Run()
    first = of(Inject, run.tick(10.0))[0].checkpoint_id
    run.complete(first, 11.0, {"count-0": part(first)})
    abandoned = of(Inject, run.tick(20.0))[0].checkpoint_id
    run.at(25.0, TimedOut(abandoned))
    # count-0 wrote its delta for the abandoned one; the next builds on it.
    third = of(Inject, run.tick(30.0))[0].checkpoint_id
    out = run.complete(third, 31.0, {"count-0": part(first, abandoned, third)})
    assert not of(DeleteFiles, out)
    # Once the retained ones no longer reach back to them, the files go.
    fourth = of(Inject, run.tick(40.0))[0].checkpoint_id
    assert not of(DeleteFiles, run.complete(fourth, 41.0, {"count-0": part(fourth)}))
    fifth = of(Inject, run.tick(50.0))[0].checkpoint_id
    out = run.complete(fifth, 51.0, {"count-0": part(fourth, fifth)})
    assert [d for c in of(DeleteFiles, out) for d in c.checkpoint_ids] == [first, abandoned, third]


def test_a_reconfiguration_goes_ahead_at_once_when_no_capture_is_under_way():
    run = Run()
    assert of(AllowChange, run.at(5.0, ChangeWanted()))
    assert not of(Inject, run.tick(10.0))  # none starts while the change holds the job
    run.at(12.0, ChangeEnded())
    assert of(Inject, run.tick(12.0))  # it came due meanwhile: at the next tick


def test_a_reconfiguration_waits_for_the_captures_then_the_checkpoint_completes_beside_it():
    run = Run()
    cid = of(Inject, run.tick(10.0))[0].checkpoint_id
    run.at(10.1, Captured("count-0", cid))
    assert not of(AllowChange, run.at(10.2, ChangeWanted()))
    run.at(10.3, Acked("src-0", cid, {"groups": {}}, 0, 0))
    assert of(AllowChange, run.at(10.4, Captured("count-1", cid)))
    out = run.complete(cid, 10.5)
    assert of(Report, out)[-1].report.status is CheckpointStatus.COMPLETED


def test_a_reconfiguration_abandons_a_checkpoint_whose_capture_takes_too_long():
    run = Run()
    cid = of(Inject, run.tick(10.0))[0].checkpoint_id
    out = run.at(10.2, ChangeWanted())
    assert not of(AllowChange, out)
    assert of(WakeAt, out)[-1].at == 11.2  # capture_wait_s after the change asked
    assert not of(AllowChange, run.tick(10.9))
    out = run.tick(11.2)
    assert of(Abandon, out) == [Abandon(cid)] and of(AllowChange, out)
    assert "reconfiguration went first" in of(Report, out)[0].report.error


def test_a_finished_task_abandons_the_checkpoint_in_flight_and_no_more_start():
    run = Run()
    cid = of(Inject, run.tick(10.0))[0].checkpoint_id
    out = run.at(10.5, TaskFinished("src-0"))
    assert of(Abandon, out) == [Abandon(cid)]
    assert not of(Inject, run.tick(20.0))


def test_a_job_that_ends_abandons_its_checkpoint_and_wants_no_more_ticks():
    run = Run()
    cid = of(Inject, run.tick(10.0))[0].checkpoint_id
    out = run.at(11.0, JobEnded("stopped"))
    assert of(Abandon, out) == [Abandon(cid)] and of(WakeAt, out)[-1].at is None
    assert run.m.wake_at is None and not of(Inject, run.tick(30.0))


def savepoint_started(run: Run, now: float) -> tuple[int, list]:
    out = run.tick(now)
    (inject,) = of(Inject, out)
    (report,) = [c.report for c in of(Report, out)]
    assert report.kind is CheckpointKind.SAVEPOINT
    return inject.checkpoint_id, out


def test_a_savepoint_is_asked_for_at_once_and_does_not_move_the_checkpoints_timer():
    run = Run()
    out = run.at(3.0, SavepointWanted())
    assert of(WakeAt, out)[-1].at == 3.0  # a tick now, not when a checkpoint is due
    sid, _ = savepoint_started(run, 3.0)
    out = run.complete(sid, 4.0, {"count-0": part(sid)})
    (done,) = [c.report for c in of(Report, out)]
    assert done.status is CheckpointStatus.COMPLETED and done.kind is CheckpointKind.SAVEPOINT
    assert of(WakeAt, out)[-1].at == 10.0  # the first checkpoint is due as before
    assert of(Inject, run.tick(10.0))
    write = of(WriteManifest, run.complete(sid + 1, 10.5))
    assert write[0].manifest["kind"] == "checkpoint"


def test_a_savepoint_queues_behind_the_checkpoint_in_flight_and_a_change():
    run = Run()
    cid = of(Inject, run.tick(10.0))[0].checkpoint_id
    out = run.at(10.1, SavepointWanted())
    assert not of(SavepointRefused, out) and not of(Inject, run.tick(10.2))
    out = run.complete(cid, 10.5)
    assert of(WakeAt, out)[-1].at == 10.5  # right after it
    run.at(10.6, ChangeWanted())  # a reconfiguration takes the job first
    assert not of(Inject, run.tick(10.7))
    run.at(12.0, ChangeEnded())
    sid, out = savepoint_started(run, 12.0)
    assert sid > cid
    assert of(SavepointRefused, run.at(12.1, SavepointWanted()))  # one at a time


def test_a_savepoint_is_refused_once_tasks_finish_or_the_job_ends():
    run = Run()
    run.at(1.0, SavepointWanted())
    (refused,) = of(SavepointRefused, run.at(1.1, TaskFinished("src-0")))
    assert "src-0 finished" in refused.reason
    assert "finishing job" in of(SavepointRefused, run.at(2.0, SavepointWanted()))[0].reason
    run = Run()
    run.at(1.0, SavepointWanted())
    assert "ended" in of(SavepointRefused, run.at(1.1, JobEnded("stopped")))[0].reason


def test_a_savepoint_is_never_discarded_nor_its_files_removed_until_unpinned():
    run = Run(CheckpointPolicy(interval_s=10.0, timeout_s=5.0, retained=1))
    first = of(Inject, run.tick(10.0))[0].checkpoint_id
    run.complete(first, 10.5, {"count-0": part(first)})
    run.at(11.0, SavepointWanted())
    sid, _ = savepoint_started(run, 11.0)
    run.complete(sid, 11.5, {"count-0": part(first, sid)})
    deleted: list[int] = []
    discarded: list[int] = []
    for n in range(2, 5):  # checkpoints whose group 0 is whole again: no need of first
        cid = of(Inject, run.tick(10.0 * n))[0].checkpoint_id
        out = run.complete(cid, 10.0 * n + 1, {"count-0": part(cid)})
        deleted += [d for c in of(DeleteFiles, out) for d in c.checkpoint_ids]
        discarded += [c.checkpoint_id for c in of(Discarded, out)]
    assert sid not in discarded and first in discarded
    assert first not in deleted and sid not in deleted  # the savepoint reads both
    run.at(45.0, Unpinned(sid))
    cid = of(Inject, run.tick(50.0))[0].checkpoint_id
    out = run.complete(cid, 51.0, {"count-0": part(cid)})
    assert {first, sid} <= {d for c in of(DeleteFiles, out) for d in c.checkpoint_ids}


def test_adopted_savepoints_stay_pinned():
    run = Run(CheckpointPolicy(interval_s=10.0, timeout_s=5.0, retained=1))
    manifest = {"checkpoint_id": 7, "tasks": {"count-0": part(5, 7)}}
    savepoint = {"checkpoint_id": 6, "tasks": {"count-0": part(3, 6)}}
    run.m.adopt(manifest, {3, 4, 5, 6, 7}, [savepoint])
    run.ids = itertools.count(8)
    cid = of(Inject, run.tick(10.0))[0].checkpoint_id
    out = run.complete(cid, 11.0, {"count-0": part(cid)})
    assert of(DeleteFiles, out) == [DeleteFiles((4, 5, 7))]  # 3 and 6: the savepoint's
    run.at(12.0, Unpinned(6))
    cid = of(Inject, run.tick(20.0))[0].checkpoint_id
    out = run.complete(cid, 21.0, {"count-0": part(cid)})
    assert of(DeleteFiles, out) == [DeleteFiles((3, 6, 8))]


EVENTS = st.lists(
    st.tuples(
        st.floats(0.0, 4.0),
        st.sampled_from(
            [
                "tick",
                "captured",
                "ack",
                "error",
                "timeout",
                "manifest",
                "want",
                "end_change",
                "finish",
                "savepoint",
                "unpin",
            ]
        ),
        st.sampled_from(sorted(TASKS)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_checkpoints_never_overlap_never_interleave_with_a_change_and_keep_what_retained_ones_need(
    events,
):
    run = Run(CheckpointPolicy(interval_s=3.0, timeout_s=5.0, retained=2))
    now = 0.0
    flight: int | None = None
    changing = waiting = False
    ended: set[int] = set()
    retained: dict[int, set[int]] = {}
    chains: dict[int, set[int]] = {}  # checkpoint -> the checkpoints its parts refer to
    deleted: set[int] = set()
    pinned: dict[int, set[int]] = {}  # completed savepoints -> what they refer to
    last_full: int | None = None
    for dt, kind, task in events:
        now += dt
        cid = flight if flight is not None else 0
        event = {
            "tick": Tick(next(run.ids), TASKS, 1),
            "captured": Captured(task, cid),
            "ack": None,
            "error": TaskError(task, cid, "boom"),
            "timeout": TimedOut(cid),
            "manifest": ManifestWritten(cid, "p"),
            "want": ChangeWanted(),
            "end_change": ChangeEnded(),
            "finish": TaskFinished(task),
            "savepoint": SavepointWanted(),
            "unpin": Unpinned(min(pinned, default=0)),
        }[kind]
        if kind == "ack":
            refs = [last_full, cid] if last_full is not None and task != "src-0" else [cid]
            event = Acked(task, cid, part(*refs, task=task), 1, 2)
            chains.setdefault(cid, set()).update(refs)
        if kind == "want" and (changing or waiting):
            continue  # one change at a time holds the job (the slot's lock)
        if kind == "end_change" and not changing:
            continue
        if kind == "want":
            waiting = True
        if kind == "unpin":
            pinned.pop(event.checkpoint_id, None)  # type: ignore[union-attr]
        out = run.at(now, event)
        for c in out:
            match c:
                case Inject(checkpoint_id=i):
                    assert flight is None and not changing and not waiting
                    flight = i
                case Report(report=r) if r.status is CheckpointStatus.COMPLETED:
                    assert r.id == flight and r.id not in ended
                    ended.add(r.id)
                    refs = chains.get(r.id, set()) | {r.id}
                    if r.kind is CheckpointKind.SAVEPOINT:
                        pinned[r.id] = refs
                    else:
                        retained[r.id] = refs
                    last_full = r.id if len(retained) % 2 else last_full
                    flight = None
                case Abandoned(checkpoint_id=i):
                    assert i == flight and i not in ended
                    ended.add(i)
                    flight = None
                case Discarded(checkpoint_id=i):
                    assert i not in pinned  # a savepoint is never discarded
                    del retained[i]
                case DeleteFiles(checkpoint_ids=ids):
                    for i in ids:
                        assert all(i not in refs for refs in retained.values())
                        assert all(i not in refs for refs in pinned.values())
                        assert i not in deleted
                    deleted.update(ids)
                case AllowChange():
                    assert waiting
                    waiting, changing = False, True
        if kind == "tick" and not of(Inject, out):  # a declined tick never spins the timer
            assert all(w.at is None or w.at > now for w in of(WakeAt, out)), out
        if kind == "end_change":
            changing = False
        assert len(retained) <= 2
        if waiting:  # a waiting change is let go once the capture is over or it waited long
            assert flight is not None
