"""Pre-copy: a key group's state copied ahead to its new owner's worker while its task
still runs, so that the update ships only what changed since.

Live migration of virtual machines copies memory ahead and then re-sends only the pages
written meanwhile; Rhino (SIGMOD 2020) moves stream state ahead of a handover the same
way. Here, once a reconfiguration is prepared (see :mod:`runtime.deployment`), a task
whose key groups leave for a task on another worker copies each of them ahead, coldest
first, between its batches, and from then on notes the keys its records touch
(:meth:`runtime.operators.KeyedProcessor.track`). Its update then ships a *delta* per
group, the touched keys' values and the keys that are gone, instead of the whole group:
the task pauses for that, not for all of its state.

A key touched since its copy is sent again, and with it its whole value: state where
every key is hot would be sent twice. Large immutable objects (``bytes`` and ``str`` of
at least :data:`SHARE_MIN_BYTES`) that the copy already holds are not: the delta refers
to them by their place in the copy. A value ``(count, payload)`` whose count changes
while its payload stays the same object costs a few bytes. Only immutable objects are
shared: a list or dict changed in place is always sent whole, so sharing can never bring
back an old value.

How sharing works: pickle numbers the objects it writes (its memo) in the same order on
both sides, each new object taking the next number. The sender keeps, by number, the
base's shareable objects and stand-ins for the others (so that both memos are as long and
the delta's new objects take the same numbers on both sides); the receiver keeps its
unpickler's memo. The delta is pickled with the former and read with the latter, in
pickle protocol 3, which gives each new object's number in the stream (protocols 4 and 5
leave it to the reader's count, which a memo handed to an unpickler does not set). A
delta starts with one byte that says whether it was pickled so (``M``) or plainly
(``P``, protocol 5: nothing to share).

The four functions are the whole format; they are pure (no I/O):
:func:`export_base` / :func:`load_base` for the copy ahead, :func:`export_delta` /
:func:`apply_delta` for what changed.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from typing import Any

__all__ = [
    "MEMO_MAX_OBJECTS",
    "SHARE_MIN_BYTES",
    "apply_delta",
    "export_base",
    "export_delta",
    "load_base",
    "parse_part",
    "part_name",
]

SHARE_MIN_BYTES = 256  # smaller objects are cheaper to send again than to refer to
# A group's copy with more objects than this is not shared from: its table would cost
# more memory and time (a Python loop over it) than re-sending its touched keys.
MEMO_MAX_OBJECTS = 200_000

_SHAREABLE = (bytes, str)


def part_name(kind: str, group: int) -> str:
    """The handover part a copy ahead (``base``) or a delta (``delta``) travels as."""
    return f"{kind}:{group}"


def parse_part(part: Any) -> tuple[str, int] | None:
    """(kind, key group) of a part named by :func:`part_name`; None for any other part."""
    if not isinstance(part, str) or ":" not in part:
        return None
    kind, group = part.split(":", 1)
    return kind, int(group)


def _shareable(obj: Any) -> bool:
    return type(obj) in _SHAREABLE and len(obj) >= SHARE_MIN_BYTES


class _Pieces(list):
    """A binary file that keeps what is written to it as the pieces it came in (the
    pickler writes a frame of about 64 KB at a time), to go out as they are
    (``handover.send_state`` takes a list). Growing one buffer instead copied it at each
    growth and left it in memory the process had just given back: on a busy sending
    worker at 100 MB (``bench/reconfig.py``, migrate a task, 6 rounds each way) the
    copy's time on the worker's loop went from 107-137 ms to 86-102 ms, and its page
    faults from a median of about 3,800 to 1,800.

    The pickler hands a large ``bytes`` or ``bytearray`` value over as the object itself
    rather than framing a copy: a ``bytes`` is kept as it is (it cannot change), anything
    else is copied, so that the task may change or resize it while its copy is sent."""

    def write(self, data: Any) -> int:
        piece = data if type(data) is bytes else bytes(data)
        self.append(piece)
        return len(piece)


def export_base(store: dict) -> tuple[list[bytes], dict | None]:
    """``store`` pickled (as :meth:`runtime.state.KeyedState.export_group` does), as
    pieces whose concatenation is the pickle (:func:`load_base` reads either), and the
    memo :func:`export_delta` needs later (None: nothing to share). Call it and start
    noting touched keys with no ``await`` in between, so that nothing is missed."""
    pieces = _Pieces()
    pickler = pickle.Pickler(pieces, protocol=5)
    pickler.dump(store)
    entries = pickler.memo.copy()  # id -> (number, object)
    memo: dict | None = None
    if len(entries) <= MEMO_MAX_OBJECTS and any(_shareable(o) for _, o in entries.values()):
        memo = {}
        for n, obj in entries.values():
            kept = obj if _shareable(obj) else object()  # a stand-in keeps the number taken
            memo[id(kept)] = (n, kept)
    return list(pieces), memo


class _ViewReader:
    """A binary file that reads a buffer in place, for an unpickler. ``io.BytesIO`` would
    first copy the buffer whole: into fresh memory each time, since what is unpickled
    takes the memory the last copy freed (see ``protocol.PayloadPool``)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._view = memoryview(data).cast("B")
        self._at = 0

    def read(self, n: int = -1) -> bytes:
        start = self._at
        self._at = len(self._view) if n < 0 else min(len(self._view), start + n)
        return self._view[start : self._at].tobytes()

    def readline(self) -> bytes:
        start = self._at
        view = self._view
        while self._at < len(view):
            self._at += 1
            if view[self._at - 1] == 0x0A:
                break
        return view[start : self._at].tobytes()


def load_base(data: bytes | bytearray | memoryview | list[bytes]) -> tuple[dict, Any]:
    """The store a copy ahead holds (as it came, or the pieces :func:`export_base` gave),
    and what :func:`apply_delta` needs to read its delta."""
    if isinstance(data, list):
        data = b"".join(data)
    unpickler = pickle.Unpickler(_ViewReader(data))
    store = unpickler.load()
    if not isinstance(store, dict):
        raise ValueError("a key group's copy ahead is not a key -> value map")
    return store, unpickler.memo


def export_delta(store: dict, touched: Iterable[Any], memo: dict | None) -> bytes:
    """What changed in ``store`` since :func:`export_base`, given the keys touched since
    (``(changed, removed)``, pickled sharing what the base holds)."""
    changed, removed = {}, []
    for key in touched:
        if key in store:
            changed[key] = store[key]
        else:
            removed.append(key)
    buf = io.BytesIO()
    buf.write(b"P" if memo is None else b"M")
    pickler = pickle.Pickler(buf, protocol=5 if memo is None else 3)
    if memo is not None:
        pickler.memo = memo
    pickler.dump((changed, removed))
    return buf.getvalue()


def apply_delta(store: dict, memo: Any, data: bytes | bytearray | memoryview) -> dict:
    """``store`` (from :func:`load_base`) brought up to date with a delta; returns it."""
    view = memoryview(data).cast("B")
    unpickler = pickle.Unpickler(_ViewReader(view[1:]))
    if view[:1] == b"M":
        unpickler.memo = memo  # a copy: the numbers the delta adds do not reach the base's
    changed, removed = unpickler.load()
    store.update(changed)
    for key in removed:
        store.pop(key, None)
    return store
