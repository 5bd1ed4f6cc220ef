"""runtime.reconfigure.task_role: a task's role in a change, from its arguments alone.

Every combination of where the task was and will be (here, elsewhere, nowhere), whether
the change only syncs it or keeps it running in place, the mode and whether it is keyed:
the role is the one the worker's update must play, in the order of precedence the update
relies on (a task that only syncs never moves state; one updated in place never stops).
"""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from runtime.layout import Layout
from runtime.reconfigure import Role, task_role

HERE, THERE = "w-here", "w-there"
TID = "count-0"

where = st.sampled_from([HERE, THERE, None])  # None: not in that layout


def layout(worker: str | None) -> Layout:
    placement = {"split-0": HERE}
    if worker is not None:
        placement[TID] = worker
    return Layout(placement)


@given(
    before=where,
    after=where,
    sync_only=st.booleans(),
    in_place=st.booleans(),
    fluid=st.booleans(),
    keyed=st.booleans(),
)
def test_the_role_follows_the_placement_and_the_change(
    before: str | None,
    after: str | None,
    sync_only: bool,
    in_place: bool,
    fluid: bool,
    keyed: bool,
) -> None:
    assume(HERE in (before, after))  # a worker is only asked about its own tasks
    role = task_role(
        TID,
        HERE,
        layout(before),
        layout(after),
        sync_only={TID} if sync_only else set(),
        in_place={TID} if in_place else set(),
        fluid=fluid,
        keyed=keyed,
    )
    if sync_only:
        assert role is Role.SYNC_ONLY
    elif in_place:
        assert role is Role.IN_PLACE
    elif before == HERE and after != HERE:
        assert role is Role.LEAVES
    elif after == HERE and before != HERE:
        assert role is (Role.ARRIVES_LIVE if fluid and keyed else Role.ARRIVES)
    else:
        assert (before, after) == (HERE, HERE)
        assert role is Role.STAYS


def test_only_its_own_task_and_worker_count() -> None:
    """Another task's membership of the sets, or the same task on another worker, does not
    change the role."""
    old, new = layout(HERE), layout(THERE)
    others = {"split-0"}
    assert (
        task_role(TID, HERE, old, new, sync_only=others, in_place=others, fluid=False, keyed=True)
        is Role.LEAVES
    )
    assert (
        task_role(TID, THERE, old, new, sync_only=set(), in_place=set(), fluid=True, keyed=True)
        is Role.ARRIVES_LIVE
    )
