"""Keys, key groups and their owners.

A key is mapped to one of ``max_parallelism`` key groups by a stable hash: the same key
gives the same key group in every process, on every machine and in every run (Python's
salted ``hash()`` is never used). A keyed task owns any set of key groups, not only a
contiguous range; the owner table of an edge maps each key group to a task index.

Supported key types: ``str``, ``bytes``, ``int``, ``bool``, ``float``, ``None`` and tuples of
those. Anything else raises :class:`UnsupportedKeyError`, naming the type.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import xxhash

from .errors import StreamRuntimeError

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "KeyGroupHasher",
    "UnsupportedKeyError",
    "contiguous_split",
    "key_group",
    "key_group_fn",
    "owner_table",
    "stable_hash",
]

DEFAULT_MAX_PARALLELISM = 128

_xxh = xxhash.xxh64_intdigest
_pack_float = struct.Struct("<d").pack


class UnsupportedKeyError(StreamRuntimeError, TypeError):
    """A key of a type that has no stable hash."""

    def __init__(self, key: object) -> None:
        super().__init__(
            f"key {key!r} of type {type(key).__name__} has no stable hash; "
            "use str, bytes, int, float, bool, None or a tuple of those"
        )


def _key_bytes(key: object) -> bytes:
    if isinstance(key, str):
        return key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, bool):
        return b"T" if key else b"F"
    if isinstance(key, int):
        return b"i" + key.to_bytes(key.bit_length() // 8 + 1, "little", signed=True)
    if isinstance(key, float):
        return b"f" + _pack_float(key)
    if key is None:
        return b"N"
    if isinstance(key, tuple):
        parts = [_key_bytes(k) for k in key]
        return b"t" + b"".join(len(p).to_bytes(4, "little") + p for p in parts)
    raise UnsupportedKeyError(key)


def stable_hash(key: object) -> int:
    """A 64-bit hash of ``key`` that never changes between processes or runs."""
    if type(key) is str:
        try:
            return _xxh(key.encode())
        except UnicodeEncodeError:
            pass
    return _xxh(_key_bytes(key))


def key_group(key: object, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The key group (``0 <= g < max_parallelism``) that ``key`` belongs to."""
    return stable_hash(key) % max_parallelism


KEY_CACHE_LIMIT = 1 << 20  # keys remembered per key_group_fn before the cache is reset


class KeyGroupHasher:
    """A fast ``key -> key group`` function for one ``max_parallelism`` (hot path).

    Remembers the key groups of up to ``KEY_CACHE_LIMIT`` string keys: a dict lookup (which
    reuses Python's cached string hash) is several times cheaper than hashing. Only ``str``
    keys are cached, so keys that are equal across types (``1``, ``1.0``, ``True``) never
    share an entry. Hot loops may look a key up in :attr:`cache` directly (a miss, or a
    ``TypeError`` for an unhashable key, means: call the hasher).
    """

    __slots__ = ("cache", "max_parallelism")

    def __init__(self, max_parallelism: int) -> None:
        self.max_parallelism = max_parallelism
        self.cache: dict = {}

    def __call__(self, key: object) -> int:
        if type(key) is str:
            g = self.cache.get(key)
            if g is not None:
                return g
            try:
                g = _xxh(key.encode()) % self.max_parallelism
            except UnicodeEncodeError:
                g = _xxh(_key_bytes(key)) % self.max_parallelism
            if len(self.cache) >= KEY_CACHE_LIMIT:
                self.cache.clear()
            self.cache[key] = g  # only str keys: 1, 1.0 and True are equal but hash apart
            return g
        return _xxh(_key_bytes(key)) % self.max_parallelism


def key_group_fn(max_parallelism: int) -> KeyGroupHasher:
    """A cached ``key -> key group`` function (see :class:`KeyGroupHasher`)."""
    return KeyGroupHasher(max_parallelism)


def contiguous_split(max_parallelism: int, parallelism: int) -> list[list[int]]:
    """Key groups split into ``parallelism`` contiguous, near-equal ranges (as Flink does)."""
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism {parallelism} must be between 1 and max_parallelism {max_parallelism}"
        )
    return [
        list(range(i * max_parallelism // parallelism, (i + 1) * max_parallelism // parallelism))
        for i in range(parallelism)
    ]


def owner_table(assignment: Sequence[Iterable[int]], max_parallelism: int) -> list[int]:
    """Invert ``assignment`` (task index -> key groups) into key group -> task index.

    Raises ValueError naming the key group when one is owned twice or by nobody.
    """
    owner = [-1] * max_parallelism
    for task_index, groups in enumerate(assignment):
        for g in groups:
            if not 0 <= g < max_parallelism:
                raise ValueError(f"key group {g} is outside 0..{max_parallelism - 1}")
            if owner[g] != -1:
                raise ValueError(f"key group {g} is owned by tasks {owner[g]} and {task_index}")
            owner[g] = task_index
    missing = [g for g, o in enumerate(owner) if o == -1]
    if missing:
        raise ValueError(f"key groups {missing[:10]} are owned by no task")
    return owner
