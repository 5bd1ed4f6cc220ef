"""The StreamManager's commands: ``db upgrade``, ``token create`` (CliRunner) and
``server`` (a real process, stopped with SIGTERM)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
from alembic.script import ScriptDirectory
from api_support import free_port, wait_until
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from controlplane import db
from controlplane.auth.service import hash_secret
from controlplane.cli import app

runner = CliRunner()


def test_db_upgrade_and_token_create(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    result = runner.invoke(app, ["db", "upgrade", "--db", url])
    assert result.exit_code == 0, result.output
    head = ScriptDirectory.from_config(db.alembic_config(url)).get_current_head()
    assert f"at revision {head}" in result.output

    result = runner.invoke(
        app, ["token", "create", "--scope", "admin", "--name", "ci", "--db", url]
    )
    assert result.exit_code == 0, result.output
    secret = result.stdout.strip()
    assert secret.startswith("sp_") and len(secret) > 40
    engine = create_engine(url)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT name, token_hash, scopes FROM tokens")).one()
    engine.dispose()
    assert row[0] == "ci" and row[1] == hash_secret(secret) and "admin" in row[2]


def test_bad_options_exit_2_with_one_line(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["token", "create", "--scope", "root", "--db", f"sqlite:///{tmp_path}/x.db"]
    )
    assert result.exit_code == 2
    assert "scopes must be" in result.output
    result = runner.invoke(app, ["db", "upgrade", "--db", "not a url"])
    assert result.exit_code == 2
    assert "database_url" in result.output
    result = runner.invoke(app, ["server", "--port", "1"], env={"STREAMPILOT_ADMIN_TOKEN": "short"})
    assert result.exit_code == 2
    assert "admin_token" in result.output and "at least 16 characters" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(
        app, ["server", "--port", "1"], env={"STREAMPILOT_PRECOPY_MIN_BYTES": "-3"}
    )
    assert result.exit_code == 2
    assert "precopy_min_bytes" in result.output and "greater than or equal to 0" in result.output


def test_server_command_serves_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controlplane.cli",
            "server",
            "--port",
            str(port),
            "--db",
            f"sqlite:///{tmp_path}/server.db",
            "--local-workers",
            "0",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def healthy() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 60, "the server to answer /healthz", every=0.2)
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs", timeout=5)
        assert r.status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=5)
    # uvicorn shuts down gracefully, then re-raises the signal it caught.
    assert proc.returncode in (0, -signal.SIGTERM), output.decode()
    assert b"Traceback" not in output, output.decode()
