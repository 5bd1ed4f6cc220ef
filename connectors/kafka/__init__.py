"""Kafka source and sink, through ``confluent-kafka`` (librdkafka): any Kafka-protocol
cluster; ``config`` is passed through to the client (TLS, SASL, timeouts...).

:class:`KafkaSource` is a :class:`~runtime.io.PartitionedSource`: its partitions are
``"<topic>-<n>"``; each is read by its own consumer, *assigned* that one partition (no
group rebalancing), and its position is the offset of the next record to read. Records
are the deserialized values, or :class:`KafkaRecord` with ``records="record"``.

:class:`KafkaSink` produces each record to a topic. With ``transactions=True`` (the
default) and checkpoints it is exactly-once, as Flink's two-phase Kafka sink: each sink
task has a pool of transactional producers taking turns (one holds the open transaction,
one the prepared one), and each epoch's records are also kept in the checkpoint, so that
a recovery produces again what the commit marker does not show committed. Without
transactions (``transactions=False``, for brokers that lack them) the sink is
at-least-once.

Errors::

    KafkaConnectorError (RuntimeError)
    ├── BrokerUnreachableError (also ConnectionError): no answer from bootstrap_servers
    ├── AuthenticationFailedError (also PermissionError): the brokers refused config's
    │   SASL credentials
    └── UndecodableRecordError (also ValueError): a record the deserializer refuses

Settings are checked when a description is made (:class:`ValueError` naming the field).

The modules, each stating its contract:

- :mod:`.common`: the errors, the checks of settings and the clients' configuration;
- :mod:`.source`: the source and the reader of one partition;
- :mod:`.sink`: the sink and its writer, with the steps of the exactly-once protocol;
- :mod:`.producers`: the writer's producers (the idempotent one, the transactional pool)
  and the commit marker.

The public classes name this package as their module (``__module__``), as they did when
it was one module: pickles (job graphs, checkpoints) and logic references
(``connectors.kafka:KafkaSource(...)``) read the same as before the split, and resolve
either way.
"""

# Besides the public names, the settings (``X as X``: the module constants of the single
# module this package was) stay readable here; each is read where it is defined.
from .common import FLUSH_TIMEOUT_S as FLUSH_TIMEOUT_S
from .common import (
    AuthenticationFailedError,
    BrokerUnreachableError,
    KafkaConnectorError,
    UndecodableRecordError,
)
from .common import Format as Format
from .producers import TXN_TIMEOUT_S as TXN_TIMEOUT_S
from .sink import ABORT_TIMEOUT_S as ABORT_TIMEOUT_S
from .sink import PREPARE_FLUSH_S as PREPARE_FLUSH_S
from .sink import SLOTS as SLOTS
from .sink import KafkaSink, KafkaSinkWriter
from .source import IDLE_POLL_S as IDLE_POLL_S
from .source import MAX_BATCH as MAX_BATCH
from .source import METADATA_TIMEOUT_S as METADATA_TIMEOUT_S
from .source import WATERMARK_TIMEOUT_S as WATERMARK_TIMEOUT_S
from .source import KafkaPartitionReader, KafkaRecord, KafkaSource

__all__ = [
    "AuthenticationFailedError",
    "BrokerUnreachableError",
    "KafkaConnectorError",
    "KafkaPartitionReader",
    "KafkaRecord",
    "KafkaSink",
    "KafkaSinkWriter",
    "KafkaSource",
    "UndecodableRecordError",
]

# Each public class names this package as its module, as when it was one module: pickles
# and logic references (``connectors.kafka:KafkaSource(...)``) read as they did.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
