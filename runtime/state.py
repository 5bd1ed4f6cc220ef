"""Keyed state, held per key group so that a key group's state moves as a unit.

A keyed task holds a :class:`KeyedState`: for each key group it owns, a dict from key to
value. The runtime binds one reusable :class:`ValueState` to the current key before each
call of a keyed UDF. A key group's state exports to bytes (pickle) and imports elsewhere; the reconfiguration protocol ships these bytes worker to
worker.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

from .errors import StreamRuntimeError

__all__ = ["TIMERS", "KeyGroupNotOwnedError", "KeyedState", "ValueState"]

_MISSING = object()

SIZE_SAMPLE = 4  # keys of a key group pickled to estimate its bytes per key
SIZE_REFRESH = 8  # key groups whose bytes per key a size report re-estimates (in turn)
_EMPTY_DICT = len(pickle.dumps({}, protocol=5))


class _TimersKey:
    """The type of :data:`TIMERS`: one instance, which unpickles as itself."""

    _instance: _TimersKey | None = None

    def __new__(cls) -> _TimersKey:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self) -> str:
        return "TIMERS"

    def __repr__(self) -> str:
        return "TIMERS"


TIMERS = _TimersKey()
"""The key of a key group's :class:`runtime.timers.TimerTable` in its key -> value dict (no user key
equals it)."""


class KeyGroupNotOwnedError(StreamRuntimeError, KeyError):
    """A record or state operation for a key group this task does not own."""

    def __init__(self, task: str, group: int) -> None:
        super().__init__(f"task {task!r} does not own key group {group}")


class ValueState:
    """The state of one key, as seen by a keyed UDF: ``get``, ``set``, ``clear``.

    Only valid during the UDF call it was passed to (the runtime rebinds it per record).
    """

    __slots__ = ("_key", "_store")

    def __init__(self) -> None:
        self._store: dict = {}
        self._key: Any = None

    def get(self, default: Any = None) -> Any:
        return self._store.get(self._key, default)

    def set(self, value: Any) -> None:
        self._store[self._key] = value

    def clear(self) -> None:
        self._store.pop(self._key, None)

    @property
    def key(self) -> Any:
        return self._key


_arrivals = itertools.count(1)


class KeyedState:
    """The state of the key groups one task owns (in memory).

    ``arrivals`` numbers each group's current tenure: a group gets a new number (never
    used before, in this process) whenever it comes to this task with state from
    elsewhere or leaves it, so that whoever remembers something of a group (the
    checkpoint chains of :mod:`runtime.checkpoints.taking`) can tell that the group it
    sees now is not the one it remembers."""

    def __init__(self, task: str, groups: Iterable[int] = ()) -> None:
        self.task = task
        self._groups: dict[int, dict] = {g: {} for g in groups}
        self.arrivals: dict[int, int] = {g: next(_arrivals) for g in self._groups}
        self._per_key: dict[int, float] = {}  # key group -> estimated pickled bytes per key
        self._turn = 0  # where the next size report starts re-estimating
        self._sizes: dict[int, int] = {}  # key group -> estimated bytes, as of the last size()

    def owned(self) -> list[int]:
        return sorted(self._groups)

    def owns(self, group: int) -> bool:
        return group in self._groups

    def group(self, group: int) -> dict:
        """The key -> value dict of ``group``; raises if the group is not owned."""
        try:
            return self._groups[group]
        except KeyError:
            raise KeyGroupNotOwnedError(self.task, group) from None

    def groups(self) -> dict[int, dict]:
        """The live mapping group -> store (for the task's hot loop)."""
        return self._groups

    def add_group(self, group: int) -> None:
        """Start owning ``group`` with empty state (no-op if already owned)."""
        if group not in self._groups:
            self._groups[group] = {}
            self.arrivals[group] = next(_arrivals)

    def export_group(self, group: int) -> bytes:
        """The state of ``group`` as bytes (the group stays owned).

        Pickled (protocol 5), so values come back exactly as they were: lists stay lists,
        namedtuples and defaultdicts keep their type. Bytes travel only between workers of
        one cluster, which authenticate each other with the cluster secret.
        """
        return pickle.dumps(self.group(group), protocol=5)

    def import_group(self, group: int, data: bytes | bytearray | memoryview) -> None:
        """Own ``group`` with the state in ``data`` (from :meth:`export_group`), replacing any."""
        state = pickle.loads(data)
        if not isinstance(state, dict):
            raise ValueError(
                f"task {self.task!r}: state of key group {group} is not a key -> value map"
            )
        self._groups[group] = state
        self.arrivals[group] = next(_arrivals)

    def take_in(self, group: int, data: bytes | bytearray | memoryview | dict | Exception) -> None:
        """Own ``group`` with state handed over by its previous owner: bytes exported on
        another worker (:meth:`import_group`), or its key -> value dict as is (same
        worker: no copy, or brought up to date from a copy made ahead). An exception in
        place of the state (it could not be put together on arrival) is raised."""
        if isinstance(data, BaseException):
            raise data
        if isinstance(data, bytes | bytearray | memoryview):
            self.import_group(group, data)
        else:
            self._groups[group] = data
            self.arrivals[group] = next(_arrivals)

    def drop_group(self, group: int) -> None:
        """Stop owning ``group`` and forget its state."""
        self._groups.pop(group, None)
        self.arrivals.pop(group, None)

    def size(self, refresh: int = SIZE_REFRESH) -> tuple[int, int | None]:
        """(keys, estimated bytes) of the state: what moving all of it would ship (each
        key group's share: :meth:`group_sizes`, after this call).

        Each key group's bytes per key are estimated by pickling a few of its entries;
        a call re-estimates at most ``refresh`` groups (those never estimated first, then
        the others in turn), so its cost stays small however large the state; a group not
        estimated yet counts at the mean of those that are. Bytes are None when a sample
        does not pickle (such state could not move either)."""
        groups = self._groups
        for g in [g for g in self._per_key if g not in groups]:
            del self._per_key[g]
        owned = sorted(g for g, store in groups.items() if store)
        known = [g for g in owned if g in self._per_key]
        start = self._turn % len(known) if known else 0
        todo = [g for g in owned if g not in self._per_key] + known[start:] + known[:start]
        for g in todo[:refresh]:
            store = groups[g]
            sample = dict(itertools.islice(store.items(), SIZE_SAMPLE))
            try:
                pickled = len(pickle.dumps(sample, protocol=5))
            except Exception:  # a lock, a socket, a lambda... in the user's state
                self._sizes = {}
                return sum(len(store) for store in groups.values()), None
            self._per_key[g] = (pickled - _EMPTY_DICT) / len(sample)
        self._turn = start + max(refresh - (len(todo) - len(known)), 0)
        per_key = [self._per_key[g] for g in owned if g in self._per_key]
        mean = sum(per_key) / len(per_key) if per_key else 0.0
        keys = est = 0
        self._sizes = dict.fromkeys(groups, 0)  # an empty group ships next to nothing
        for g in owned:
            n = len(groups[g])
            keys += n
            self._sizes[g] = int(n * self._per_key.get(g, mean) + _EMPTY_DICT)
            est += self._sizes[g]
        return keys, est

    def group_sizes(self) -> dict[int, int]:
        """Each owned key group's estimated bytes (0 when empty), as the last :meth:`size`
        call estimated them (they add up to its bytes)."""
        return {g: n for g, n in self._sizes.items() if g in self._groups}

    def items(self) -> Iterator[tuple[int, Any, Any]]:
        """Every (group, key, value), groups in order (timers, under :data:`TIMERS`, left
        out)."""
        for g in sorted(self._groups):
            for k, v in self._groups[g].items():
                if k is not TIMERS:
                    yield g, k, v

    def __len__(self) -> int:
        return sum(len(s) - (TIMERS in s) for s in self._groups.values())
