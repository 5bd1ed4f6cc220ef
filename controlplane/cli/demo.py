"""``streampilot demo``: the StreamManager driven through REST, end to end.

Steps (each bounded; the whole demo takes about ``--duration`` plus 15 s):

1. Create a database in a temporary directory and an admin token in it.
2. Start ``streampilot server`` (a child process: SQLite, local workers, a free port) and
   wait for ``/healthz``; print the console's address and the token.
3. Submit the word count (``examples.wordcount:build``): Zipf-skewed words whose
   popularity reshuffles, a rate that steps up ``--step`` times from 25% to 65% of the
   run, a bounded number of sentences, final counts written to files. Attach the built-in
   load balancer and latency autoscaler to it (``POST /controllers``).
4. While it runs, print the controllers' decisions as they settle (what they planned, the
   outcome, the reconfiguration), and through REST scale the count operator out by one
   task, rebalance it on its measured load, and swap its logic to ``count_word_v2``
   (waiting while a controller's reconfiguration is in progress); print each
   reconfiguration's timings and pauses, and the job's rates in between.
5. Wait for the job to finish (stop it if it has not by ``duration + FINISH_GRACE_S``).
6. Stop the server (SIGTERM: it stops its workers), print every reconfiguration and the
   controllers' decisions by outcome, then compare the final counts with the word count
   computed in this process (the source's schedule and reshuffles are deterministic, so
   :func:`examples.wordcount.reference` replays them): equal, word for word, if the job
   finished (exit 1 if not; a stopped job's partial counts are only reported).
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
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

__all__ = [
    "DecisionFeed",
    "attach_builtin",
    "decision_line",
    "demo",
    "epoch_s",
    "free_port",
    "local_server",
    "ops_summary",
]

JOB_REF = "examples.wordcount:build"
NEW_LOGIC = "examples.wordcount:count_word_v2"
SERVER_START_TIMEOUT_S = 60.0  # migrations and workers importing numpy on a busy machine
SERVER_STOP_TIMEOUT_S = 30.0  # the server stops its jobs and workers before it exits
FINISH_GRACE_S = 10.0  # the job may trail its source rate after pausing for reconfigurations
HEALTH_POLL_S = 0.2
METRICS_EVERY_S = 4.0  # one line of rates while waiting between steps
METRICS_WINDOW_S = 2.0
LOG_TAIL_LINES = 20
CONTROLLER_INTERVAL_S = 2.0  # the controllers decide this often: they act within the demo
CONTROLLER_COOLDOWN_S = 8.0  # and wait this long after each of their reconfigurations
CONFLICT_RETRY_S = 0.5  # a step waits this long while a controller's reconfiguration runs
STEP_UP, STEP_DOWN = 0.25, 0.65  # the rate step, as fractions of the run
ZIPF = 1.2  # skew of word frequencies: enough that the load balancer has work
OUTCOMES = ("completed", "failed", "aborted", "cancelled", "refused", "dry_run")
DECISIONS_PAGE = 50  # decisions read per poll (newest first): more than settle between polls
ENDED = frozenset({"finished", "failed", "stopped"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(log: Path) -> str:
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])


@contextmanager
def local_server(database_url: str, port: int, workers: int, log: Path) -> Iterator[str]:
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


def attach_builtin(
    api: Client, job_id: int, builtin: str, config: dict[str, Any], safety: dict[str, Any]
) -> dict[str, Any]:
    """Attach the built-in controller ``builtin`` (named after it) to the job over REST,
    as ``streampilot controller upload --builtin`` does; it runs from now on. Returns its
    record; :class:`ApiError` (422) names a bad config or safety field."""
    fields = {
        "name": builtin,
        "job_id": str(job_id),
        "builtin": builtin,
        "config": json.dumps(config),
        "safety": json.dumps(safety),
    }
    return api.request("POST", "/controllers", data=fields)


def epoch_s(timestamp: str) -> float:
    """An API timestamp (ISO 8601, UTC when it names no zone) in seconds since the epoch."""
    t = datetime.fromisoformat(timestamp)
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def ops_summary(plan: dict[str, Any]) -> str:
    """A plan's operations in a few words: which tasks get key groups or weights, which
    tasks are placed, moved or removed, which logic is swapped, which keys split."""
    parts = []
    for op in plan.get("ops", []):
        if op["op"] == "assignWorkload":
            parts.append(f"workload of {len(op['workload'])} {op['operator']} tasks")
        elif op["op"] == "assignResource":
            parts.append(f"{op['task']} -> {op['worker'] or 'removed'}")
        elif op["op"] == "splitKey":
            ways = len(op["tasks"])
            split = f"split {ways} ways" if ways else "merged back"
            parts.append(f"{op['operator']} key {op['key']!r} {split}")
        else:
            parts.append(f"logic of {op['operator']} -> {op['ref']}")
    return ", ".join(parts) or "no operation"


class DecisionFeed:
    """The decisions of some controllers, each returned once when it has settled (its
    outcome is known), oldest first: poll ``/controllers/{id}/decisions``."""

    def __init__(self, api: Client, controllers: dict[int, str]) -> None:
        self.api = api
        self.controllers = controllers  # id -> name
        self.seen: set[int] = set()
        self.settled: list[tuple[str, dict[str, Any]]] = []  # every one returned so far

    def poll(self) -> list[tuple[str, dict[str, Any]]]:
        new = []
        for cid, name in self.controllers.items():
            page = self.api.get(f"/controllers/{cid}/decisions", limit=DECISIONS_PAGE)
            for d in page["items"]:
                if d["status"] != "pending" and d["id"] not in self.seen:
                    self.seen.add(d["id"])
                    new.append((name, d))
        new.sort(key=lambda pair: pair[1]["time"])
        self.settled += new
        return new


def decision_line(name: str, d: dict[str, Any], t0: float) -> str:
    """One decision for people: when (seconds after ``t0``, epoch), who, what, outcome."""
    rec = f", reconfiguration {d['reconfiguration_id']}" if d["reconfiguration_id"] else ""
    why = f": {d['error']}" if d["error"] else ""
    return (
        f"  t+{epoch_s(d['time']) - t0:5.1f}s  {name}: {ops_summary(d['plan'])} "
        f"({d['moves']} key groups moved) -> {d['status']}{rec}{why}"
    )


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


class _Progress:
    """What the demo prints while it waits: the job's rates every ``METRICS_EVERY_S`` and
    its controllers' decisions as they settle. Times are seconds since the submission."""

    def __init__(self, api: Client, job_id: int, feed: DecisionFeed) -> None:
        self.api, self.job_id, self.feed = api, job_id, feed
        self.t0, self.wall0 = time.monotonic(), time.time()
        self.next_line = self.t0

    def wait(self, until: float, done: frozenset[str]) -> str:
        """Wait until ``until`` (seconds since submission), printing; returns early, with
        the job's status, once that status is in ``done``."""
        status = ""
        while (now := time.monotonic()) < self.t0 + until:
            status = self.api.get(f"/jobs/{self.job_id}")["status"]
            if status in done:
                break
            if now >= self.next_line:
                self._rates_line()
                self.next_line = now + METRICS_EVERY_S
            self.decisions()
            time.sleep(min(0.5, max(0.0, self.t0 + until - time.monotonic())))
        self.decisions()
        return status

    def decisions(self) -> None:
        for name, d in self.feed.poll():
            console.print(decision_line(name, d, self.wall0), highlight=False, markup=False)

    def _rates_line(self) -> None:
        """The job's rates and sink latency over the last seconds (nothing while it has none)."""
        try:
            m = self.api.get(f"/jobs/{self.job_id}/metrics", window_s=METRICS_WINDOW_S)
        except ApiError:
            return
        ops = {o["kind"]: o for o in m["operators"]}
        sentences = ops.get("source", {}).get("out_per_s", 0.0)
        words = ops.get("keyed", {}).get("in_per_s", 0.0)
        if not sentences and not words:
            return
        lat = m["latency"]
        console.print(
            f"  t+{time.monotonic() - self.t0:5.1f}s  {sentences:9,.0f} sentences/s  "
            f"{words:9,.0f} words/s counted  sink latency p50 {lat['p50_ms']:.1f} ms "
            f"p99 {lat['p99_ms']:.1f} ms",
            highlight=False,
        )


