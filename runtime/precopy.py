"""Pre-copy: a key group's state copied ahead to its new owner's worker while its task
still runs, so that the update ships only what changed since.

Live migration of virtual machines copies memory ahead and then re-sends only the pages
written meanwhile; Rhino (SIGMOD 2020) moves stream state ahead of a handover the same
way. Here, once a reconfiguration is prepared (see :mod:`runtime.copyahead`), a task
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

How sharing works: a copy of a group whose values hold such objects (judged from its
first :data:`SAMPLE_VALUES` values) is pickled with each of them *out of band*: the
pickle refers to it by a number (a persistent id, negative for a ``str``), and the
object itself follows the pickle as it is, without being copied into the pickle's
frames (a ``str`` is encoded, lone surrogates and all). For word-count state of 100 MB
(5,000 payloads of 21 KB) that took pickling from 25-110 ms of CPU (the most when the
pickle's memory was fresh) to 4-7 ms, and the sending process's CPU for the whole copy
(``bench/state_transfer.py``) from a median of 57 to 31 ms. The delta is pickled
referring the same way to the copy's objects still in the state (the sender keeps them,
by ``id``, until the delta is made; the receiver keeps what it read). A group whose
sampled values hold none is pickled plainly, and its delta is too: touched keys' small
values cost little to send again.

A copy starts with one byte that says how it was pickled, ``O`` (out of band: then the
number of objects, 4 bytes, and their sizes, 8 bytes each, little-endian, before the
pickle; the objects follow it, in order) or ``P`` (plainly); a delta starts with ``O``
(it refers to its copy's objects) or ``P``.

The four functions are the whole format; they are pure (no I/O):
:func:`export_base` / :func:`load_base` for the copy ahead, :func:`export_delta` /
:func:`apply_delta` for what changed.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
from array import array
from collections.abc import Iterable
from itertools import accumulate, islice
from typing import Any

__all__ = [
    "SAMPLE_VALUES",
    "SHARE_MAX_KEYS",
    "SHARE_MIN_BYTES",
    "Shared",
    "apply_delta",
    "export_base",
    "export_delta",
    "load_base",
    "parse_part",
    "part_name",
]

SHARE_MIN_BYTES = 256  # smaller objects are cheaper to send again than to refer to
# Values of a group looked at to judge whether they hold objects worth sharing. Referring
# costs a call per pickled object, five times what pickling an int costs: only groups
# that seem to hold large objects pay it.
SAMPLE_VALUES = 8
# A group of more keys than this is pickled plainly whatever its values: referring would
# add more than pickling small values whole costs (about 0.1 us per object).
SHARE_MAX_KEYS = 65_536

_SHAREABLE = (bytes, str)
_COUNT = struct.Struct("<I")
_SURROGATES = "surrogatepass"  # a str may hold lone surrogates (as pickle lets it)


def part_name(kind: str, group: int) -> str:
    """The handover part a copy ahead (``base``) or a delta (``delta``) travels as."""
    return f"{kind}:{group}"


def parse_part(part: Any) -> tuple[str, int] | None:
    """(kind, key group) of a part named by :func:`part_name`; None for any other part."""
    if not isinstance(part, str) or ":" not in part:
        return None
    kind, group = part.split(":", 1)
    if kind not in ("base", "delta") or not group.isdigit():
        return None  # another part (a partition's position: "partition:<name>")
    return kind, int(group)


def _shareable(obj: Any) -> bool:
    return type(obj) in _SHAREABLE and len(obj) >= SHARE_MIN_BYTES


def _holds_shareable(value: Any) -> bool:
    """Whether ``value`` is, or directly holds, an object worth sharing."""
    if _shareable(value):
        return True
    if type(value) in (tuple, list):
        return any(_shareable(item) for item in value[:SAMPLE_VALUES])
    if type(value) is dict:
        return any(_shareable(item) for item in islice(value.values(), SAMPLE_VALUES))
    return False


class Shared:
    """The objects a copy ahead sent out of band, for its delta to refer to: by ``id``
    their persistent ids, and the objects themselves, kept alive so that no other object
    takes one's ``id`` meanwhile."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.objects: list[Any] = []

    def refer(self, obj: Any) -> int:
        """The persistent id of ``obj``, numbering it if it is new."""
        pid = self.ids.get(id(obj))
        if pid is None:
            n = len(self.objects)
            pid = n if type(obj) is bytes else ~n
            self.ids[id(obj)] = pid
            self.objects.append(obj)
        return pid


class _OutOfBand(pickle.Pickler):
    """A pickler that sends large immutable objects out of band (see the module)."""

    def __init__(self, file: Any, shared: Shared) -> None:
        super().__init__(file, protocol=5)
        self.shared = shared

    def persistent_id(self, obj: Any) -> int | None:  # called for every pickled object
        if type(obj) in _SHAREABLE and len(obj) >= SHARE_MIN_BYTES:  # _shareable, inlined
            return self.shared.refer(obj)
        return None


class _Referring(pickle.Pickler):
    """A delta's pickler: objects its copy sent out of band go as their persistent ids."""

    def __init__(self, file: Any, shared: Shared) -> None:
        super().__init__(file, protocol=5)
        self.ids = shared.ids

    def persistent_id(self, obj: Any) -> int | None:
        return self.ids.get(id(obj)) if type(obj) in _SHAREABLE else None


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


