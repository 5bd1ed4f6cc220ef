"""Incremental checkpoint snapshots of keyed state: what a task captures of its key groups
at a checkpoint barrier, the bytes that capture is written as, and a group's state read
back from them.

A keyed task holds, per key group, a dict key -> value (:class:`runtime.state.KeyedState`)
that its UDF reads and writes, changing list, dict or object values in place. A group's
capture is FULL (the whole dict) or a DELTA (the keys records touched since the group's
previous capture: their current values, and those no longer present as removed). The
task decides which (full when it has no tracking for the group, or when the group's chain
grew too long); this module is the mechanism, pure functions with no I/O:

1. At the barrier, on the task's loop, :func:`capture_group` for each group, then a fresh
   set of touched keys for it, with no ``await`` in between (a key touched in between
   would be missed). It costs O(keys captured) and pickles only what the UDF could change
   in place afterwards: an immutable value is kept by reference; any other is pickled at
   once (see :func:`capture_group`).
2. Off the loop, in a background thread, :func:`encode_part` pickles what was kept by
   reference and gives the task's part of the checkpoint (one file) as chunks to write in
   order, and an index group -> :class:`Segment` to keep beside it.
3. To restore a group, read its chain (the segment of its last full capture, then those of
   its deltas after it, in order: each a range read at its segment's offset and length)
   and :func:`materialize` it.

Byte format. A part is its segments one after another, nothing before, between or after
them (where each one is lies in the index). A segment reads alone; it is a header of
:data:`HEADER_BYTES` bytes, then its body (integers unsigned, little-endian)::

    offset  size  field
    0       2     magic, b"KS" (keyed state)
    2       1     format version, FORMAT_VERSION (1)
    3       1     kind: b"F" (full) or b"D" (delta)
    4       8     keys written: len(values)
    12      8     body length in bytes
    20      8     xxh3_64 of the body (the library ``xxhash``)
    28      ...   body: records one after another, each a length (8 bytes) then a pickle
                  (protocol 5) of that many bytes. The first unpickles to the keys
                  removed, a tuple (empty in a full segment); each other one to a dict
                  key -> value of at most BATCH_KEYS keys (none when no key is written).

Values go in batches so that pickling each costs a bounded time and memo. Pickled whole,
a million str values took 335 ms, and the encoding thread held the GIL for up to ~100 ms
at a time, stalling the task's loop however "background" the pickling; in batches of
:data:`BATCH_KEYS` they took 111 ms, and the task's thread got the GIL back within ~10 ms
(``sys.getswitchinterval()`` is 5 ms).

A value pickled at capture is, in a batch, the call ``_pickle.loads(<its pickle>)``: the
batch unpickles to plain values at once, and the bytes of a large one are written as they
are, not copied into the pickle's frames. Each such value comes back on its own: two keys
that held one list come back with equal lists, not the same one (a delta rewrites one key
alone, so sharing between keys could not last anyway).

A read at a wrong offset (no magic), of another format version, cut short, too long or
changed (the checksum) raises :class:`SnapshotError` rather than decoding to something
else. Records are pickles: reading them runs what they name, so checkpoints must be kept
where only the cluster writes (as for the state :mod:`runtime.handover` ships).

Exceptions (see :mod:`runtime.errors` for the runtime's whole tree)::

    StreamRuntimeError
    └── ValueError
        └── SnapshotError   a value that does not pickle, bytes that are not a segment,
                            a chain that does not start with a full capture
"""

from __future__ import annotations

import pickle
import reprlib
import struct
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain, compress, islice
from typing import Any

import xxhash

from ..errors import StreamRuntimeError

__all__ = [
    "BATCH_KEYS",
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "IMMUTABLE_DEPTH",
    "GroupCapture",
    "Segment",
    "SnapshotError",
    "capture_group",
    "decode_segment",
    "encode_part",
    "materialize",
]

FORMAT_VERSION = 1
# Tuples and frozensets nested deeper than this are pickled at capture rather than checked
# item by item: it bounds what checking one value costs (and its recursion).
IMMUTABLE_DEPTH = 4

