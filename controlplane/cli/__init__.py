"""The ``streampilot`` command line.

Local, without a server: ``run`` (a job on local worker processes) and ``demo`` (starts a
StreamManager and drives a word count through REST). The StreamManager itself: ``server``
and ``db upgrade``. Over REST, one sub-app per resource: ``job``, ``abstraction``,
``reconfigure``, ``reconfig``, ``checkpoints``, ``savepoints``, ``workers``, ``code``, ``controller`` and
``token``; they find the server and token in ``--server`` / ``--token`` or
``STREAMPILOT_SERVER`` / ``STREAMPILOT_TOKEN`` (see :mod:`controlplane.cli.client`).

Exit status: 0 on success; 1 when the server refused or failed the request (its message
is printed on one line), or a job or reconfiguration failed; 2 for bad usage, a server
that does not answer (the address is named) or a local input that cannot be read.
"""

from __future__ import annotations

import typer

from controlplane.datasets.cli import app as dataset_app

from . import (
    abstraction,
    checkpoints,
    code,
    controllers,
    demo,
    jobs,
    reconfigs,
    reconfigure,
    savepoints,
    tokens,
    workers,
)
from .local import run
from .server import db_app, server

__all__ = ["app"]

app = typer.Typer(
    name="streampilot",
    help="A control plane for Python stream jobs.",
    no_args_is_help=True,
    add_completion=False,
)
app.command()(run)
app.command()(demo.demo)
app.command()(server)
app.add_typer(db_app, name="db")
app.add_typer(jobs.app, name="job")
app.add_typer(abstraction.app, name="abstraction")
app.add_typer(reconfigure.app, name="reconfigure")
app.add_typer(reconfigs.app, name="reconfig")
app.add_typer(checkpoints.app, name="checkpoints")
app.add_typer(savepoints.app, name="savepoints")
app.add_typer(workers.app, name="workers")
app.add_typer(code.app, name="code")
app.add_typer(controllers.app, name="controller")
app.add_typer(dataset_app, name="dataset")
app.add_typer(tokens.app, name="token")
