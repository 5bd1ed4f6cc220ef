"""Taking checkpoints on a worker: each task's capture at the barrier, written off its loop.

When a checkpoint barrier is aligned at a task (forwarded downstream), the worker calls
:func:`capture` on the task's loop. What it captures is cheap to take and safe from the
changes that follow (:func:`runtime.checkpoints.snapshot.capture_group`):

- a source task: its reader's replay position;
- a keyed task: per key group, what changed since its previous capture (the keys its
  records touched, :meth:`runtime.operators.KeyedProcessor.take_changes`), or the whole
  group when this task has no chain for it (it is new here, or came from elsewhere) or
  its chain is due for compaction. A group nothing touched writes nothing;
- a sink task: what its writer says it has written (``SinkWriter.snapshot``), if anything;
- any other task: nothing (it still acks, so that the checkpoint knows it aligned).

Then :class:`CheckpointWriter`, one thread per worker, serializes the capture
(:func:`~runtime.checkpoints.snapshot.encode_part`) and writes it to the job's store as
one file per task per checkpoint, ``<job>/chk-<id>/<task>.part``, in the order the
captures were taken; the task goes on meanwhile.

**Chains.** A keyed task keeps, per key group, its *chain*: the :class:`Link` of each
part a restore of the group reads, the last whole capture first, then the deltas after
it. Every ack carries every chain, so a checkpoint's manifest alone says what to read for
any group. A chain is at most ``2 * full_every`` long: a group whose chain reaches
``full_every`` is captured whole again, at most ``1/full_every`` of the groups at one
checkpoint (longest chains first), so that compaction spreads over checkpoints instead of
making every ``full_every``-th one as big as the state. A group whose records touched at
least :data:`WHOLE_SHARE` of its keys since its last capture is captured whole rather
than as a delta: that costs at most twice the delta and leaves a restore one part to
read (a word count touches most of its words every second: its 1 s deltas were 85% of
the state, and a restore read 4.3 times the state at ``full_every=8``). A chain continues across a
checkpoint that was abandoned after its part was written (the part stays in the store
while a chain refers to it); a part that could not be written breaks the chains that
end in it: the checkpoint that depended on it fails at this task, and the groups are
captured whole at the next one. A chain is tied to the group's tenure at the task
(:attr:`runtime.state.KeyedState.arrivals`): a group that left and came back starts whole.

**Task-local copies.** When the store is not on a local disk (``s3://``, ``hdfs://``...),
the writer also keeps a copy of each part it writes in a local directory of the worker
(no fsync: a cache), and a restore reads a part from there when it has it (every
segment's checksum is checked, so a damaged copy is read from the store instead): tasks
restored on the worker that took their checkpoint do not read the store (Flink's
task-local recovery). Copies no chain of the worker's last two captures per task refers
to are removed as the writer goes; the directory of copies is removed when the writer
closes, or, if the worker dies first, by the next worker that makes one
(:mod:`runtime.checkpoints.local_copies`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import StreamRuntimeError
from .local_copies import LocalCopies
from .snapshot import GroupCapture, SnapshotError, capture_group, encode_part, materialize
from .store import CheckpointStore, LocalStore, open_store

__all__ = [
    "WHOLE_SHARE",
    "Capture",
    "CheckpointCaptureError",
    "CheckpointWriter",
    "GroupChains",
    "Link",
    "part_path",
    "read_groups",
]

WHOLE_SHARE = 0.5  # a group whose changed keys are this share of it is captured whole

logger = logging.getLogger(__name__)


class CheckpointCaptureError(StreamRuntimeError, RuntimeError):
    """A task cannot take its part of a checkpoint (a source that has no replay
    position, a sink writer whose snapshot failed); says which and why."""


def part_path(job_id: str, checkpoint_id: int, task: str) -> str:
    """Where a task's part of a checkpoint goes in the store."""
    return f"{job_id}/chk-{checkpoint_id}/{task}.part"


@dataclass(eq=False)
class Link:
    """One part of a group's chain: ``path`` in the store and the segment's place in it,
    once written (``ok``: None while being written, then whether it was)."""

    path: str
    full: bool
    keys: int
    offset: int = -1
    length: int = -1
    ok: bool | None = None

    def wire(self) -> list:
        """As the manifest holds it: [path, offset, length, full, keys]."""
        return [self.path, self.offset, self.length, self.full, self.keys]


