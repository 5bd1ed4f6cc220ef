"""NATS JetStream: a partitioned source (one partition per subject) and a sink.

:class:`JetStreamSource` reads the subjects of a stream, each subject a partition whose
position is the stream sequence of the last message returned (:mod:`.source`).
:class:`JetStreamSink` publishes records to a subject, exactly once with checkpoints
through the stream's duplicate window (:mod:`.sink`). Both take the connection settings
``servers``, ``tls_ca``, ``tls_cert``, ``tls_key`` and ``options`` (:mod:`.common`).

nats-py is asyncio-only and the runtime calls readers and writers synchronously on a
worker's event loop, so every client here runs on the process's :class:`IoLoop`, an
event loop in a thread of its own (:mod:`.common`).

Errors: :class:`UndecodableMessageError` (a :class:`ValueError`), a message the source
cannot decode when no ``dead_letter_subject`` is set; otherwise the builtin ones,
carrying their own message: :class:`ConnectionError` (no server answers, or it refuses
the credentials or the certificate), :class:`OSError` (a publish that fails) and
:class:`ValueError` (invalid settings, a missing stream).

The public classes name this package as their module (``__module__``), as they did when
it was one module: pickles (job graphs, checkpoints) and logic references
(``connectors.nats:JetStreamSource(...)``) read the same as before the split.
"""

# Besides the public names, the settings (``X as X``: the module constants of the single
# module this package was) stay readable here; each is read where it is defined.
from .common import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S
from .common import MSG_ID as MSG_ID
from .common import REQUEST_TIMEOUT_S as REQUEST_TIMEOUT_S
from .common import RETRY_MAX_S as RETRY_MAX_S
from .common import RETRY_MIN_S as RETRY_MIN_S
from .common import SETTLE_S as SETTLE_S
from .common import STOP_TIMEOUT_S as STOP_TIMEOUT_S
from .common import IoLoop
from .sink import ACK_TIMEOUT_S as ACK_TIMEOUT_S
from .sink import COMMIT_TIMEOUT_S as COMMIT_TIMEOUT_S
from .sink import EXPECTED_STREAM as EXPECTED_STREAM
from .sink import PUBLISH_WINDOW as PUBLISH_WINDOW
from .sink import JetStreamSink, JetStreamWriter
from .source import BUFFERED_MAX as BUFFERED_MAX
from .source import CONSUMER_INACTIVE_S as CONSUMER_INACTIVE_S
from .source import FETCH_BATCH as FETCH_BATCH
from .source import FETCH_WAIT_S as FETCH_WAIT_S
from .source import IDLE_S as IDLE_S
from .source import JetStreamReader, JetStreamSource, UndecodableMessageError

__all__ = [
    "IoLoop",
    "JetStreamReader",
    "JetStreamSink",
    "JetStreamSource",
    "JetStreamWriter",
    "UndecodableMessageError",
]

# Each public class names this package as its module, as when it was one module: pickles
# and logic references (``connectors.nats:JetStreamSource(...)``) read as they did.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
