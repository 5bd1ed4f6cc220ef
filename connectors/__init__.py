"""Connectors to real streams: partitioned sources (``runtime.io.PartitionedSource``) and
two-phase sinks (``runtime.io.SinkWriter``) for brokers and databases.

Each lives in a module or package of its own (Kafka, NATS and PostgreSQL are packages of
a few modules, each package's docstring the overview), imported by name (``from
connectors.kafka import KafkaSource``), so that a job pulls in only the client it uses
(the ``connectors`` extra installs them all).
"""