@dataclass(eq=False)
class GroupChains:
    """A keyed task's chains (module docstring), per key group, with the tenure of the
    group (``KeyedState.arrivals``) each was built in."""

    full_every: int
    chains: dict[int, list[Link]] = field(default_factory=dict)
    tenure: dict[int, int] = field(default_factory=dict)
    broken: set[int] = field(default_factory=set)  # groups whose last part was not written

    def plan(
        self,
        arrivals: dict[int, int],
        changed: dict[int, set],
        sizes: Mapping[int, int] | None = None,
    ) -> dict[int, set | None]:
        """What to capture of each group owned now (``arrivals``: group -> tenure):
        None for a whole capture, the changed keys for a delta; groups with nothing to
        write are left out. A delta of at least :data:`WHOLE_SHARE` of a group's keys
        (``sizes``: group -> keys now) is captured whole instead. Forgets the chains of
        groups no longer owned (or owned anew)."""
        sizes = sizes or {}
        for g in [g for g in self.chains if arrivals.get(g) != self.tenure.get(g)]:
            del self.chains[g]
            self.tenure.pop(g, None)
        todo: dict[int, set | None] = {}
        due: list[int] = []
        for g in arrivals:
            chain = self.chains.get(g)
            keys = changed.get(g)
            if chain is None or g in self.broken or len(chain) >= 2 * self.full_every:
                todo[g] = None
            elif keys and len(keys) >= WHOLE_SHARE * sizes.get(g, 0):
                todo[g] = None  # nearly as big as the group: whole, and the chain is 1 long
            elif len(chain) >= self.full_every:
                due.append(g)
            elif changed.get(g):
                todo[g] = changed[g]
        room = max(1, -(-len(arrivals) // self.full_every))
        due.sort(key=lambda g: -len(self.chains[g]))
        for g in due[:room]:
            todo[g] = None
        for g in due[room:]:
            if changed.get(g):
                todo[g] = changed[g]
        self.broken.clear()
        return todo

    def extend(self, arrivals: dict[int, int], links: dict[int, Link]) -> None:
        """Add each group's new link (a whole one starts the chain again)."""
        for g, link in links.items():
            if link.full:
                self.chains[g] = [link]
                self.tenure[g] = arrivals[g]
            else:
                self.chains[g].append(link)

    def snapshot(self) -> dict[int, list[Link]]:
        """The chains as they are now (the lists copied; links shared, filled in later)."""
        return {g: list(chain) for g, chain in self.chains.items()}

    @classmethod
    def restored(
        cls, full_every: int, chains: dict[int, list[list]], arrivals: dict[int, int]
    ) -> GroupChains:
        """The chains of groups just restored from a checkpoint's ``chains`` (as its
        manifest holds them): the next capture builds on them."""
        made = cls(full_every)
        for g, chain in chains.items():
            made.chains[g] = [
                Link(path, bool(full), int(keys), int(offset), int(length), True)
                for path, offset, length, full, keys in chain
            ]
            made.tenure[g] = arrivals[g]
        return made


def read_groups(
    store: CheckpointStore, chains: dict[int, list[list]], local: LocalCopies | None = None
) -> tuple[dict[int, dict], dict[str, int]]:
    """Each key group's state, materialized from its chain of parts (blocking: run it on
    a thread), and the bytes read from ``local`` copies and from the store. A group whose
    local copy is missing or damaged is read from the store. Raises the store's errors,
    or ``SnapshotError`` for a part in the store that is not what the chain says."""
    read = {"local_bytes": 0, "store_bytes": 0}
    groups: dict[int, dict] = {}
    for g, chain in chains.items():
        if local is not None:
            copies = [local.read(path, offset, length) for path, offset, length, _f, _k in chain]
            if all(c is not None for c in copies):
                try:
                    groups[g] = materialize(copies)  # type: ignore[arg-type]
                    read["local_bytes"] += sum(len(c) for c in copies)  # type: ignore[arg-type]
                    continue
                except SnapshotError:
                    logger.warning(
                        "a local copy of key group %s is damaged: read from the store", g
                    )
        parts = [store.get_range(path, offset, length) for path, offset, length, _f, _k in chain]
        groups[g] = materialize(parts)
        read["store_bytes"] += sum(len(p) for p in parts)
    return groups, read


@dataclass(eq=False)
class Capture:
    """What a task took at a checkpoint barrier, for the writer: its new parts (per
    group), every chain as of this capture, its source position and sink snapshot."""

    job_id: str
    task: str
    checkpoint_id: int
    store: str
    groups: dict[int, GroupCapture] = field(default_factory=dict)
    links: dict[int, Link] = field(default_factory=dict)
    chains: dict[int, list[Link]] = field(default_factory=dict)
    position: Any = None
    sink: Any = None

    @property
    def path(self) -> str:
        return part_path(self.job_id, self.checkpoint_id, self.task)


def capture_keyed(
    capture: Capture,
    chains: GroupChains,
    groups: dict[int, dict],
    arrivals: dict[int, int],
    changed: dict[int, set],
) -> None:
    """Fill in ``capture`` with a keyed task's state: the groups :meth:`GroupChains.plan`
    says, on the task's loop (cheap: see the module docstring)."""
    todo = chains.plan(arrivals, changed, {g: len(groups[g]) for g in changed if g in groups})
    for g, keys in todo.items():
        part = capture_group(groups[g], keys)
        capture.groups[g] = part
        capture.links[g] = Link(capture.path, part.full, part.keys)
    chains.extend(arrivals, capture.links)
    capture.chains = chains.snapshot()


class CheckpointWriter:
    """Writes captures to their stores on one thread, in the order they were taken (so a
    delta is never written before the part it follows). ``on_broken`` is told, on the
    writer's thread, the groups whose part could not be written."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._stores: dict[str, CheckpointStore] = {}
        self.local: LocalCopies | None = None  # made on the first write to a remote store

    def submit(
        self, capture: Capture, on_broken: Callable[[Iterable[int]], None] | None = None
    ) -> Future[tuple[dict[str, Any], int, int]]:
        """Write ``capture``; the future gives (the task's part of the manifest, bytes
        written now, bytes of every chain), or raises :class:`CheckpointCaptureError`."""
        return self._pool.submit(self._write, capture, on_broken)

    def close(self) -> None:
        """Stop taking captures; what was submitted is still written, then the local
        copies are removed, on the writer's thread (which the interpreter waits for on its
        way out, so a worker that exits removes them)."""
        self._pool.submit(self._close_local)
        self._pool.shutdown(wait=False, cancel_futures=False)

    def _close_local(self) -> None:
        if self.local is not None:
            self.local.close()

    def copies_for(self, location: str) -> LocalCopies | None:
        """The local copies to read before the store at ``location`` (None: it is on a
        local disk, or nothing was written here)."""
        return self.local if not isinstance(self.store(location), LocalStore) else None

    def store(self, location: str) -> CheckpointStore:
        """The store at ``location`` (opened once; blocking on first use)."""
        store = self._stores.get(location)
        if store is None:
            store = self._stores[location] = open_store(location)
        return store

    def _write(
        self, capture: Capture, on_broken: Callable[[Iterable[int]], None] | None
    ) -> tuple[dict[str, Any], int, int]:
        written = 0
        if capture.groups:
            try:
                store = self.store(capture.store)
                chunks, index = encode_part(capture.groups)
                written = store.put(capture.path, chunks)
            except Exception as exc:
                for link in capture.links.values():
                    link.ok = False
                if on_broken is not None:
                    on_broken(list(capture.links))
                raise CheckpointCaptureError(
                    f"task {capture.task!r}: its part of checkpoint {capture.checkpoint_id} "
                    f"could not be written: {type(exc).__name__}: {exc}"
                ) from exc
            for g, link in capture.links.items():
                seg = index[g]
                link.offset, link.length, link.ok = seg.offset, seg.length, True
            if not isinstance(store, LocalStore):
                if self.local is None:
                    self.local = LocalCopies()
                self.local.keep(capture.path, chunks)
        groups: dict[int, list[list]] = {}
        size = 0
        for g, chain in capture.chains.items():
            if any(link.ok is not True for link in chain):
                if on_broken is not None:
                    on_broken([g])
                raise CheckpointCaptureError(
                    f"task {capture.task!r}: key group {g}'s earlier part of a checkpoint "
                    "was not written, so this one cannot build on it (the group is written "
                    "whole at the next checkpoint)"
                )
            groups[g] = [link.wire() for link in chain]
            size += sum(link.length for link in chain)
        if self.local is not None:
            paths = {link.path for chain in capture.chains.values() for link in chain}
            self.local.referenced(capture.task, paths)
        part = {"groups": groups, "position": capture.position, "sink": capture.sink}
        return part, written, size