def _reconfigure(api: Client, job_id: int, title: str, path: str, body: dict[str, Any]):
    """One helper request, followed to its end and printed; None if there was nothing to
    do (e.g. a rebalance of an even load). While a controller's reconfiguration is in
    progress the request is refused (409): it is retried until ``DEFAULT_TIMEOUT_S``."""
    console.rule(f"[bold]{title}[/bold]")
    deadline = time.monotonic() + DEFAULT_TIMEOUT_S
    while True:
        try:
            rec = api.post(f"/jobs/{job_id}/{path}", body)
            break
        except ApiError as exc:
            if exc.code == "no_change":
                console.print(f"nothing to do: {exc.message}", highlight=False)
                return None
            if exc.code != "reconfiguration_in_progress" or time.monotonic() > deadline:
                raise
            time.sleep(CONFLICT_RETRY_S)
    rec = follow(api, rec, DEFAULT_TIMEOUT_S)
    print_reconfiguration(rec)
    if rec["status"] != "completed":
        fail(f"{title}: reconfiguration {rec['id']} {rec['status']}: {rec['error']}", 1)
    return rec


def _controllers(workers: int, max_latency_ms: float) -> list[tuple[str, dict, dict]]:
    """The built-ins the demo attaches: (name, config, safety), with short periods so that
    they act within the demo."""
    return [
        (
            "load_balancer",
            {"interval_s": CONTROLLER_INTERVAL_S, "threshold": 0.2, "target": 0.05},
            {"cooldown_s": CONTROLLER_COOLDOWN_S},
        ),
        (
            "latency_autoscaler",
            {
                "interval_s": CONTROLLER_INTERVAL_S,
                "max_latency_ms": max_latency_ms,
                "overload_window": 3,
                "underload_window": 3,
                "peak_window": 10,
                "operators": ["count"],
                "max_tasks": workers + 2,
            },
            {"cooldown_s": CONTROLLER_COOLDOWN_S, "max_parallelism": {"count": workers + 2}},
        ),
    ]


