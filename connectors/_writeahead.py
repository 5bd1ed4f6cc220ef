"""What the broker connectors share: the write-ahead sink writer and payload codecs.

A broker stream cannot hold a transaction open across a checkpoint (Redis has no
prepared-but-invisible XADD; a JetStream publish is visible at once), so a
:class:`WriteAheadWriter` keeps its output in memory and in the checkpoint instead
(write-ahead, :class:`~runtime.io.SinkWriter`'s two phases):

1. ``write``: records are encoded at once (an encoding error names the record) and
   buffered.
2. ``prepare(c)``: the buffer becomes *epoch* ``c`` (through the sink's ``compact``: an
   upsert keeps the latest record per key); the state returned (stored in
   checkpoint ``c``) is the writer's token and every epoch not yet known committed.
3. ``commit(c)``: every held epoch up to ``c`` is written, off the task's loop
   (:attr:`~runtime.io.SinkWriter.commits_off_loop`: the task writes and prepares on
   meanwhile; a lock guards the held epochs), through the broker's own idempotence (:meth:`WriteAheadWriter.write_epochs`: Redis a marker checked in the
   same MULTI/EXEC, JetStream message ids in its duplicate window), so that an epoch
   written twice (a commit, then the same commit after a recovery's restore) is visible
   once.
4. ``restore(state)``: adopt the state's token and write its epochs (their checkpoint is
   complete); what came after them was never written and is dropped.

The token names one run of one sink task: a fresh writer draws one, a restored writer
takes its checkpoint's, so a job run again from scratch (checkpoint ids from 1 again)
is never taken for a repeat of an earlier run.

A task that a reconfiguration moves to another worker (:meth:`hand_over` with
``moving``) writes nothing: its buffer becomes an epoch at the change's barrier and its
token and held epochs go to its new writer (:meth:`adopt`), which commits them with its
own as checkpoints complete, under the same identity (token and task index), so a
recovery to an earlier checkpoint finds them committed exactly as if the task had not
moved. At the end of the stream (:meth:`close`), and when the task is removed
(``hand_over`` without ``moving``: nobody adopts), the held epochs and the buffer are
written at once, the buffer as epoch ``last + 0.5`` (after the last prepared
checkpoint, before the next). A recovery to a checkpoint before that point replays
those last records: they are then written twice (at-least-once in those two cases
only; Collect takes its final file back, a stream cannot).

Errors: a write that the broker refuses or cannot take raises :class:`OSError` naming
the broker's address (the runtime logs a failed commit and the next commit, or a
recovery's restore, writes the epochs again).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, Literal

from runtime.io import SinkWriter

__all__ = ["Codec", "Epoch", "WriteAheadWriter", "decoder", "encoder"]

logger = logging.getLogger(__name__)

Codec = Literal["json", "utf-8", "bytes"]
Epoch = tuple[float, list]  # (checkpoint id, records in the broker's wire form)
CODECS = ("json", "utf-8", "bytes")

_to_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def check_codec(owner: str, field: str, value: Any) -> None:
    """Raise :class:`ValueError` naming ``owner.field`` unless ``value`` is a codec."""
    if value not in CODECS:
        raise ValueError(f"{owner}.{field} must be one of {CODECS}, got {value!r}")


def decoder(codec: Codec) -> Callable[[bytes], Any]:
    """bytes -> record: JSON (any document), UTF-8 text, or the bytes themselves. Raises
    :class:`ValueError` (``UnicodeDecodeError`` and ``JSONDecodeError`` are ones)."""
    if codec == "json":
        return json.loads
    if codec == "utf-8":
        return lambda data: data.decode("utf-8")
    return bytes


def encoder(codec: Codec) -> Callable[[Any], bytes]:
    """record -> bytes, the inverse of :func:`decoder`. Raises :class:`TypeError` for a
    record the codec cannot encode."""
    if codec == "json":
        return lambda value: _to_json(value).encode("utf-8")
    if codec == "utf-8":

        def utf8(value: Any) -> bytes:
            if not isinstance(value, str):
                raise TypeError(f"the utf-8 codec writes str records, got {value!r}")
            return value.encode("utf-8")

        return utf8

    def raw(value: Any) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"the bytes codec writes bytes records, got {value!r}")
        return bytes(value)

    return raw


class WriteAheadWriter(SinkWriter):
    """A sink task's writer that holds each epoch until its checkpoint completes (module
    docstring). Subclasses say how a record is encoded (:meth:`encode`) and how epochs
    are written idempotently (:meth:`write_epochs`, :meth:`write_now`)."""

    commits_off_loop = True  # commit writes held epochs only; a lock guards them

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the held epochs: commit's thread and the loop
        self._transactional = False
        self._token = secrets.token_hex(8)
        self._buffer: list = []  # encoded records since the last prepare
        self._held: list[Epoch] = []  # prepared, not known committed, in checkpoint order
        self._last: float = 0  # the id of its last prepare (or of the restored checkpoint)
        self._closed = False

    @property
    def token(self) -> str:
        """The run this writer's epochs belong to (module docstring)."""
        return self._token

    @abstractmethod
    def encode(self, value: Any) -> Any:
        """One record in the broker's wire form (msgpack-able: it goes into checkpoints)."""

    @abstractmethod
    def write_epochs(self, epochs: list[Epoch]) -> None:
        """Make ``epochs`` (of :attr:`token`) visible, each once whatever was written
        before: an epoch already written by this token is skipped or deduplicated.
        Raises :class:`OSError`."""

    @abstractmethod
    def write_now(self, records: list) -> None:
        """Without checkpoints: make ``records`` visible now. Raises :class:`OSError`."""

    def release(self) -> None:
        """Close connections; called once, by :meth:`close` or :meth:`abort`."""

    def compact(self, records: list) -> list:
        """An epoch's encoded records as they are held, put in its checkpoint and
        written: all of them by default. A sink whose later records replace earlier ones
        (an upsert by key) may keep only those that count. Called when the buffer
        becomes an epoch (at prepare and at close)."""
        return records

    def write(self, values: list) -> None:
        records = [self.encode(v) for v in values]
        if self._transactional:
            self._buffer += records
        elif records:
            self.write_now(records)

    def transactional(self) -> None:
        self._transactional = True

    def prepare(self, checkpoint_id: int) -> dict[str, Any] | None:
        if not self._transactional:
            return None
        epoch = (checkpoint_id, self.compact(self._buffer)) if self._buffer else None
        self._buffer = []
        self._last = checkpoint_id
        with self._lock:
            if epoch is not None:
                self._held.append(epoch)
            epochs = [[c, records] for c, records in self._held]
        return {"token": self._token, "checkpoint": checkpoint_id, "epochs": epochs}

    def commit(self, checkpoint_id: int) -> None:
        with self._lock:
            due = [epoch for epoch in self._held if epoch[0] <= checkpoint_id]
        if not due:
            return
        self.write_epochs(due)  # not under the lock: prepare goes on meanwhile
        with self._lock:  # only prepare ran meanwhile, appending after these
            del self._held[: len(due)]

    def restore(self, state: dict[str, Any]) -> None:
        self._token = str(state["token"])
        epochs = [(c, list(records)) for c, records in state["epochs"]]
        if epochs:
            self.write_epochs(epochs)
        self._last = state["checkpoint"]
        self._held, self._buffer = [], []

    def hand_over(self, barrier_id: int, moving: bool) -> dict[str, Any] | None:
        """Leaving at reconfiguration barrier ``barrier_id`` (module docstring): moving,
        its token and epochs (the buffer as epoch ``barrier_id``) for its new writer;
        removed, everything written now."""
        if not (moving and self._transactional):
            self.close()
            return None
        if self._closed:
            return None
        self._closed = True
        try:
            if self._buffer:
                self._held.append((barrier_id, self.compact(self._buffer)))
                self._buffer = []
            epochs = [[c, records] for c, records in self._held]
            return {"token": self._token, "checkpoint": self._last, "epochs": epochs}
        finally:
            self._held = []
            self.release()

    def adopt(self, state: dict[str, Any]) -> None:
        """Continue the task that moved here: its token, its last checkpoint and its
        epochs (committed with this writer's own as checkpoints complete)."""
        self._token = str(state["token"])
        self._last = max(self._last, state["checkpoint"])
        adopted = [(c, list(records)) for c, records in state["epochs"]]
        self._held = sorted([*adopted, *self._held], key=lambda epoch: epoch[0])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._buffer:
                self._held.append((self._last + 0.5, self.compact(self._buffer)))
                self._buffer = []
            if self._held:
                self.write_epochs(self._held)
                self._held = []
        finally:
            self.release()

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._buffer, self._held = [], []
        self.release()
