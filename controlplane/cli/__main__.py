"""``python -m controlplane.cli``: the ``streampilot`` command."""

from controlplane.cli import app

app(prog_name="streampilot")