_MAGIC = b"KS"
_FULL, _DELTA = b"F"[0], b"D"[0]
_HEADER = struct.Struct("<2sBBQQQ")  # magic, version, kind, keys, body length, xxh3_64
HEADER_BYTES = _HEADER.size
_LENGTH = struct.Struct("<Q")  # before each record of the body
# Keys pickled at a time (see the module): bounds how long the encoding thread holds the
# GIL and how large the pickler's memo grows (beyond this it slows pickling down).
BATCH_KEYS = 65_536
# Exact types whose values cannot change: kept by reference. A subclass (an IntEnum, a
# str with attributes) may carry state that can, so only these exact types qualify.
_ATOMIC = frozenset({int, float, complex, bool, type(None), str, bytes})
_CONTAINERS = frozenset({tuple, frozenset})  # immutable when all they hold is
_ABSENT = object()
_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60


class SnapshotError(StreamRuntimeError, ValueError):
    """A value that does not pickle, bytes that are not a segment, or a chain of segments
    that does not start with a full capture."""


class _Pickled:
    """A value pickled at capture (its pickle, protocol 5), to be unpickled on reading.
    Pickled itself, it is the call ``pickle.loads(data)``."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return pickle.loads, (self.data,)

    def __repr__(self) -> str:
        return f"<value pickled at capture, {len(self.data)} bytes>"


@dataclass(frozen=True, slots=True)
class GroupCapture:
    """One key group's capture: FULL (``values`` is the whole group) or a DELTA (the
    touched keys still present, with their values, and ``removed``, those no longer
    present). From :func:`capture_group` a value that could change is held pickled, in a
    private wrapper; from :func:`decode_segment` every value is plain."""

    full: bool
    values: dict
    removed: tuple

    @property
    def keys(self) -> int:
        """The number of keys written (removed keys are not counted)."""
        return len(self.values)


@dataclass(frozen=True, slots=True)
class Segment:
    """Where a group's segment lies in its part (bytes ``offset`` to ``offset + length``),
    and what it holds: a full capture or a delta, of ``keys`` keys written."""

    offset: int
    length: int
    full: bool
    keys: int


def _type_name(value: Any) -> str:
    cls = type(value)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _immutable(value: Any, depth: int = IMMUTABLE_DEPTH) -> bool:
    """Whether ``value`` is of an atomic type or, ``depth`` allowing, a tuple or frozenset
    of such values (``depth``: how many levels of them may nest)."""
    kind = type(value)
    if kind in _ATOMIC:
        return True
    if kind not in _CONTAINERS or depth <= 0:
        return False
    # Items all atomic is the common case, checked without a Python call per item.
    return _ATOMIC.issuperset(map(type, value)) or all(
        _immutable(item, depth - 1) for item in value
    )


def _all_immutable(values: Collection) -> bool:
    """Whether every one of ``values`` is atomic or a tuple or frozenset of atomic values:
    the common case, checked without a Python call per value (for a million values, 20 ms
    when all are atomic and 120 when all are pairs, against 80 and 180 for a loop). False
    says only that some need a closer look."""
    kinds = set(map(type, values))
    if kinds <= _ATOMIC:
        return True
    if not kinds <= _ATOMIC | _CONTAINERS:
        return False
    containers = compress(values, map(_CONTAINERS.__contains__, map(type, values)))
    return _ATOMIC.issuperset(map(type, chain.from_iterable(containers)))


def _captured(key: Any, value: Any) -> Any:
    """``value`` as a capture keeps it: itself if immutable, else pickled now."""
    if _immutable(value):
        return value
    try:
        return _Pickled(pickle.dumps(value, protocol=5))
    except Exception as exc:  # a lock, a socket, a lambda... anywhere inside the value
        raise SnapshotError(
            f"the value of key {_short.repr(key)} (a {_type_name(value)}) does not pickle: {exc}"
        ) from exc


def capture_group(store: dict, touched: Iterable | None) -> GroupCapture:
    """A capture of ``store``, one key group's state: FULL when ``touched`` is None, else a
    DELTA of the keys in ``touched`` (each present one with its value, each absent one as
    removed).

    Synchronous, for the task's loop: it costs O(keys captured), and after it returns the
    task may change ``store`` and its values at will. A value of an immutable type (an
    exact int, float, complex, bool, None, str or bytes, or a tuple or frozenset of such,
    nested at most :data:`IMMUTABLE_DEPTH` deep) is kept by reference, to be pickled by
    :func:`encode_part`; any other is pickled now (protocol 5), since the UDF may change it
    in place. Keys are kept by reference (keyed state's keys are immutable:
    :mod:`runtime.keygroups`). Raises :class:`SnapshotError`, naming the key and the
    value's type, for a value that does not pickle."""
    if touched is None:
        values = dict(store)
        if not _all_immutable(values.values()):
            for key, value in values.items():  # replacing values only: the size stays
                kind = type(value)
                if kind not in _ATOMIC and not (
                    kind in _CONTAINERS and _ATOMIC.issuperset(map(type, value))
                ):
                    values[key] = _captured(key, value)
        return GroupCapture(True, values, ())
    values, removed = {}, []
    for key in touched:
        value = store.get(key, _ABSENT)
        if value is _ABSENT:
            removed.append(key)
        else:
            values[key] = value if type(value) in _ATOMIC else _captured(key, value)
    return GroupCapture(False, values, tuple(removed))