def export_base(store: dict) -> tuple[list[bytes], Shared | None]:
    """``store`` copied ahead, as pieces whose concatenation is the copy (:func:`load_base`
    reads either), and what :func:`export_delta` needs later (None: nothing to share).
    Call it and start noting touched keys with no ``await`` in between, so that nothing is
    missed. Large ``bytes`` values are among the pieces as they are: they cannot change."""
    pieces = _Pieces()
    if len(store) > SHARE_MAX_KEYS or not any(
        _holds_shareable(v) for v in islice(store.values(), SAMPLE_VALUES)
    ):
        pieces.write(b"P")
        pickle.Pickler(pieces, protocol=5).dump(store)
        return list(pieces), None
    shared = Shared()
    _OutOfBand(pieces, shared).dump(store)
    out = [o if type(o) is bytes else o.encode("utf-8", _SURROGATES) for o in shared.objects]
    sizes = _little(array("Q", map(len, out)))
    return [b"O" + _COUNT.pack(len(sizes)) + sizes.tobytes(), *pieces, *out], shared


def _little(sizes: array) -> array:
    """``sizes`` in little-endian order (in place), as the copy's table holds them."""
    if sys.byteorder == "big":
        sizes.byteswap()
    return sizes


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


class _Reading(pickle.Unpickler):
    """An unpickler that takes objects sent out of band from ``objects`` (see the module)."""

    def __init__(self, data: memoryview, objects: list[Any]) -> None:
        super().__init__(_ViewReader(data))
        self.objects = objects

    def persistent_load(self, pid: Any) -> Any:
        try:
            return self.objects[pid if pid >= 0 else ~pid]
        except (TypeError, IndexError):
            raise pickle.UnpicklingError(f"no object {pid!r} came out of band") from None


class _CopyReading(_Reading):
    """A copy's unpickler: its objects, still in the buffer, are read out on first use."""

    def __init__(self, copy: memoryview, at: int, start: int, sizes: array) -> None:
        """The pickle is ``copy[at:start]``; the objects follow it, of ``sizes``."""
        super().__init__(copy[at:start], [None] * len(sizes))
        self.copy = copy
        self.ends = list(accumulate(sizes, initial=start))

    def persistent_load(self, pid: Any) -> Any:
        obj = super().persistent_load(pid)
        if obj is None:
            n = pid if pid >= 0 else ~pid
            raw = self.copy[self.ends[n] : self.ends[n + 1]]
            obj = self.objects[n] = raw.tobytes() if pid >= 0 else str(raw, "utf-8", _SURROGATES)
        return obj


def load_base(data: bytes | bytearray | memoryview | list[bytes]) -> tuple[dict, list[Any]]:
    """The store a copy ahead holds (as it came, or the pieces :func:`export_base` gave),
    and what :func:`apply_delta` needs to read its delta. Nothing refers to ``data`` after."""
    if isinstance(data, list):
        data = b"".join(data)
    view = memoryview(data).cast("B")
    kind = view[:1].tobytes()
    if kind == b"P":
        store, objects = pickle.Unpickler(_ViewReader(view[1:])).load(), []
    elif kind == b"O":
        (n,) = _COUNT.unpack_from(view, 1)
        at = 1 + _COUNT.size + 8 * n
        sizes = array("Q")
        sizes.frombytes(view[1 + _COUNT.size : at])
        _little(sizes)
        start = len(view) - sum(sizes)
        if start < at:
            raise ValueError("a key group's copy ahead is shorter than the objects it lists")
        unpickler = _CopyReading(view, at, start, sizes)
        store, objects = unpickler.load(), unpickler.objects
    else:
        raise ValueError(f"a key group's copy ahead starts with {kind!r}, not O or P")
    if not isinstance(store, dict):
        raise ValueError("a key group's copy ahead is not a key -> value map")
    return store, objects


def export_delta(store: dict, touched: Iterable[Any], shared: Shared | None) -> bytes:
    """What changed in ``store`` since :func:`export_base`, given the keys touched since
    (``(changed, removed)``, pickled referring to what the copy holds)."""
    changed, removed = {}, []
    for key in touched:
        if key in store:
            changed[key] = store[key]
        else:
            removed.append(key)
    buf = io.BytesIO()
    if shared is None:
        buf.write(b"P")
        pickle.Pickler(buf, protocol=5).dump((changed, removed))
    else:
        buf.write(b"O")
        _Referring(buf, shared).dump((changed, removed))
    return buf.getvalue()


def apply_delta(store: dict, objects: list[Any], data: bytes | bytearray | memoryview) -> dict:
    """``store`` (from :func:`load_base`) brought up to date with a delta; returns it."""
    view = memoryview(data).cast("B")
    kind = view[:1].tobytes()
    if kind not in (b"O", b"P"):
        raise ValueError(f"a key group's changes start with {kind!r}, not O or P")
    changed, removed = _Reading(view[1:], objects).load()
    store.update(changed)
    for key in removed:
        store.pop(key, None)
    return store
