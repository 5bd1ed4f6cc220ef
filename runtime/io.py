"""The contracts of sources and sinks.

A :class:`Source` or :class:`Sink` is a small, frozen, picklable description (it is shipped
to workers inside the job graph). Each task of a source operator calls
:meth:`Source.open` once with its index and the operator's parallelism and pulls batches
from the returned :class:`SourceReader`; each sink task writes to its own
:class:`SinkWriter`.

Sources are replayable and deterministic: for a given description (seed included) the
multiset of records produced by all readers together is the same whatever the
parallelism, and :meth:`SourceReader.position` / :meth:`SourceReader.seek` let a reader be
rewound to a recorded position (checkpoints, fault tolerance).

A :class:`PartitionedSource` (a broker topic, a set of streams, a table split in ranges)
names its partitions instead: the abstraction gives each source task a set of them as
its workload, a plan moves one between tasks live with its position, and a checkpoint
records each partition's position, wherever it is read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["PartitionedSource", "Sink", "SinkWriter", "Source", "SourceReader"]


class SourceReader(ABC):
    """One source task's share of a source. Called from one asyncio task only."""

    stalled: str | None = None
    """Why the reader cannot read now (a broker lost: it retries, returning empty
    batches), or None while it reads; reported in the task's metrics."""

    @abstractmethod
    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        """Records due by wall-clock ``now`` (at most ``max_records``) and their timestamps.

        Returns ``(values, timestamps)``, where a timestamp is the time the record was due
        by the source's rate schedule (or ``now`` for an unthrottled source), so that
        latency counts time spent queued in an overloaded source. An empty batch means
        nothing is due yet (call :meth:`next_due`). ``None`` means the reader is exhausted
        and will never produce again.
        """

    def next_due(self, now: float) -> float:
        """Wall-clock time at which the next record is due (``now`` if one is due now)."""
        return now

    def position(self) -> Any:
        """A msgpack-able replay position: seeking to it replays what follows it."""
        raise NotImplementedError(f"{type(self).__name__} cannot report a replay position")

    def seek(self, position: Any) -> None:
        """Rewind or advance to a position returned by :meth:`position`."""
        raise NotImplementedError(f"{type(self).__name__} cannot seek")

    def committed(self, position: Any) -> None:
        """The checkpoint that recorded ``position`` (one of this reader's) is complete:
        nothing before it will be read again, so the reader may acknowledge it upstream
        (commit a consumer group's offsets, ack messages). On the task's loop: keep it
        short (asynchronous I/O). Default: nothing."""

    def lag(self) -> int | None:
        """Records between the position and the head of the input, as last seen (None:
        unknown). Asked about once a second, for metrics: it must not block."""
        return None

    def close(self) -> None:
        """Release files or sockets. Called once, also after a failure."""


class Source(ABC):
    """A picklable description of a replayable source."""

    bounded: bool = True

    @abstractmethod
    def open(self, index: int, parallelism: int, start_time: float) -> SourceReader:
        """The reader of task ``index`` of ``parallelism``; rates count from ``start_time``."""


class PartitionedSource(Source):
    """A source split into named partitions, each read by one reader at a time.

    Contract:

    1. :meth:`partitions` is called when the job is built (in the process that builds it:
       an error there, such as a broker that cannot be reached, refuses the submission
       with its message) and then by the source's first task every
       :attr:`discovery_interval_s` (None: never) to find new partitions. It returns the
       partitions' names, stable across calls and processes; a name once returned is
       never reused for other data.
    2. A source task owns a set of partitions (its workload in the abstraction) and reads
       each through its own :meth:`open_partition` reader, polling them in turn. Each
       reader's :meth:`SourceReader.position` is msgpack-able and says where the
       partition's next record is; :meth:`SourceReader.seek` resumes there, in another
       task or process, after a move, a recovery or a savepoint. Polled ``None``, a
       partition is exhausted (bounded sources only); a task with no partition left ends
       if the source is bounded, else idles.
    3. A reader that loses its connection retries and returns empty batches meanwhile,
       saying why in :attr:`SourceReader.stalled` (reported in the metrics; past
       :attr:`stall_timeout_s` the task fails); it raises only for what retrying cannot
       mend (a partition deleted, a record that cannot be decoded and no dead letter).

    The runtime reads a partitioned source by partition only
    (:class:`runtime.partitioned.PartitionSetReader` over each task's partitions);
    :meth:`open` is not used.
    """

    bounded: bool = False
    discovery_interval_s: float | None = None
    stall_timeout_s: float | None = 60.0
    """A partition whose reader stays :attr:`SourceReader.stalled` this long fails its
    task (naming it and why), which a job with checkpoints recovers from as its restart
    policy allows; None: never (it waits for the broker however long)."""

    @abstractmethod
    def partitions(self) -> list[str]:
        """The names of the partitions now (step 1). Raises with a message that says what
        to fix when the source cannot be reached."""

    @abstractmethod
    def open_partition(self, partition: str, start_time: float) -> SourceReader:
        """A reader of ``partition`` from where a reader without a position starts (the
        beginning, or what the source's settings say); rates count from ``start_time``."""

    def open(self, index: int, parallelism: int, start_time: float) -> SourceReader:
        raise NotImplementedError(
            f"{type(self).__name__} is a partitioned source: it is read by partition "
            "(open_partition), each task reading the partitions the abstraction gives it"
        )


