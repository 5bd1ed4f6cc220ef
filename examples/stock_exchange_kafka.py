"""Stock exchange on real streams: orders from a Kafka topic, trades into a PostgreSQL table.

The matching is :mod:`examples.stock_exchange`'s (its :class:`~examples.stock_exchange.Match`
and :func:`~examples.stock_exchange.reference`); only the ends differ::

    orders (KafkaSource, ``sources`` tasks, one partition of the topic per reader)
      -> key_by(symbol) -> match (keyed: limit order book) -> trades (PostgresSink)

Orders are JSON arrays ``[order_id, symbol, side, price, qty]``; trades are rows
``(symbol, buy_order, sell_order, price, qty)`` of ``table``. With checkpoints the job is
exactly once end to end: the source's offsets are in the checkpoints and the sink writes
each checkpoint's trades in one transaction when it completes.

The producer writes the orders :mod:`examples.stock_exchange` generates for the same
params, keyed by symbol, so each stock's orders are in one partition, in order: whatever
``sources`` and ``parallelism``, and however partitions move between source tasks, the
trades equal :func:`reference` (matching depends only on the order of a stock's orders).

Usage (the same ``-p NAME=VALUE`` params for each step)::

    python -m examples.stock_exchange_kafka produce -p bootstrap_servers=127.0.0.1:9092 \\
        -p dsn='host=127.0.0.1 dbname=shop user=app' -p records=20000
    streampilot run stock-exchange-kafka -p bootstrap_servers=127.0.0.1:9092 \\
        -p dsn='host=127.0.0.1 dbname=shop user=app' -p bounded=true
    python -m examples.stock_exchange_kafka check -p dsn='host=127.0.0.1 dbname=shop user=app' \\
        -p records=20000

``produce`` creates the topic (``partitions`` partitions) and the trades table if they are
missing, and refuses a topic that already holds records (the reference would not apply);
``check`` compares the table with :func:`reference` and exits 1 if they differ.

``build(params)`` parameters (all optional):

- ``bootstrap_servers`` (str, "127.0.0.1:9092"), ``topic`` (str, "orders"): where orders are.
- ``partitions`` (int, 4): partitions of the topic ``produce`` creates.
- ``dsn`` (str, "host=127.0.0.1 port=5432 user=postgres dbname=postgres"): a libpq
  connection string; ``table`` (str, "trades"): the table trades go to.
- ``records``, ``keys`` (50), ``zipf``, ``omega``, ``seed``: the orders ``produce`` writes
  and :func:`reference` matches (as in :mod:`examples.stock_exchange`); the job itself
  reads what the topic holds.
- ``sources`` (int, 2): tasks of the order source; ``parallelism`` (int, 2): tasks of
  match and of the sink; ``max_parallelism`` (int, 128), ``depth`` (int, 100),
  ``work_us`` (float, 0): as in :mod:`examples.stock_exchange`.
- ``bounded`` (bool, false): each partition ends where its reader first finds its end
  (``stop_at="end"``), so the job finishes; else it runs until stopped.
- ``group_id`` (str, ""): a consumer group the checkpointed offsets are committed to
  (for lag tooling); empty: none.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from connectors.kafka import KafkaSource
from connectors.postgres import PostgresSink
from runtime import Dataflow
from runtime.params import parse_params

from . import _steps as steps
from . import stock_exchange
from ._steps import differences
from .stock_exchange import Match, Trade, order_symbol

__all__ = [
    "COLUMNS",
    "Params",
    "build",
    "check",
    "create_table",
    "produce",
    "read_trades",
    "reference",
]

COLUMNS = ("symbol", "buy_order", "sell_order", "price", "qty")
KAFKA_TIMEOUT_S = 30.0  # a topic's creation or metadata, and the producer's last acknowledgements


@dataclass(frozen=True)
class Params:
    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "orders"
    partitions: int = 4
    dsn: str = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    table: str = "trades"
    records: int = 20_000
    keys: int = 50
    zipf: float = 1.0
    omega: float = 2.0
    seed: int = 42
    sources: int = 2
    parallelism: int = 2
    max_parallelism: int = 128
    depth: int = 100
    work_us: float = 0.0
    bounded: bool = False
    group_id: str = ""

    def __post_init__(self) -> None:
        for name in ("partitions", "sources", "parallelism", "max_parallelism", "depth", "keys"):
            if getattr(self, name) < 1:
                raise ValueError(f"param {name!r} must be >= 1, got {getattr(self, name)}")
        if self.records < 1:
            raise ValueError(
                f"param 'records' must be >= 1 (the orders produced), got {self.records}"
            )

    def orders(self) -> stock_exchange.Params:
        """The :mod:`examples.stock_exchange` params generating the same orders."""
        fields = ("records", "keys", "zipf", "omega", "seed", "depth")
        return stock_exchange.Params(**{f: getattr(self, f) for f in fields})


def build(params: dict[str, Any] | None = None) -> Dataflow:
    p = parse_params(Params, params)
    source = KafkaSource(
        p.bootstrap_servers,
        p.topic,
        deserializer="json",
        stop_at="end" if p.bounded else None,
        group_id=p.group_id or None,
    )
    sink = PostgresSink(dsn=p.dsn, table=p.table, columns=COLUMNS)
    flow = Dataflow("stock_exchange_kafka")
    orders = flow.source("orders", source, parallelism=p.sources)
    trades = orders.key_by(order_symbol).process(
        "match",
        Match(p.depth, p.work_us),
        parallelism=p.parallelism,
        max_parallelism=p.max_parallelism,
    )
    trades.sink("trades", sink, parallelism=p.parallelism)
    return flow


def reference(params: dict[str, Any] | None = None) -> list[Trade]:
    """The trades, sorted, that a run over the orders :func:`produce` wrote leaves in the
    table (:func:`examples.stock_exchange.reference`, computed in this process)."""
    p = parse_params(Params, params)
    return stock_exchange.reference(asdict(p.orders()))["trades"]


# --- the ends: topic and table ------------------------------------------------------------


def create_table(params: dict[str, Any] | None = None) -> None:
    """The trades table, if missing."""
    p = parse_params(Params, params)
    ddl = sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (symbol text NOT NULL, buy_order bigint NOT NULL,"
        " sell_order bigint NOT NULL, price double precision NOT NULL, qty integer NOT NULL)"
    ).format(sql.Identifier(*p.table.split(".")))
    with psycopg.connect(p.dsn, autocommit=True) as conn:
        conn.execute(ddl)


def _ensure_empty_topic(p: Params) -> None:
    """Create the topic with ``partitions`` partitions, or check the one there is empty."""
    admin = AdminClient({"bootstrap.servers": p.bootstrap_servers})
    new = NewTopic(p.topic, num_partitions=p.partitions, replication_factor=1)
    try:
        admin.create_topics([new], request_timeout=KAFKA_TIMEOUT_S)[p.topic].result(KAFKA_TIMEOUT_S)
        return
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    consumer = Consumer({"bootstrap.servers": p.bootstrap_servers, "group.id": "produce-check"})
    try:
        meta = admin.list_topics(p.topic, timeout=KAFKA_TIMEOUT_S).topics[p.topic]
        for n in meta.partitions:
            _low, high = consumer.get_watermark_offsets(TopicPartition(p.topic, n), KAFKA_TIMEOUT_S)
            if high > 0:
                raise SystemExit(
                    f"topic {p.topic!r} already holds records (partition {n}): produce to a new "
                    "topic, or the trades will not be the reference's"
                )
    finally:
        consumer.close()


def produce(params: dict[str, Any] | None = None) -> int:
    """Write the seeded orders to the topic (created if missing, refused if not empty),
    keyed by symbol, and create the trades table if missing; returns how many."""
    p = parse_params(Params, params)
    _ensure_empty_topic(p)
    create_table(params)
    producer = Producer({
        "bootstrap.servers": p.bootstrap_servers, "enable.idempotence": True, "linger.ms": 20,
    })  # fmt: skip
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err.str())

    reader = stock_exchange.source_of(p.orders()).open(0, 1, 0.0)
    sent = 0
    while (polled := reader.poll(float("inf"), 4096)) is not None:
        for order in polled[0]:
            value = json.dumps(order, separators=(",", ":")).encode()
            while True:
                try:
                    producer.produce(p.topic, value, order_symbol(order), on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            sent += 1
        producer.poll(0)
    left = producer.flush(KAFKA_TIMEOUT_S)
    if left or errors:
        raise RuntimeError(f"{left} orders unacknowledged by {p.topic!r}, errors: {errors[:3]}")
    return sent


def read_trades(params: dict[str, Any] | None = None) -> list[Trade]:
    """Every row of the trades table, sorted (a trade written twice shows twice)."""
    p = parse_params(Params, params)
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(map(sql.Identifier, COLUMNS)), sql.Identifier(*p.table.split("."))
    )
    with psycopg.connect(p.dsn) as conn:
        return sorted(conn.execute(query).fetchall())


def check(params: dict[str, Any] | None = None) -> str | None:
    """None if the table holds exactly the reference's trades, else what differs."""
    return differences("trades", read_trades(params), reference(params))


def main(argv: list[str] | None = None) -> int:
    return steps.main(
        "python -m examples.stock_exchange_kafka",
        lambda params: f"{produce(params)} orders produced",
        check,
        lambda params: f"{len(reference(params))} trades, equal to the reference",
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
