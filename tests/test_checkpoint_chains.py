"""What a keyed task captures of each key group at a checkpoint (``GroupChains.plan``):
whole when it has no chain, when its chain is due for compaction, or when what changed is
most of the group; else the keys that changed; nothing when nothing did."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.checkpoints.taking import WHOLE_SHARE, GroupChains, Link

ARRIVALS = {0: 1, 1: 1, 2: 1, 3: 1}


def chains_of(length: int, full_every: int = 8) -> GroupChains:
    """Chains of ``length`` links (one whole, then deltas) for every group of ARRIVALS."""
    chains = GroupChains(full_every)
    for g in ARRIVALS:
        chains.chains[g] = [Link("p", i == 0, 10) for i in range(length)]
        chains.tenure[g] = ARRIVALS[g]
    return chains


def test_a_group_without_a_chain_is_captured_whole_and_an_untouched_one_not_at_all() -> None:
    chains = chains_of(2)
    del chains.chains[3]
    todo = chains.plan(ARRIVALS, {0: {"a"}}, {0: 100, 1: 100, 2: 100, 3: 100})
    assert todo == {0: {"a"}, 3: None}


def test_a_delta_of_most_of_a_group_is_captured_whole_instead() -> None:
    sizes = {0: 100, 1: 100, 2: 3}
    changed = {
        0: {f"k{i}" for i in range(49)},  # under half: a delta
        1: {f"k{i}" for i in range(50)},  # half: whole
        2: {"k0", "k1"},  # 2 of 3 keys
    }
    todo = chains_of(2).plan(ARRIVALS, changed, sizes)
    assert todo == {0: changed[0], 1: None, 2: None}


def test_a_group_emptied_since_its_last_capture_is_captured_whole() -> None:
    assert chains_of(2).plan(ARRIVALS, {0: {"gone"}}, {0: 0}) == {0: None}


@given(
    st.dictionaries(
        st.sampled_from(sorted(ARRIVALS)),
        st.tuples(st.integers(0, 60), st.integers(0, 60)),  # (keys changed, keys in group)
    ),
    st.integers(1, 7),
)
def test_no_delta_ever_holds_whole_share_of_its_group(
    groups: dict[int, tuple[int, int]], length: int
) -> None:
    changed = {g: {f"k{i}" for i in range(n)} for g, (n, _) in groups.items()}
    sizes = {g: size for g, (_, size) in groups.items()}
    todo = chains_of(length).plan(ARRIVALS, changed, sizes)
    for g, keys in todo.items():
        if keys is not None:
            assert 0 < len(keys) < WHOLE_SHARE * sizes[g]
    assert {g for g, keys in changed.items() if keys} <= set(todo)