def _drive(
    api: Client, params: dict[str, Any], duration: float, workers: int, max_latency_ms: float
) -> tuple[dict, list, DecisionFeed]:
    """Steps 3 to 5; returns the job's last record, all its reconfigurations (oldest
    first) and the controllers' decisions feed."""
    job = api.post("/jobs", {"name": "wordcount-demo", "job": JOB_REF, "params": params})
    if job["status"] == "failed":
        fail(f"job {job['id']} failed to start: {job['error']}", 1)
    job_id = job["id"]
    console.print(f"job {job_id} submitted: {job['status']}, abstraction version {job['version']}")
    attached = {}
    for name, config, safety in _controllers(workers, max_latency_ms):
        c = attach_builtin(api, job_id, name, config, safety)
        attached[c["id"]] = name
        console.print(
            f"controller {c['id']} attached: {name} every {c['interval_s']:g} s, "
            f"config {json.dumps(config)}, safety {json.dumps(safety)}",
            highlight=False,
        )
    progress = _Progress(api, job_id, DecisionFeed(api, attached))
    steps = [
        (0.2, "scale-out", "scale", {"operator": "count", "parallelism": workers + 1}),
        (0.4, "rebalance", "rebalance", {"operator": "count", "threshold": 0.0, "window_s": 5}),
        (0.6, "logic swap", "logic", {"operator": "count", "logic": NEW_LOGIC}),
    ]
    for at, title, path, body in steps:
        status = progress.wait(at * duration, ENDED)
        if status in ENDED:
            fail(f"job {job_id} is {status} before the {title}", 1)
        _reconfigure(api, job_id, title, path, body)
    console.rule("[bold]to the end of the stream[/bold]")
    if progress.wait(duration + FINISH_GRACE_S, ENDED) not in ENDED:
        console.print(f"job {job_id} still runs after {duration + FINISH_GRACE_S:g}s: stopping it")
        api.delete(f"/jobs/{job_id}")
    progress.decisions()
    recs = api.get(f"/jobs/{job_id}/reconfigurations", limit=DECISIONS_PAGE)["items"]
    return api.get(f"/jobs/{job_id}"), list(reversed(recs)), progress.feed


def _summary(recs: list[dict[str, Any]]) -> None:
    rows = [
        (
            r["origin"],
            r["id"],
            r["status"],
            fmt_ms(r["timings_ms"]["prepare"]),
            fmt_ms(r["timings_ms"]["sync"]),
            fmt_ms(r["timings_ms"]["update"]),
            fmt_ms(r["timings_ms"]["total"]),
            fmt_ms(max(r["pause_ms"].values(), default=None)),
        )
        for r in recs
    ]
    columns = (
        "reconfiguration",
        "id",
        "status",
        "prepare",
        "sync",
        "update",
        "total",
        "longest pause",
    )
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


