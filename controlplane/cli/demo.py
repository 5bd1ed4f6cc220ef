"""``streampilot demo``: the StreamManager driven through REST, end to end.

Steps (each bounded; the whole demo takes about ``--duration`` plus 15 s):

1. Create a database in a temporary directory and an admin token in it.
2. Start ``streampilot server`` (a child process: SQLite, local workers, a free port) and
   wait for ``/healthz``; print the console's address and the token.
3. Submit the word count (``examples.wordcount:build``): Zipf-skewed words whose
   popularity reshuffles, ``rate x duration`` sentences, final counts written to files.
4. While it runs, through REST: scale the count operator out by one task, rebalance it
   on its measured load, and swap its logic to ``count_word_v2``; print each
   reconfiguration's timings and pauses, and the job's rates in between.
5. Wait for the job to finish (stop it if it has not by ``duration + FINISH_GRACE_S``).
6. Stop the server (SIGTERM: it stops its workers), then compare the final counts with
   the word count computed in this process: equal, word for word, if the job finished
   (exit 1 if not; a stopped job's partial counts are only reported).
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from .client import ApiError, Client, ClientError
from .output import console, err, fail, fmt_ms, table
from .reconfigs import print_reconfiguration
from .reconfigure import DEFAULT_TIMEOUT_S, follow
from .server import server_settings
from .tokens import create_token_in_database

__all__ = ["demo"]

JOB_REF = "examples.wordcount:build"
NEW_LOGIC = "examples.wordcount:count_word_v2"
SERVER_START_TIMEOUT_S = 60.0  # migrations and workers importing numpy on a busy machine
SERVER_STOP_TIMEOUT_S = 30.0  # the server stops its jobs and workers before it exits
FINISH_GRACE_S = 10.0  # the job may trail its source rate after pausing for reconfigurations
HEALTH_POLL_S = 0.2
METRICS_EVERY_S = 4.0  # one line of rates while waiting between steps
METRICS_WINDOW_S = 2.0
LOG_TAIL_LINES = 20
ENDED = frozenset({"finished", "failed", "stopped"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(log: Path) -> str:
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])


@contextmanager
def _server(database_url: str, port: int, workers: int, log: Path) -> Iterator[str]:
    """``streampilot server`` as a child process, healthy; stopped with SIGTERM on exit
    (killed if it has not exited within ``SERVER_STOP_TIMEOUT_S``). Yields its address."""
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "controlplane.cli", "server", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--db", database_url, "--local-workers", str(workers)]
    cmd += ["--backend", "local", "--log-level", "WARNING"]
    with log.open("wb") as out:
        # Its own session: Ctrl-C reaches the demo only, which then stops it with SIGTERM.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not _healthy(base):
            if proc.poll() is not None:
                fail(f"the server exited ({proc.returncode}) at start:\n{_log_tail(log)}", 1)
            if time.monotonic() > deadline:
                fail(f"the server did not answer within {SERVER_START_TIMEOUT_S:g}s", 1)
            time.sleep(HEALTH_POLL_S)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            err.print(f"the server did not stop within {SERVER_STOP_TIMEOUT_S:g}s: killed")
            proc.kill()
            proc.wait()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


def _rates_line(api: Client, job_id: int, t0: float) -> None:
    """The job's rates and sink latency over the last seconds (nothing while it has none)."""
    try:
        m = api.get(f"/jobs/{job_id}/metrics", window_s=METRICS_WINDOW_S)
    except ApiError:
        return
    ops = {o["kind"]: o for o in m["operators"]}
    sentences = ops.get("source", {}).get("out_per_s", 0.0)
    words = ops.get("keyed", {}).get("in_per_s", 0.0)
    if not sentences and not words:
        return
    lat = m["latency"]
    console.print(
        f"  t+{time.monotonic() - t0:5.1f}s  {sentences:9,.0f} sentences/s  {words:9,.0f} "
        f"words/s counted  sink latency p50 {lat['p50_ms']:.1f} ms p99 {lat['p99_ms']:.1f} ms",
        highlight=False,
    )


def _wait(api: Client, job_id: int, t0: float, until: float, done: frozenset[str]) -> str:
    """Wait until ``until`` (monotonic), printing rates; returns early, with the job's
    status, once that status is in ``done``."""
    status = ""
    next_line = time.monotonic()
    while time.monotonic() < until:
        status = api.get(f"/jobs/{job_id}")["status"]
        if status in done:
            return status
        if time.monotonic() >= next_line:
            _rates_line(api, job_id, t0)
            next_line = time.monotonic() + METRICS_EVERY_S
        time.sleep(min(0.5, max(0.0, until - time.monotonic())))
    return status


def _reconfigure(api: Client, job_id: int, title: str, path: str, body: dict[str, Any]):
    """One helper request, followed to its end and printed; None if there was nothing to
    do (e.g. a rebalance of an even load)."""
    console.rule(f"[bold]{title}[/bold]")
    try:
        rec = api.post(f"/jobs/{job_id}/{path}", body)
    except ApiError as exc:
        if exc.code != "no_change":
            raise
        console.print(f"nothing to do: {exc.message}", highlight=False)
        return None
    rec = follow(api, rec, DEFAULT_TIMEOUT_S)
    print_reconfiguration(rec)
    if rec["status"] != "completed":
        fail(f"{title}: reconfiguration {rec['id']} {rec['status']}: {rec['error']}", 1)
    return rec


