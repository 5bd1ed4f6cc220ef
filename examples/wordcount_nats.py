"""Word count on real streams: sentences from NATS JetStream, running counts into a Redis
stream.

The counting is :mod:`examples.wordcount`'s (its :func:`~examples.wordcount.split_words`,
:func:`~examples.wordcount.count_word` and :func:`~examples.wordcount.reference`); only
the ends differ::

    sentences (JetStreamSource: each subject of the stream is a partition)
      -> split (flat_map) -> key_by(word) -> count (keyed) -> counts (RedisStreamSink)

The sink adds one entry per word occurrence, field ``value`` holding the JSON array
``[word, running count]``; the last count of each word is its total
(:func:`read_results`). With checkpoints the job is exactly once end to end: the
source's stream sequences are in the checkpoints and the sink adds each checkpoint's
entries in one MULTI/EXEC when it completes.

The producer publishes the sentences :mod:`examples.wordcount` generates for the same
params to ``<subject>.0`` ... ``<subject>.<partitions - 1>`` (sentence i to subject
i mod partitions) of a stream capturing ``<subject>.>``: the counts equal
:func:`reference` whatever the parallelism.

Usage (the same ``-p NAME=VALUE`` params for each step)::

    python -m examples.wordcount_nats produce -p records=20000
    streampilot run wordcount-nats -p bounded=true
    python -m examples.wordcount_nats check -p records=20000

``produce`` creates the stream if it is missing and refuses one that already holds
messages (the reference would not apply); ``check`` compares the Redis stream with
:func:`reference` and exits 1 if they differ.

``build(params)`` parameters (all optional):

- ``servers`` (str, "nats://127.0.0.1:4222"), ``stream`` (str, "SENTENCES"), ``subject``
  (str, "sentences"), ``partitions`` (int, 4): where the sentences are.
- ``redis_url`` (str, "redis://127.0.0.1:6379/0"), ``output`` (str, "word-counts"): the
  Redis stream the counts go to.
- ``records`` (20000), ``words``, ``keys`` (1000), ``zipf``, ``omega``, ``seed``: the
  sentences ``produce`` publishes and :func:`reference` counts (as in
  :mod:`examples.wordcount`); the job itself reads what the stream holds.
- ``parallelism`` (int, 2): tasks per operator; ``max_parallelism`` (int, 128).
- ``bounded`` (bool, false): each subject ends at the last message it had when its
  reader first reached the server, so the job finishes; else it runs until stopped.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

import nats
import redis
from nats.js.errors import NotFoundError

from connectors.nats import JetStreamSource
from connectors.redis import RedisStreamSink
from runtime import Dataflow
from runtime.params import parse_params

from . import _steps as steps
from . import wordcount
from ._steps import differences
from .wordcount import count_word, split_words, word_key

__all__ = ["Params", "build", "check", "produce", "read_counts", "read_results", "reference"]

PUBLISH_WINDOW = 1_000  # publishes awaiting their acknowledgement at once
NATS_TIMEOUT_S = 10.0  # a JetStream request (stream info, creation, an acknowledgement)


@dataclass(frozen=True)
class Params:
    servers: str = "nats://127.0.0.1:4222"
    stream: str = "SENTENCES"
    subject: str = "sentences"
    partitions: int = 4
    redis_url: str = "redis://127.0.0.1:6379/0"
    output: str = "word-counts"
    records: int = 20_000
    words: int = 8
    keys: int = 1_000
    zipf: float = 1.0
    omega: float = 0.0
    seed: int = 42
    parallelism: int = 2
    max_parallelism: int = 128
    bounded: bool = False

    def __post_init__(self) -> None:
        for name in ("partitions", "parallelism", "max_parallelism", "words", "keys"):
            if getattr(self, name) < 1:
                raise ValueError(f"param {name!r} must be >= 1, got {getattr(self, name)}")
        if self.records < 1:
            raise ValueError(
                f"param 'records' must be >= 1 (the sentences published), got {self.records}"
            )

    def sentences(self) -> wordcount.Params:
        """The :mod:`examples.wordcount` params generating the same sentences."""
        fields = ("records", "words", "keys", "zipf", "omega", "seed")
        return wordcount.Params(**{f: getattr(self, f) for f in fields})


def build(params: dict[str, Any] | None = None) -> Dataflow:
    p = parse_params(Params, params)
    source = JetStreamSource(servers=p.servers, stream=p.stream, codec="utf-8", bounded=p.bounded)
    sink = RedisStreamSink(url=p.redis_url, stream=p.output, codec="json")
    flow = Dataflow("wordcount_nats")
    sentences = flow.source("sentences", source, parallelism=p.parallelism)
    words = sentences.rebalance().flat_map("split", split_words, parallelism=p.parallelism)
    counts = words.key_by(word_key).process(
        "count", count_word, parallelism=p.parallelism, max_parallelism=p.max_parallelism
    )
    counts.sink("counts", sink, parallelism=p.parallelism)
    return flow


def reference(params: dict[str, Any] | None = None) -> dict[str, int]:
    """Each word's total over the sentences :func:`produce` published
    (:func:`examples.wordcount.reference`, computed in this process)."""
    p = parse_params(Params, params)
    return wordcount.reference(asdict(p.sentences()))


# --- the ends: JetStream and Redis --------------------------------------------------------


async def _publish(p: Params, sentences: list[str]) -> None:
    client = await nats.connect(p.servers, connect_timeout=NATS_TIMEOUT_S)
    try:
        js = client.jetstream(timeout=NATS_TIMEOUT_S)
        try:
            info = await js.stream_info(p.stream)
        except NotFoundError:
            await js.add_stream(name=p.stream, subjects=[f"{p.subject}.>"])
        else:
            if info.state.messages:
                raise SystemExit(
                    f"stream {p.stream!r} already holds {info.state.messages} messages: publish "
                    "to a new stream, or the counts will not be the reference's"
                )
        for start in range(0, len(sentences), PUBLISH_WINDOW):
            window = sentences[start : start + PUBLISH_WINDOW]
            acks = [
                await js.publish_async(
                    f"{p.subject}.{(start + i) % p.partitions}", s.encode(), stream=p.stream
                )
                for i, s in enumerate(window)
            ]
            await asyncio.gather(*acks)
    finally:
        await client.close()


def produce(params: dict[str, Any] | None = None) -> int:
    """Publish the seeded sentences (the stream created if missing, refused if it holds
    messages); returns how many."""
    p = parse_params(Params, params)
    reader = wordcount.source_of(p.sentences()).open(0, 1, 0.0)
    sentences: list[str] = []
    while (polled := reader.poll(float("inf"), 65536)) is not None:
        sentences += polled[0]
    asyncio.run(_publish(p, sentences))
    return len(sentences)


def read_counts(params: dict[str, Any] | None = None) -> list[tuple[str, int]]:
    """Every ``(word, running count)`` entry of the output stream, sorted (an entry added
    twice shows twice)."""
    p = parse_params(Params, params)
    client = redis.Redis.from_url(p.redis_url)
    try:
        return sorted(tuple(json.loads(f[b"value"])) for _id, f in client.xrange(p.output))
    finally:
        client.close()


def read_results(params: dict[str, Any] | None = None) -> dict[str, int]:
    """Each word's final count in the output stream (its highest running count)."""
    totals: dict[str, int] = {}
    for word, n in read_counts(params):
        totals[word] = max(n, totals.get(word, 0))
    return totals


def check(params: dict[str, Any] | None = None) -> str | None:
    """None if the output stream holds each word's running counts 1..total once (the
    totals :func:`reference`'s), else what differs."""
    want = [(w, n) for w, total in reference(params).items() for n in range(1, total + 1)]
    return differences("counts", read_counts(params), want)


def main(argv: list[str] | None = None) -> int:
    return steps.main(
        "python -m examples.wordcount_nats",
        lambda params: f"{produce(params)} sentences published",
        check,
        lambda params: f"{len(reference(params))} words, counts equal to the reference",
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