class _Chunks(list):
    """A binary file that keeps what a pickler writes to it as the pieces it came in:
    frames of about 64 KB, and large ``bytes`` payloads as the objects themselves (a value
    kept by reference, or one pickled at capture), not copied. Anything else (a view of
    memory a value owns) is copied."""

    def write(self, data: Any) -> int:
        piece = data if type(data) is bytes else bytes(data)
        self.append(piece)
        return len(piece)

    def record(self, obj: Any) -> None:
        """``obj`` pickled, as a record of a segment's body: its length, then its pickle."""
        at = len(self)
        self.append(b"")  # its length, once known
        pickle.Pickler(self, protocol=5).dump(obj)
        self[at] = _LENGTH.pack(sum(map(len, self[at + 1 :])))


def _batches(values: dict) -> Iterator[dict]:
    """``values`` in dicts of at most :data:`BATCH_KEYS` keys (itself if it is small)."""
    if len(values) <= BATCH_KEYS:
        if values:
            yield values
        return
    items = iter(values.items())
    while batch := dict(islice(items, BATCH_KEYS)):
        yield batch


def encode_part(
    captures: Mapping[int, GroupCapture],
) -> tuple[list[bytes | memoryview], dict[int, Segment]]:
    """The part of a checkpoint that holds ``captures`` (group -> capture): the chunks to
    write, in order, and where each group's segment lies in their concatenation (groups
    in ascending order). Meant for a background thread: it pickles the values captures
    kept by reference, a batch at a time, and does not copy large ones again. Raises
    :class:`SnapshotError` for a capture that does not pickle (a key of a type keyed state
    does not allow)."""
    chunks: list[bytes | memoryview] = []
    index: dict[int, Segment] = {}
    offset = 0
    for group in sorted(captures):
        capture = captures[group]
        body = _Chunks()
        try:
            body.record(capture.removed)
            for batch in _batches(capture.values):
                body.record(batch)
        except Exception as exc:
            raise SnapshotError(f"key group {group}: its capture does not pickle: {exc}") from exc
        digest = xxhash.xxh3_64()
        for piece in body:
            digest.update(piece)
        size = sum(map(len, body))
        kind = _FULL if capture.full else _DELTA
        header = _HEADER.pack(_MAGIC, FORMAT_VERSION, kind, capture.keys, size, digest.intdigest())
        chunks.append(header)
        chunks.extend(body)
        index[group] = Segment(offset, HEADER_BYTES + size, capture.full, capture.keys)
        offset += HEADER_BYTES + size
    return chunks, index


def _records(body: memoryview) -> Iterator[memoryview]:
    """The records of a segment's body (see the module), each a view of its pickle."""
    at = 0
    while at < len(body):
        if len(body) - at < _LENGTH.size:
            raise SnapshotError("a keyed-state segment's body ends inside a record's length")
        (size,) = _LENGTH.unpack_from(body, at)
        at += _LENGTH.size
        if size > len(body) - at:
            raise SnapshotError("a keyed-state segment's body ends inside a record")
        yield body[at : at + size]
        at += size


def _unpickled(record: memoryview) -> Any:
    try:
        return pickle.loads(record)
    except Exception as exc:  # a value's class that this process cannot import, ...
        raise SnapshotError(f"a keyed-state segment's values do not unpickle: {exc}") from exc