class SinkWriter(ABC):
    """One sink task's writer. Called from its task's loop only (but see
    :attr:`commits_off_loop`), in the order below.

    Two-phase commit. When the job takes checkpoints the runtime calls
    :meth:`transactional` once, before any write, and the writer's output is then
    exactly once through failures and visible only once it is committed:

    1. :meth:`write`: records go into the open transaction, invisible to readers.
    2. :meth:`prepare` at a checkpoint's barrier (:meth:`hand_over` at the barrier of a
       reconfiguration that moves or removes the task, the task's next writer taking over
       through :meth:`adopt`): make the open transaction durable but not visible, and
       return what a recovery needs to finish it; a new one opens.
    3. :meth:`commit` once a checkpoint is complete: make visible every transaction of
       this sink prepared at its barrier or before (also those a task that left
       prepared). Idempotent.
    4. :meth:`restore` in a recovery from a complete checkpoint: commit what was
       prepared at it, abort whatever came after it.

    A writer that keeps the defaults is at-least-once: after a recovery the records
    emitted since the checkpoint are written again. It says so through
    :attr:`Sink.exactly_once` (False).
    """

    commits_off_loop: bool = False
    """True: :meth:`commit` may run on another thread, at the same time as :meth:`write`
    and :meth:`prepare` (the writer guards what they share), so that a slow commit does
    not hold the task (and its worker's other tasks) back; commits still come one at a
    time, in order, and never alongside :meth:`hand_over`, :meth:`close` or :meth:`abort`.
    Visibility is unchanged: a commit's records are visible when it returns."""

    @abstractmethod
    def write(self, values: list) -> None:
        """Take a batch of records, in arrival order."""

    def transactional(self) -> None:
        """The job takes checkpoints: write into transactions from now on (called once,
        before any write). Without this call, write visibly as records come."""

    def prepare(self, checkpoint_id: int) -> Any:
        """Step 2, at barrier ``checkpoint_id`` (on the task's loop: keep it short): make
        the open transaction durable and say what it is (msgpack-able). None: nothing
        to restore."""
        return None

    def hand_over(self, barrier_id: int, moving: bool) -> Any:
        """The task leaves at reconfiguration barrier ``barrier_id``: write its final
        results (as at :meth:`close`) into the open transaction and prepare it (step 2)
        for the first checkpoint after the change to commit. ``moving``: the same task
        goes on on another worker, and the state returned (msgpack-able) is given to its
        new writer's :meth:`adopt`, which then holds and commits what this one prepared.
        Not ``moving`` (the task is removed), nobody adopts: what it prepared must reach
        the commit of another writer of the sink (Collect: pending files of the shared
        directory), or be written now. Called once; nothing follows but :meth:`abort`.
        The default closes and returns None."""
        self.close()
        return None

    def adopt(self, state: Any) -> None:
        """This writer continues a task that moved here: take over ``state`` (from the
        leaving writer's :meth:`hand_over`) before any write: its prepared transactions
        are now this writer's to commit, and to report in its next :meth:`prepare`."""

    def commit(self, checkpoint_id: int) -> None:
        """Step 3: checkpoint ``checkpoint_id`` is complete: make visible every
        transaction of this sink prepared at or before its barrier. It may come for a
        checkpoint this writer took no part in, twice, or never (a failure right after
        the checkpoint): :meth:`restore` then commits. Raises :class:`OSError` if it
        cannot (the next commit tries again)."""

    def restore(self, state: Any) -> None:
        """Step 4, before any write: recovered from the checkpoint whose :meth:`prepare`
        returned ``state``: commit what was prepared then, and take back everything
        written after it."""

    def close(self) -> None:
        """End of stream: write final results and make everything visible (the input is
        over: nothing will be replayed into it, short of a recovery, which takes it
        back). Called once."""

    def abort(self) -> None:
        """The task stops before its end (stopped, failed, or halted for a recovery):
        release resources now, writing no final results and committing nothing; what
        was written since the last :meth:`prepare` stays invisible until a
        :meth:`restore` takes it back. Called at most once, possibly after
        :meth:`close` (then it does nothing)."""


class Sink(ABC):
    """A picklable description of a sink."""

    exactly_once: bool = False
    """Whether its writers take part in checkpoints with a two-phase commit (see
    :class:`SinkWriter`); False: at-least-once through failures."""

    @abstractmethod
    def open(self, index: int, parallelism: int) -> SinkWriter:
        """The writer of task ``index`` of ``parallelism``."""
