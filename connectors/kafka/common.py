"""What the Kafka source and sink share: the package's errors (their tree is drawn in
:mod:`connectors.kafka`), the checks of settings (a :class:`ValueError` naming the
field, raised when a description is made) and the librdkafka configuration of every
client: ``bootstrap.servers``, librdkafka's log lines forwarded to this module's logger
(``connectors.kafka.common``, under the package's), then the description's ``config``
as is.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "AuthenticationFailedError",
    "BrokerUnreachableError",
    "KafkaConnectorError",
    "UndecodableRecordError",
]

logger = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 30.0  # prepare()/close(): every produced record acknowledged by then

Format = Literal["bytes", "utf-8", "json"]
_FORMATS = ("bytes", "utf-8", "json")


class KafkaConnectorError(RuntimeError):
    """Base of this package's errors."""


class BrokerUnreachableError(KafkaConnectorError, ConnectionError):
    """The brokers at ``bootstrap_servers`` did not answer in time."""


class AuthenticationFailedError(KafkaConnectorError, PermissionError):
    """The brokers at ``bootstrap_servers`` refused the credentials (SASL) in ``config``."""


class UndecodableRecordError(KafkaConnectorError, ValueError):
    """A record the source's deserializer cannot decode (no dead-letter topic is set)."""


def _check_choice(owner: str, name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {list(choices)}, got {value!r}")


def _client_config(owner: str, bootstrap: str, config: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(bootstrap, str) or not bootstrap:
        raise ValueError(
            f"{owner}.bootstrap_servers must be 'host:port[,host:port]', got {bootstrap!r}"
        )
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise ValueError(f"{owner}.config must be a dict of librdkafka settings, got {config!r}")
    return {"bootstrap.servers": bootstrap, "logger": logger, **config}