def _drive(api: Client, params: dict[str, Any], duration: float, workers: int) -> tuple[dict, list]:
    """Steps 3 to 5; returns the job's last record and the completed reconfigurations."""
    job = api.post("/jobs", {"name": "wordcount-demo", "job": JOB_REF, "params": params})
    if job["status"] == "failed":
        fail(f"job {job['id']} failed to start: {job['error']}", 1)
    job_id = job["id"]
    console.print(f"job {job_id} submitted: {job['status']}, abstraction version {job['version']}")
    t0 = time.monotonic()
    steps = [
        (0.2, "scale-out", "scale", {"operator": "count", "parallelism": workers + 1}),
        (0.4, "rebalance", "rebalance", {"operator": "count", "threshold": 0.0, "window_s": 5}),
        (0.6, "logic swap", "logic", {"operator": "count", "logic": NEW_LOGIC}),
    ]
    done: list[dict[str, Any]] = []
    for at, title, path, body in steps:
        status = _wait(api, job_id, t0, t0 + at * duration, ENDED)
        if status in ENDED:
            fail(f"job {job_id} is {status} before the {title}", 1)
        rec = _reconfigure(api, job_id, title, path, body)
        if rec is not None:
            done.append(rec)
    console.rule("[bold]to the end of the stream[/bold]")
    if _wait(api, job_id, t0, t0 + duration + FINISH_GRACE_S, ENDED) not in ENDED:
        console.print(f"job {job_id} still runs after {duration + FINISH_GRACE_S:g}s: stopping it")
        api.delete(f"/jobs/{job_id}")
    return api.get(f"/jobs/{job_id}"), done


def _summary(recs: list[dict[str, Any]]) -> None:
    rows = [
        (
            r["origin"],
            r["id"],
            fmt_ms(r["timings_ms"]["prepare"]),
            fmt_ms(r["timings_ms"]["sync"]),
            fmt_ms(r["timings_ms"]["update"]),
            fmt_ms(r["timings_ms"]["total"]),
            fmt_ms(max(r["pause_ms"].values(), default=None)),
        )
        for r in recs
    ]
    columns = ("reconfiguration", "id", "prepare", "sync", "update", "total", "longest pause")
    console.print(table("live reconfigurations", columns, rows))


def _check_results(job: dict[str, Any], params: dict[str, Any]) -> None:
    """Step 6: the final counts against the count computed here."""
    from examples.wordcount import read_results, reference

    counts = read_results(params["output"])
    counted = sum(counts.values())
    if job["status"] == "stopped":  # it trailed its source by more than FINISH_GRACE_S
        console.print(
            f"[yellow]stopped before the end of its stream[/yellow]: {counted:,} words counted "
            "so far; only a finished run can be compared word for word",
            highlight=False,
        )
        return
    if job["status"] != "finished":
        fail(f"job {job['id']} is {job['status']}: {job['error']}", 1)
    expected = reference(params)
    wrong = sorted(w for w in expected.keys() | counts.keys() if counts.get(w) != expected.get(w))
    if wrong:
        fail(f"{len(wrong)} of {len(expected):,} words have a wrong count, e.g. {wrong[:5]}", 1)
    console.print(
        f"[green]final counts are right[/green]: {len(counts):,} distinct words, {counted:,} "
        f"words counted, equal word for word to the count computed without the runtime",
        highlight=False,
    )


def demo(
    duration: Annotated[float, typer.Option(min=3, help="seconds of stream to generate")] = 40.0,
    workers: Annotated[int, typer.Option(min=1, help="local worker processes")] = 2,
    rate: Annotated[float, typer.Option(min=1, help="sentences per second (8 words each)")] = 4000,
    omega: Annotated[float, typer.Option(min=0, help="key popularity reshuffles per minute")] = 6.0,
    port: Annotated[int, typer.Option(min=0, max=65535, help="HTTP port (0: a free one)")] = 0,
) -> None:
    """Word count driven through REST: scale-out, rebalance and logic swap while it runs.

    Starts a StreamManager (SQLite in a temporary directory, local workers), submits the
    word count, reconfigures it live printing each reconfiguration's timings, checks its
    final counts and shuts everything down."""
    logging.basicConfig(level="WARNING")
    with tempfile.TemporaryDirectory(prefix="streampilot-demo-") as tmp:
        settings = server_settings(database_url=f"sqlite:///{tmp}/demo.db")
        token = create_token_in_database(settings, "demo", ["admin"])
        params = {
            "records": int(rate * duration),
            "rate": rate,
            "zipf": 1.0,
            "omega": omega,
            "keys": 10_000,
            "parallelism": workers,
            "output": f"{tmp}/counts",
        }
        console.print(
            f"[bold]streampilot demo[/bold]: word count, {params['records']:,} sentences at "
            f"{rate:,.0f}/s x 8 words, Zipf 1.0 over 10,000 words reshuffled {omega:g}x/min, "
            f"{workers} local workers"
        )
        port = port or _free_port()
        with _server(settings.database_url, port, workers, Path(tmp, "server.log")) as base:
            console.print(
                f"console: {base}/ (dashboard)  {base}/docs (OpenAPI; Authorize with the token)\n"
                f"token:   {token}\n"
                f"try:     STREAMPILOT_SERVER={base} STREAMPILOT_TOKEN={token} "
                f"streampilot abstraction show 1",
                highlight=False,
            )
            try:
                with Client(base, token) as api:
                    job, recs = _drive(api, params, duration, workers)
            except ClientError as exc:
                fail(str(exc), 1)
            console.print("stopping the server and its workers")
        console.print(f"job {job['id']}: {job['status']}")
        _summary(recs)
        _check_results(job, params)