def _schedule(rate: float, step: float, duration: float) -> tuple[str, int]:
    """The source's rate: ``rate``, ``step`` times it from ``STEP_UP`` to ``STEP_DOWN`` of
    the run, ``rate`` again after; and the sentences that makes in ``duration`` seconds."""
    up, down = round(STEP_UP * duration, 2), round(STEP_DOWN * duration, 2)
    high = rate * step
    schedule = f"{up}:{rate}, {up}:{high}, {down}:{high}, {down}:{rate}"
    return schedule, int(rate * up + high * (down - up) + rate * (duration - down))


def _decisions_summary(feed: DecisionFeed) -> None:
    rows = []
    for cid, name in feed.controllers.items():
        outcomes = Counter(d["status"] for n, d in feed.settled if n == name)
        rows.append((cid, name, sum(outcomes.values()), *(outcomes[k] for k in OUTCOMES)))
    console.print(table("controller decisions", ("id", "controller", "plans", *OUTCOMES), rows))


def demo(
    duration: Annotated[float, typer.Option(min=3, help="seconds of stream to generate")] = 40.0,
    workers: Annotated[int, typer.Option(min=1, help="local worker processes")] = 2,
    rate: Annotated[float, typer.Option(min=1, help="sentences per second (8 words each)")] = 4000,
    step: Annotated[
        float, typer.Option(min=1, help="the rate is this many times higher mid-run")
    ] = 4.0,
    omega: Annotated[float, typer.Option(min=0, help="key popularity reshuffles per minute")] = 6.0,
    max_latency_ms: Annotated[
        float, typer.Option(min=1, help="the autoscaler's limit on p99 latency")
    ] = 50.0,
    port: Annotated[int, typer.Option(min=0, max=65535, help="HTTP port (0: a free one)")] = 0,
) -> None:
    """Word count driven through REST: controllers, scale-out, rebalance and logic swap.

    Starts a StreamManager (SQLite in a temporary directory, local workers), submits the
    word count (skewed words whose popularity reshuffles, a rate step mid-run), attaches
    the load balancer and the latency autoscaler and prints their decisions as they
    happen, reconfigures it live printing each reconfiguration's timings, checks its final
    counts and shuts everything down."""
    logging.basicConfig(level="WARNING")
    with tempfile.TemporaryDirectory(prefix="streampilot-demo-") as tmp:
        settings = server_settings(database_url=f"sqlite:///{tmp}/demo.db")
        token = create_token_in_database(settings, "demo", ["admin"])
        schedule, records = _schedule(rate, step, duration)
        params = {
            "records": records,
            "rate": rate,
            "schedule": schedule,
            "zipf": ZIPF,
            "omega": omega,
            "keys": 10_000,
            "parallelism": workers,
            "output": f"{tmp}/counts",
        }
        console.print(
            f"[bold]streampilot demo[/bold]: word count, {records:,} sentences x 8 words at "
            f"{rate:,.0f}/s, {rate * step:,.0f}/s from {STEP_UP * duration:g} s to "
            f"{STEP_DOWN * duration:g} s; Zipf {ZIPF:g} over 10,000 words reshuffled "
            f"{omega:g}x/min; {workers} local workers"
        )
        port = port or free_port()
        with local_server(settings.database_url, port, workers, Path(tmp, "server.log")) as base:
            console.print(
                f"console: {base}/ (dashboard)  {base}/docs (OpenAPI; Authorize with the token)\n"
                f"token:   {token}\n"
                f"try:     STREAMPILOT_SERVER={base} STREAMPILOT_TOKEN={token} "
                f"streampilot abstraction show 1",
                highlight=False,
            )
            try:
                with Client(base, token) as api:
                    job, recs, feed = _drive(api, params, duration, workers, max_latency_ms)
            except ClientError as exc:
                fail(str(exc), 1)
            console.print("stopping the server and its workers")
        console.print(f"job {job['id']}: {job['status']}")
        _summary(recs)
        _decisions_summary(feed)
        _check_results(job, params)
