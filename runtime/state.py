"""Keyed state, held per key group so that a key group's state moves as a unit.

A keyed task holds a :class:`KeyedState`: for each key group it owns, a dict from key to
value. The runtime binds one reusable :class:`ValueState` to the current key before each
call of a keyed UDF. A key group's state exports to bytes (pickle) and imports elsewhere; the reconfiguration protocol ships these bytes worker to
worker.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["KeyGroupNotOwnedError", "KeyedState", "ValueState"]

_MISSING = object()


class KeyGroupNotOwnedError(KeyError):
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


class KeyedState:
    """The state of the key groups one task owns (in memory)."""

    def __init__(self, task: str, groups: Iterable[int] = ()) -> None:
        self.task = task
        self._groups: dict[int, dict] = {g: {} for g in groups}

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
        self._groups.setdefault(group, {})

    def export_group(self, group: int) -> bytes:
        """The state of ``group`` as bytes (the group stays owned).

        Pickled (protocol 5), so values come back exactly as they were: lists stay lists,
        namedtuples and defaultdicts keep their type. Bytes travel only between workers of
        one cluster, which authenticate each other with the cluster secret.
        """
        return pickle.dumps(self.group(group), protocol=5)

    def import_group(self, group: int, data: bytes | bytearray) -> None:
        """Own ``group`` with the state in ``data`` (from :meth:`export_group`), replacing any."""
        state = pickle.loads(data)
        if not isinstance(state, dict):
            raise ValueError(
                f"task {self.task!r}: state of key group {group} is not a key -> value map"
            )
        self._groups[group] = state

    def take_in(self, group: int, data: bytes | bytearray | dict) -> None:
        """Own ``group`` with state handed over by its previous owner: bytes exported on
        another worker (:meth:`import_group`), or its key -> value dict as is (same
        worker: no copy)."""
        if isinstance(data, bytes | bytearray):
            self.import_group(group, data)
        else:
            self._groups[group] = data

    def drop_group(self, group: int) -> None:
        """Stop owning ``group`` and forget its state."""
        self._groups.pop(group, None)

    def items(self) -> Iterator[tuple[int, Any, Any]]:
        """Every (group, key, value), groups in order."""
        for g in sorted(self._groups):
            for k, v in self._groups[g].items():
                yield g, k, v

    def __len__(self) -> int:
        return sum(len(s) for s in self._groups.values())
