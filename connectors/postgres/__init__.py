"""PostgreSQL: a sink writing rows (exactly once with checkpoints) and a table source read
by primary-key ranges as partitions.

:class:`PostgresSink` writes each record as a row of a table (insert or upsert, with
``COPY``), exactly once with checkpoints: a checkpoint's rows are written when it
completes, in one transaction with the task's row of the marker table
:data:`MARKER_TABLE` (:mod:`.sink`). :class:`PostgresTableSource` reads a table as a
snapshot, split into ranges of its integer unique key, one partition each, a reader's
position the last key it returned (:mod:`.source`).

Connection settings: ``dsn`` is a libpq connection string (``host=... port=... dbname=...
user=... sslmode=verify-full sslrootcert=...`` or ``postgresql://user@host:port/db?
sslmode=require``), so TLS, passwords (or ``PGPASSWORD`` / ``~/.pgpass``) and every libpq
option pass through it. Messages name the server as ``host:port/dbname`` and never
print the password.

Errors (exceptions carry their own message; none is a class of this package):

- :class:`ConnectionError` (an :class:`OSError`): the server cannot be reached when the
  source's partitions are listed (the submission is refused with it);
- :class:`OSError`: a writer cannot reach the server or loses it (the runtime logs a
  failed commit; the next commit, or a recovery's restore, writes the epochs again);
- :class:`ValueError`: invalid settings (naming the field), a missing table or column, a
  record that does not make a row, a row the table refuses (a value of the wrong type or
  too long, a NULL in a NOT NULL column, a duplicate key), each naming the table and
  the column and saying what to fix. Retrying does not mend these; in checkpointed mode
  a row the table refuses shows at the commit, logged there, and fails the task when it
  ends or recovers.

The modules, each stating its contract: :mod:`.common` (connections, the catalog
lookups), :mod:`.sink` and :mod:`.source`. The public classes name this package as their
module (``__module__``), as they did when it was one module: pickles (job graphs,
checkpoints) and logic references (``connectors.postgres:PostgresSink(...)``) read the
same as before the split.
"""

# Besides the public names, the settings (``X as X``: the module constants of the single
# module this package was) stay readable here; each is read where it is defined.
from .common import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S
from .common import server_of
from .sink import MARKER_TABLE, PostgresSink, PostgresWriter
from .source import PAGE_ROWS as PAGE_ROWS
from .source import RETRY_MAX_S as RETRY_MAX_S
from .source import RETRY_MIN_S as RETRY_MIN_S
from .source import PostgresTableReader, PostgresTableSource

__all__ = [
    "MARKER_TABLE",
    "PostgresSink",
    "PostgresTableReader",
    "PostgresTableSource",
    "PostgresWriter",
    "server_of",
]

# Each public class (and function) names this package as its module, as when it was one
# module: pickles and logic references read as they did.
for _obj in (PostgresSink, PostgresTableReader, PostgresTableSource, PostgresWriter, server_of):
    _obj.__module__ = __name__
del _obj