def _contents(body: memoryview) -> tuple[tuple, dict]:
    """(removed, values) a segment's body holds."""
    records = _records(body)
    first = next(records, None)
    removed = None if first is None else _unpickled(first)
    if type(removed) is not tuple:
        raise SnapshotError("a keyed-state segment's body does not start with the keys removed")
    values: dict = {}
    for record in records:
        batch = _unpickled(record)
        if type(batch) is not dict:
            raise SnapshotError(
                f"a keyed-state segment's body holds a {_type_name(batch)}, not values"
            )
        if values:
            values.update(batch)
        else:
            values = batch
    return removed, values


def decode_segment(data: bytes | memoryview) -> GroupCapture:
    """The capture a segment holds (``data`` is the segment, exactly), every value plain
    again. Raises :class:`SnapshotError` for data that is not one whole segment of this
    format version, or whose values do not unpickle here."""
    view = memoryview(data).cast("B")
    if len(view) < HEADER_BYTES:
        raise SnapshotError(
            f"not a keyed-state segment: {len(view)} bytes, fewer than its "
            f"{HEADER_BYTES}-byte header"
        )
    magic, version, kind, keys, size, checksum = _HEADER.unpack_from(view)
    if magic != _MAGIC:
        raise SnapshotError(f"not a keyed-state segment: it starts with {magic!r}, not {_MAGIC!r}")
    if version != FORMAT_VERSION:
        raise SnapshotError(
            f"a keyed-state segment of format version {version}; this runtime reads "
            f"version {FORMAT_VERSION}"
        )
    if kind not in (_FULL, _DELTA):
        raise SnapshotError(f"a keyed-state segment of kind {bytes([kind])!r}, neither F nor D")
    body = view[HEADER_BYTES:]
    if len(body) != size:
        raise SnapshotError(
            f"a keyed-state segment's header gives a body of {size} bytes, but "
            f"{len(body)} follow it ({'cut short' if len(body) < size else 'too many'})"
        )
    if xxhash.xxh3_64_intdigest(body) != checksum:
        raise SnapshotError("a keyed-state segment's body does not match its checksum")
    removed, values = _contents(body)
    full = kind == _FULL
    if len(values) != keys or (full and removed):
        raise SnapshotError(
            f"a keyed-state segment holds {len(values)} keys and {len(removed)} removed; "
            f"its header gives {keys} keys{' and none removed' if full else ''}"
        )
    return GroupCapture(full, values, removed)


def _plain(values: dict) -> dict:
    """``values`` with those pickled at capture unpickled (``values`` itself if none)."""
    if _Pickled not in set(map(type, values.values())):
        return values
    return {k: pickle.loads(v.data) if type(v) is _Pickled else v for k, v in values.items()}


def _describe(capture: GroupCapture) -> str:
    if capture.full:
        return f"a full capture of {capture.keys} keys"
    return f"a delta of {capture.keys} keys written and {len(capture.removed)} removed"


def materialize(chain: Iterable[bytes | memoryview | GroupCapture]) -> dict:
    """A key group's state from its chain: the segment (or capture) of its last full
    capture, then those of the deltas after it, in order; each delta's values are set and
    its removed keys deleted. The dict returned is new and shares no value that could
    change with the chain. Raises :class:`SnapshotError` for an empty chain, one that does
    not start with a full capture or holds another after its first, or a segment that
    :func:`decode_segment` rejects."""
    state: dict | None = None
    for position, link in enumerate(chain):
        if isinstance(link, GroupCapture):
            capture, values = link, _plain(link.values)
            ours = values is not link.values  # else the caller's dict, not to be changed
        else:
            capture = decode_segment(link)
            values, ours = capture.values, True
        if state is None:
            if not capture.full:
                raise SnapshotError(
                    f"a key group's chain starts with {_describe(capture)}, not a full capture"
                )
            state = values if ours else dict(values)
            continue
        if capture.full:
            raise SnapshotError(
                f"a key group's chain holds {_describe(capture)} at position {position}, "
                "after its first: a chain starts at the group's last full capture"
            )
        state.update(values)
        for key in capture.removed:
            state.pop(key, None)
    if state is None:
        raise SnapshotError("a key group's chain is empty: it needs at least a full capture")
    return state
