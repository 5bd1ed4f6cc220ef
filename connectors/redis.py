"""Redis Streams: a partitioned source (one partition per stream key) and a sink (XADD).

:class:`RedisStreamSource`
    Each stream key is a partition: the ``streams`` named, plus, with a ``pattern``, the
    stream keys ``SCAN MATCH pattern TYPE stream`` finds (looked for again every
    ``discovery_interval_s`` by the runtime). A partition's reader polls with a
    non-blocking ``XREAD COUNT n STREAMS key <last id>``; its position is the id of the
    last entry it returned (``"0-0"``: none yet) and :meth:`RedisStreamReader.seek`
    resumes after an id. ``start="$"`` makes a reader without a position start after
    the entry that is last when it first reaches Redis. ``bounded=True`` stops each
    partition at the entry that was last when its reader first reached Redis, so that
    a job over streams that are not being written finishes.

    Records: the entry's field map as a ``dict`` of ``str`` (``field=None``), or the
    value of one field decoded by ``codec`` (JSON, UTF-8 or bytes). An entry that cannot
    be decoded (or lacks ``field``) makes :meth:`~RedisStreamReader.poll` return the
    entries before it, then raise :class:`UndecodableEntryError` naming the stream and
    the entry id, unless ``dead_letter_stream`` is set: the entry then goes, its fields
    as they are, to that stream (``XADD``, before the reader's position passes it), with
    the fields ``streampilot-source`` (the URL, without its password),
    ``streampilot-stream``, ``streampilot-id`` and ``streampilot-error`` added, and the
    reader goes on. A recovery to a checkpoint taken before an entry was dead-lettered
    adds it again (at-least-once).

    Losing Redis: a read that fails with a connection error or a timeout returns an
    empty batch; the reader retries with exponential backoff (:data:`RETRY_MIN_S` to
    :data:`RETRY_MAX_S`) and says why in :attr:`RedisStreamReader.stalled` until a read
    succeeds. Nothing is lost: it reads again after the last id it returned. A stream
    deleted while it is read looks like a stream with nothing new (Redis does not tell
    them apart); a bounded reader of it ends once it has read up to its bound.

:class:`RedisStreamSink`
    Writes each record as a stream entry (``XADD``, optionally capped by ``maxlen``,
    approximately). With checkpoints it is exactly once through
    :class:`~connectors._writeahead.WriteAheadWriter`: the entries of each checkpoint
    are added, when it completes, in one ``MULTI``/``EXEC`` together with the task's
    marker key ``streampilot:commit:<name>:<index>`` (``"<token> <checkpoint id>"``),
    watched, so that an epoch committed twice (a commit, then the restore of a recovery)
    is added once. One marker per sink task: the keys stay bounded. Two jobs that write
    at the same time through sinks of the same ``name`` must use different names.
    Readers see entries only once their checkpoint is complete (read-committed).

Settings common to both: ``url`` (``redis://`` or ``rediss://`` for TLS, with user,
password and database, as redis-py reads it) and ``options``, keyword arguments passed
through to :meth:`redis.Redis.from_url` (``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile``, ``password``...). Errors that name the server print the URL without
its password.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import redis

from runtime.io import PartitionedSource, Sink, SourceReader

from ._writeahead import Codec, Epoch, WriteAheadWriter, check_codec, decoder, encoder

__all__ = [
    "RedisStreamReader",
    "RedisStreamSink",
    "RedisStreamSource",
    "RedisStreamWriter",
    "UndecodableEntryError",
    "redacted",
]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0  # an unreachable host fails a read (or the submission) this fast
IO_TIMEOUT_S = 10.0  # longest a command may take before the connection counts as lost
RETRY_MIN_S = 0.05  # first wait after a failed read; doubles up to RETRY_MAX_S
RETRY_MAX_S = 5.0  # longest wait between two attempts to reach a lost Redis
IDLE_S = 0.02  # a reader that found nothing new reads again after this long
WATCH_RETRIES = 10  # commits that lose a race on their marker before the commit fails
MARKER_PREFIX = "streampilot:commit"
DEAD_LETTER_FIELDS = ("streampilot-source", "streampilot-stream", "streampilot-id",
                      "streampilot-error")  # fmt: skip

_ID = re.compile(r"(\d+)-(\d+)")


class UndecodableEntryError(ValueError):
    """An entry the source cannot decode, and no ``dead_letter_stream`` is set."""


def redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _parse_id(value: str) -> tuple[int, int]:
    match = _ID.fullmatch(value)
    if match is None:
        raise ValueError(f"a Redis stream position is an entry id 'ms-seq', got {value!r}")
    return int(match[1]), int(match[2])


def _client(url: str, options: Mapping[str, Any]) -> redis.Redis:
    settings = {"socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": IO_TIMEOUT_S}
    return redis.Redis.from_url(url, **{**settings, **options})


@dataclass(frozen=True, kw_only=True)
class RedisStreamSource(PartitionedSource):
    """Stream keys of one Redis as partitions; see the module docstring."""

    url: str = "redis://127.0.0.1:6379"
    streams: tuple[str, ...] = ()
    pattern: str | None = None
    start: Literal["0", "$"] = "0"
    field: str | None = None
    codec: Codec = "utf-8"
    bounded: bool = False
    discovery_interval_s: float | None = None
    dead_letter_stream: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "streams", tuple(self.streams))
        if not self.streams and self.pattern is None:
            raise ValueError(f"{owner} needs streams or a pattern to find them by")
        if self.start not in ("0", "$"):
            raise ValueError(f"{owner}.start must be '0' (oldest) or '$' (new), got {self.start!r}")
        check_codec(owner, "codec", self.codec)
        dead = self.dead_letter_stream
        if dead is not None:
            if not (isinstance(dead, str) and dead):
                raise ValueError(
                    f"{owner}.dead_letter_stream must be a stream key or None, got {dead!r}"
                )
            if dead in self.streams or (
                self.pattern is not None and fnmatch.fnmatchcase(dead, self.pattern)
            ):
                raise ValueError(
                    f"{owner}.dead_letter_stream {dead!r} is one of the streams it reads: "
                    "its dead letters would be read again; choose a key outside them"
                )

    def partitions(self) -> list[str]:
        """The ``streams`` and the stream keys ``pattern`` matches now, sorted. Raises
        :class:`ConnectionError` naming the URL when Redis cannot be reached."""
        found = set(self.streams)
        if self.pattern is not None:
            client = _client(self.url, self.options)
            try:
                keys = client.scan_iter(match=self.pattern, count=1000, _type="stream")
                found.update(k.decode() for k in keys)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise ConnectionError(
                    f"cannot reach Redis at {redacted(self.url)} to list the streams "
                    f"matching {self.pattern!r}: {exc}"
                ) from exc
            finally:
                client.close()
        elif self.streams:
            _check_reachable(self.url, self.options)
        return sorted(found)

    def open_partition(self, partition: str, start_time: float) -> RedisStreamReader:
        return RedisStreamReader(self, partition)


def _check_reachable(url: str, options: Mapping[str, Any]) -> None:
    client = _client(url, options)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ConnectionError(f"cannot reach Redis at {redacted(url)}: {exc}") from exc
    finally:
        client.close()


class RedisStreamReader(SourceReader):
    """Reads one stream key; see the module docstring. It reaches Redis at its first
    poll (not when opened), so that opening never waits on the network."""

    def __init__(self, source: RedisStreamSource, key: str) -> None:
        self._source = source
        self._key = key
        self._client = _client(source.url, source.options)
        self._decode: Callable[[bytes], Any] = decoder(source.codec)
        self._last: str = "0-0" if source.start == "0" else "$"  # "$": not resolved yet
        self._bound: tuple[int, int] | None = None  # bounded: the last id when it started
        self._started = False
        self._failures = 0
        self._retry_at = 0.0  # time.monotonic() before which it does not try again
        self._idle = False
        self.stalled: str | None = None
        """Why it cannot read now (Redis lost), None while reads succeed."""

    def _start(self) -> None:
        """Resolve ``$`` and the bound: the id of the stream's last entry now."""
        if self._last == "$" or self._source.bounded:
            newest = self._client.xrevrange(self._key, count=1)
            last = newest[0][0].decode() if newest else "0-0"
            if self._last == "$":
                self._last = last
            if self._source.bounded:
                self._bound = _parse_id(last)
        self._started = True

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        if time.monotonic() < self._retry_at:
            return [], []
        try:
            if not self._started or self._last == "$":
                self._start()
            if self._bound is not None and _parse_id(self._last) >= self._bound:
                return None
            last = self._last
            reply = self._client.xread({self._key: last}, count=max_records)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._lost(exc)
            return [], []
        if self.stalled is not None:
            logger.info("stream %s of %s: read again", self._key, redacted(self._source.url))
        self._failures, self.stalled = 0, None
        entries = _entries(reply)
        if self._bound is not None:
            entries = [(i, f) for i, f in entries if _parse_id(i.decode()) <= self._bound]
        values: list = []
        dead: list[tuple[bytes, Mapping[bytes, bytes], str]] = []
        for entry_id, fields in entries:
            try:
                values.append(self._record(fields))
            except (KeyError, ValueError) as exc:
                if self._source.dead_letter_stream is None and values:
                    break  # the entries before it first; the next poll raises
                dead.append((entry_id, fields, self._undecodable(entry_id, exc)))
            self._last = entry_id.decode()
        if dead:
            try:
                self._dead_letter(dead)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._last = last  # read the batch again once Redis is back
                self._lost(exc)
                return [], []
        self._idle = not values
        return values, [now] * len(values)

    def _record(self, fields: Mapping[bytes, bytes]) -> Any:
        """The record of an entry's ``fields``; KeyError, ValueError."""
        if self._source.field is None:
            return {k.decode(): v.decode() for k, v in fields.items()}
        return self._decode(fields[self._source.field.encode()])

    def _undecodable(self, entry_id: bytes, exc: Exception) -> str:
        """Why the entry ``entry_id`` is not a record; raises
        :class:`UndecodableEntryError` saying what to fix without a dead-letter stream."""
        field = self._source.field
        if field is None:
            what = f"cannot decode its field map as UTF-8 text ({exc})"
        elif isinstance(exc, KeyError):
            what = f"no field {field!r}"
        else:
            what = f"cannot decode field {field!r} as {self._source.codec} ({exc})"
        why = f"Redis stream {self._key!r}, entry {entry_id.decode()}: {what}"
        if self._source.dead_letter_stream is None:
            raise UndecodableEntryError(
                f"{why}; fix its producer, choose another field or codec, or set "
                "dead_letter_stream to set such entries aside"
            ) from exc
        return why

    def _dead_letter(self, dead: list[tuple[bytes, Mapping[bytes, bytes], str]]) -> None:
        """Add the entries ``dead`` (id, fields, why) to the dead-letter stream, in one
        pipeline; raises :class:`redis.ConnectionError` or :class:`redis.TimeoutError`
        (then some may have been added: they are added again)."""
        source = redacted(self._source.url)
        with self._client.pipeline(transaction=False) as pipe:
            for entry_id, fields, why in dead:
                named = dict(
                    zip(DEAD_LETTER_FIELDS, (source, self._key, entry_id, why), strict=True)
                )
                pipe.xadd(self._source.dead_letter_stream, {**fields, **named})
            pipe.execute()
        logger.warning(
            "stream %s of %s: %d entries sent to dead-letter stream %r (first: %s)",
            self._key, source, len(dead), self._source.dead_letter_stream, dead[0][2],
        )  # fmt: skip

    def _lost(self, exc: Exception) -> None:
        delay = min(RETRY_MIN_S * 2**self._failures, RETRY_MAX_S)
        self._failures += 1
        self._retry_at = time.monotonic() + delay
        if self.stalled is None:
            logger.warning(
                "stream %s of %s: cannot read (%s); retrying",
                self._key,
                redacted(self._source.url),
                exc,
            )
        self.stalled = f"cannot reach Redis at {redacted(self._source.url)}: {exc}"

    def next_due(self, now: float) -> float:
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            return now + wait
        return now + IDLE_S if self._idle else now

    def position(self) -> str:
        """The id of the last entry returned (``"$"``: a reader with ``start="$"`` that
        has not reached Redis yet, which a seek takes as its own start)."""
        return self._last

    def seek(self, position: Any) -> None:
        if position != "$" and not (isinstance(position, str) and _ID.fullmatch(position)):
            raise ValueError(
                f"a Redis stream position is an entry id 'ms-seq' or '$', got {position!r}"
            )
        self._last = position
        self._idle = False

    def close(self) -> None:
        self._client.close()


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of an XREAD reply of one stream (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    if isinstance(reply, Mapping):
        (entries,) = reply.values()
        return entries[0] if entries and isinstance(entries[0], list) else entries
    return reply[0][1]


@dataclass(frozen=True, kw_only=True)
class RedisStreamSink(Sink):
    """Add records to the stream ``stream``; see the module docstring. ``field``: the
    entry field holding the record encoded by ``codec`` (None: a record is a mapping
    written as the entry's field map). ``name``: the markers' namespace (default:
    ``stream``)."""

    url: str = "redis://127.0.0.1:6379"
    stream: str
    field: str | None = "value"
    codec: Codec = "json"
    maxlen: int | None = None
    name: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    exactly_once = True  # with checkpoints: write-ahead, marker in the same MULTI/EXEC

    def __post_init__(self) -> None:
        check_codec(type(self).__name__, "codec", self.codec)
        if self.maxlen is not None and self.maxlen < 1:
            raise ValueError(f"RedisStreamSink.maxlen must be >= 1, got {self.maxlen!r}")

    def open(self, index: int, parallelism: int) -> RedisStreamWriter:
        return RedisStreamWriter(self, index)


class RedisStreamWriter(WriteAheadWriter):
    """Sink task ``index``'s writer (module docstring)."""

    def __init__(self, sink: RedisStreamSink, index: int) -> None:
        super().__init__()
        self._sink = sink
        self._client = _client(sink.url, sink.options)
        self._encode = encoder(sink.codec)
        self.marker = f"{MARKER_PREFIX}:{sink.name or sink.stream}:{index}"

    def encode(self, value: Any) -> Any:
        if self._sink.field is not None:
            return self._encode(value)
        if not isinstance(value, Mapping):
            raise TypeError(f"RedisStreamSink with field=None writes mappings, got {value!r}")
        return {str(k): v for k, v in value.items()}

    def _add(self, pipe: Any, records: list) -> None:
        name, fld, maxlen = self._sink.stream, self._sink.field, self._sink.maxlen
        for record in records:
            pipe.xadd(name, {fld: record} if fld is not None else record, maxlen=maxlen)

    def _failed(self, exc: Exception) -> OSError:
        return OSError(f"cannot add to Redis stream {self._sink.stream!r} at "
                       f"{redacted(self._sink.url)}: {exc}")  # fmt: skip

    def write_now(self, records: list) -> None:
        try:
            with self._client.pipeline(transaction=False) as pipe:
                self._add(pipe, records)
                pipe.execute()
        except redis.RedisError as exc:
            raise self._failed(exc) from exc

    def write_epochs(self, epochs: list[Epoch]) -> None:
        """Add the epochs after the marker's checkpoint (all of them if the marker is
        another run's) and move the marker, in one MULTI/EXEC watched on the marker."""
        try:
            for _ in range(WATCH_RETRIES):
                with self._client.pipeline(transaction=True) as pipe:
                    try:
                        pipe.watch(self.marker)
                        done = self._committed(pipe.get(self.marker))
                        todo = [(c, records) for c, records in epochs if c > done]
                        if not todo:
                            return
                        pipe.multi()
                        for _c, records in todo:
                            self._add(pipe, records)
                        pipe.set(self.marker, f"{self.token} {todo[-1][0]}")
                        pipe.execute()
                        return
                    except redis.WatchError:
                        continue
        except redis.RedisError as exc:
            raise self._failed(exc) from exc
        raise OSError(f"{self.marker} kept changing during {WATCH_RETRIES} commits")

    def _committed(self, marker: bytes | None) -> float:
        """The last checkpoint id this writer's run committed (-1: none)."""
        if marker is None:
            return -1
        token, _, checkpoint = marker.decode().partition(" ")
        return float(checkpoint) if token == self.token else -1

    def release(self) -> None:
        self._client.close()
