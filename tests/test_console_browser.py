"""The dashboard (``/``) and the OpenAPI console (``/docs``) in a real browser: Debian's
chromium driven by Playwright against a real server (uvicorn, 2 local workers) running a
word count.

Every page is watched: a console error, an uncaught exception, a failed request or any
request to a host other than this machine fails the test (requests off this machine are
also aborted, so a page that needs the internet fails here as it would offline). The
pages do not depend on the database, so these tests run on the SQLite server only; the
one that kills a worker to see a recovery on the page has a server of its own.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from api_support import ADMIN_TOKEN, Api, running_server, wait_until
from jobs_for_tests import growing_submission
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"  # Debian's; `make test` installs it (never `playwright install`)
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # no update checks, no safe-browsing lists
    "--disable-component-update",
    "--disable-sync",
]
LAUNCH_TIMEOUT_MS = 60_000  # chromium's first start on a busy 2-core box
WAIT_MS = 20_000  # for one thing to appear on a page (the page polls every 2 s)
RECONFIGURATION_WAIT_MS = 60_000  # a scale-out deploys a task and moves key groups
RECOVERY_DELAY_S = 5.0  # a killed worker's job stays recovering this long (its restart policy)
RECOVERY_WAIT_MS = 60_000  # the delay, then a worker started in place of the lost one
CHECKPOINTS_SHOWN = 10  # the newest a job's page lists (console.js)
EN_DASH = "\u2013"  # between the ends of a range of key groups
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
WORDCOUNT = {
    "name": "wordcount <i>console</i>",  # markup in data is shown as text
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000},
}

# The shared server, on SQLite only (a test that kills a worker starts a server of its own).
on_sqlite = pytest.mark.parametrize("api", ["sqlite"], indirect=True, ids=["sqlite"])
expect.set_options(timeout=WAIT_MS)  # assertions wait this long (actions: the context's default)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, closed after the module."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium "
            "(make test does it as root)",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=LAUNCH_TIMEOUT_MS
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def job(api: Api) -> Iterator[int]:
    """A running, unbounded word count (1000 sentences/s), stopped after the module."""
    with api.running_job(WORDCOUNT) as job_id:
        yield job_id


@dataclass
class Watched:
    """A page and what it did wrong so far."""

    page: Page
    errors: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert not self.outside, f"requests off this machine: {self.outside}"
        assert not self.errors, "\n".join(self.errors)


def _off_this_machine(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https", "ws", "wss") and parts.hostname not in LOOPBACK


@pytest.fixture
def open_page(browser: Browser) -> Iterator[Any]:
    """``open_page()``: a page in a fresh browser context (no stored token), watched;
    every context is closed after the test."""
    contexts = []

    def open_() -> Watched:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(WAIT_MS)
        contexts.append(context)
        watched = Watched(context.new_page())

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                watched.errors.append(f"console error: {message.text} ({message.location})")

        def on_request(request: Request) -> None:
            if _off_this_machine(request.url):
                watched.outside.append(request.url)

        context.route(_off_this_machine, lambda route: route.abort("blockedbyclient"))
        watched.page.on("console", on_console)
        watched.page.on("pageerror", lambda exc: watched.errors.append(f"uncaught: {exc}"))
        watched.page.on("request", on_request)
        watched.page.on(
            "requestfailed",
            lambda r: watched.errors.append(f"request failed: {r.method} {r.url} {r.failure}"),
        )
        return watched

    try:
        yield open_
    finally:
        for context in contexts:
            context.close()


def key_group_ranges(groups: list[int]) -> str:
    """What the page shows for a task's key groups: compact ranges and a count."""
    ranges: list[tuple[int, int]] = []
    for g in sorted(groups):
        if ranges and ranges[-1][1] == g - 1:
            ranges[-1] = (ranges[-1][0], g)
        else:
            ranges.append((g, g))
    text = ", ".join(f"{a}" if a == b else f"{a}{EN_DASH}{b}" for a, b in ranges)
    return f"{text} ({len(groups)})"


def number(text: str) -> float:
    """A number as the page prints it (``1,000.8``)."""
    return float(text.replace(",", ""))


def sign_in(page: Page, base_url: str, token: str) -> None:
    page.goto(f"{base_url}/")
    expect(page.get_by_test_id("auth-status")).to_contain_text("No token")
    page.get_by_label("Bearer token").fill(token)
    page.get_by_test_id("token-save").click()


@on_sqlite
def test_dashboard_shows_a_live_job_its_tasks_metrics_and_a_reconfiguration(
    api: Api, job: int, open_page: Any, tmp_path: Any
) -> None:
    watched = open_page()
    page = watched.page
    with api.client() as http:
        abstraction = http.get(f"/api/v1/jobs/{job}/abstraction").json()
    version = abstraction["job"]["version"]

    # The jobs list, once a token is given.
    sign_in(page, api.base_url, ADMIN_TOKEN)
    expect(page.get_by_test_id("auth-status")).to_have_text("Connected: the token is accepted.")
    row = page.locator(f'[data-testid="job-row"][data-job-id="{job}"]')
    expect(row.get_by_test_id("job-row-status")).to_have_text("running")
    expect(row).to_contain_text(WORDCOUNT["name"])
    expect(row.locator("i")).to_have_count(0)

    # The token is remembered by this browser.
    page.reload()
    expect(row.get_by_test_id("job-row-status")).to_have_text("running")
    assert page.get_by_label("Bearer token").input_value() == ""

    # The job: its abstraction as a table of tasks, as the API has it.
    row.get_by_test_id("job-link").click()
    expect(page.get_by_test_id("job-heading")).to_have_text(f"Job {job}: {WORDCOUNT['name']}")
    expect(page.get_by_test_id("job-status")).to_have_text("running")
    tasks = page.get_by_test_id("task-row")
    expected = [(op["name"], t) for op in abstraction["operators"] for t in op["tasks"]]
    expect(tasks).to_have_count(len(expected))
    for operator, task in expected:
        shown = page.locator(f'[data-testid="task-row"][data-task="{task["id"]}"]')
        assert shown.get_attribute("data-operator") == operator
        expect(shown.get_by_test_id("task-worker")).to_have_text(task["resources"]["worker"])
        if operator == "count":
            workload = key_group_ranges(task["workload"]["key_groups"])
            expect(shown.get_by_test_id("task-workload")).to_have_text(workload)
        expect(shown).to_contain_text(task["logic"]["ref"])

    # Live metrics: records flow into the sink, latency is measured, the window moves on.
    sink = page.locator('[data-testid="operator-metrics-row"][data-operator="sink"]')
    wait_until(
        lambda: sink.count() and number(sink.get_by_test_id("rate-in").inner_text()) > 0,
        WAIT_MS / 1000,
        "the sink's input rate on the page",
        every=0.25,
    )
    operators = page.get_by_test_id("operator-metrics-row")
    assert operators.evaluate_all("rows => rows.map(r => r.dataset.operator)") == [
        "sentences",
        "split",
        "count",
        "sink",
    ]
    counts = page.locator('[data-testid="operator-metrics-row"][data-operator="count"]')
    expect(counts.get_by_test_id("operator-state")).to_have_text(
        re.compile(r"^[\d,.]+ (B|kB|MB)$")  # keyed state, estimated
    )
    expect(sink.get_by_test_id("operator-state")).to_have_text("—")
    expect(page.get_by_test_id("latency-p50")).to_have_text(re.compile(r"^[\d,.]+ ms$"))
    expect(page.get_by_test_id("latency-p99")).to_have_text(re.compile(r"^[\d,.]+ ms$"))
    status = page.get_by_test_id("metrics-status")
    updated = status.inner_text()
    expect(status).not_to_have_text(updated)  # polled again

    # A preview from the page: what scaling out would do, and nothing done.
    page.get_by_label("Scale operator").select_option("count")
    page.get_by_test_id("scale-parallelism").fill("3")
    page.get_by_test_id("scale-preview").click()
    action = page.get_by_test_id("action-status")
    expect(action).to_have_text(
        re.compile(
            rf"^Preview: scale would take version {version} to {version + 1}: (\d+) key "
            r"groups would change task; (about [\d,.]+ (B|kB|MB) of keyed state shipped "
            r"between workers|the keyed state it would ship is not measured yet); new tasks "
            r"count-2, sink-2\. Nothing was changed\.$"
        )
    )
    with api.client() as http:
        seen = http.post(
            f"/api/v1/jobs/{job}/reconfigurations/preview",
            json={"origin": "scale", "operator": "count", "parallelism": 3},
        ).json()
        assert http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["total"] == 0
    assert f": {seen['key_group_moves']} key groups would change task;" in action.inner_text()

    # A scale-out from the page: accepted, then in the history with its timings.
    page.get_by_test_id("scale-submit").click()
    expect(page.get_by_test_id("action-status")).to_contain_text("(scale) accepted")
    done = page.locator('[data-testid="reconfiguration-row"][data-status="completed"]')
    expect(done).to_have_count(1, timeout=RECONFIGURATION_WAIT_MS)
    with api.client() as http:
        history = http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["items"]
    assert len(history) == 1
    rec = history[0]
    assert (rec["origin"], rec["status"], rec["result_version"]) == (
        "scale",
        "completed",
        version + 1,
    )
    assert done.get_attribute("data-id") == str(rec["id"])
    expect(done.get_by_test_id("affected-tasks")).to_have_text(", ".join(rec["affected_tasks"]))
    for phase in ("prepare", "sync", "update", "total"):
        shown = number(done.get_by_test_id(f"timing-{phase}").inner_text())
        assert shown == pytest.approx(rec["timings_ms"][phase], abs=0.051), phase
    expect(done.get_by_test_id("reconfiguration-error")).to_have_text("")
    expect(page.get_by_test_id("action-status")).to_have_text(
        re.compile(rf"^Reconfiguration {rec['id']} \(scale\) completed in [\d,.]+ ms\.$")
    )

    # The new version's tasks replace the old ones.
    expect(page.get_by_test_id("job-version")).to_have_text(str(version + 1))
    expect(page.locator('[data-testid="task-row"][data-task="count-2"]')).to_have_count(1)
    count = page.locator('[data-testid="operator-metrics-row"][data-operator="count"]')
    expect(count.get_by_test_id("operator-tasks")).to_have_text("3")  # all three report
    first = page.locator(f'[data-testid="reconfiguration-row"][data-id="{rec["id"]}"]')
    expect(first.get_by_test_id("reconfiguration-mode")).to_have_text("pause")
    expect(first.get_by_test_id("reconfiguration-runs")).to_have_text("1")

    # Back to two tasks in fluid mode, a few key groups per step: mode and runs in the history.
    batch = page.get_by_test_id("action-batch")
    expect(batch).to_be_disabled()  # pause mode has no steps
    page.get_by_label("Either change is made").select_option("fluid")
    batch.fill("0")
    page.get_by_test_id("scale-parallelism").fill("2")
    page.get_by_test_id("scale-submit").click()
    expect(page.get_by_test_id("action-status")).to_have_text(
        "Key groups per step must be a whole number of at least 1 or a size of state such "
        'as 8MB (or empty: all in one step), not "0".'
    )
    batch.fill("8")
    page.get_by_test_id("scale-submit").click()
    expect(done).to_have_count(2, timeout=RECONFIGURATION_WAIT_MS)
    with api.client() as http:
        fluid = http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["items"][0]
    assert (fluid["origin"], fluid["mode"], fluid["batch_size"]) == ("scale", "fluid", 8)
    stages = len(fluid["stage_ms"])
    assert stages >= 1, fluid  # the steps that only move key groups are stages
    row = page.locator(f'[data-testid="reconfiguration-row"][data-id="{fluid["id"]}"]')
    expect(row.get_by_test_id("reconfiguration-mode")).to_have_text("fluid, 8 per step")
    expect(row.get_by_test_id("reconfiguration-runs")).to_have_text(
        f"{fluid['runs']} + {stages} stage{'' if stages == 1 else 's'}"
    )
    # Steps sized in state: the server turns 1 MB into key groups from the measured sizes.
    batch.fill("1MB")
    page.get_by_test_id("scale-parallelism").fill("3")
    page.get_by_test_id("scale-submit").click()
    expect(done).to_have_count(3, timeout=RECONFIGURATION_WAIT_MS)
    with api.client() as http:
        sized = http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["items"][0]
    assert sized["mode"] == "fluid" and sized["batch_size"] >= 1, sized
    row = page.locator(f'[data-testid="reconfiguration-row"][data-id="{sized["id"]}"]')
    expect(row.get_by_test_id("reconfiguration-mode")).to_have_text(
        f"fluid, {sized['batch_size']} per step"
    )

    page.screenshot(path=tmp_path / "console.png", full_page=True)

    # Once the job is stopped the page says so and stops reading its metrics.
    with api.client() as http:
        assert http.delete(f"/api/v1/jobs/{job}").json()["status"] == "stopped"
        scaled = http.get(f"/api/v1/jobs/{job}/abstraction").json()
    expect(page.get_by_test_id("job-status")).to_have_text("stopped")
    expect(page.get_by_test_id("metrics-status")).to_have_text(
        "The job is stopped: no live metrics."
    )
    expect(page.get_by_test_id("latency-p99")).to_have_text("—")
    expect(page.get_by_test_id("task-row")).to_have_count(
        sum(len(op["tasks"]) for op in scaled["operators"])
    )
    watched.assert_clean()


@on_sqlite
def test_a_reconfiguration_under_way_is_cancelled_from_the_page(
    api: Api, open_page: Any, tmp_path: Any
) -> None:
    """A migration waiting in its sync (the tasks before count are slow) shows a Cancel
    button; clicking it ends the change ``cancelled``, the job unchanged, the button gone."""
    hold = tmp_path / "hold"
    hold.touch()
    # Fast enough that full batches queue before the held tasks: the barrier waits seconds.
    params = {"records": 10**6, "rate": 20_000, "hold": str(hold), "output": str(tmp_path / "o")}
    held = {"name": "held", "job": "tests.e2e_jobs:held_job", "params": params}
    with api.running_job(held) as job, api.client() as http:
        before = http.get(f"/api/v1/jobs/{job}/abstraction").json()
        count = next(op for op in before["operators"] if op["name"] == "count")
        here = next(t for t in count["tasks"] if t["id"] == "count-0")["resources"]["worker"]
        other = next(w["id"] for w in before["workers"] if w["id"] != here)
        watched = open_page()
        page = watched.page
        sign_in(page, api.base_url, ADMIN_TOKEN)
        page.goto(f"{api.base_url}/#job={job}")
        expect(page.get_by_test_id("job-status")).to_have_text("running")
        r = http.post(f"/api/v1/jobs/{job}/migrate", json={"task": "count-0", "worker": other})
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        row = page.locator(f'[data-testid="reconfiguration-row"][data-id="{rid}"]')
        expect(row.get_by_test_id("reconfiguration-status")).to_have_text("syncing")
        row.get_by_test_id("cancel-reconfiguration").click()  # within the 10 s sync timeout
        expect(page.get_by_test_id("action-status")).to_have_text(
            f"Reconfiguration {rid} (migrate) cancelled: cancelled on request."
        )
        expect(row.get_by_test_id("reconfiguration-status")).to_have_text("cancelled")
        expect(row.get_by_test_id("cancel-reconfiguration")).to_have_count(0)
        rec = http.get(f"/api/v1/jobs/{job}/reconfigurations/{rid}").json()
        assert (rec["status"], rec["result_version"]) == ("cancelled", None), rec
        version = http.get(f"/api/v1/jobs/{job}/abstraction").json()["job"]["version"]
        assert version == before["job"]["version"]
        # A job that does not exist is said so, and the choice undone.
        page.goto(f"{api.base_url}/#job=99999")
        expect(page.get_by_test_id("auth-status")).to_have_text("Job 99999 does not exist.")
        expect(page.locator("#job")).to_be_hidden()
        expected = ("status of 404", "/api/v1/jobs/99999'")  # the browser logs the 404
        watched.errors = [e for e in watched.errors if not all(x in e for x in expected)]
        watched.assert_clean()


@on_sqlite
def test_dashboard_says_what_is_wrong_with_a_token(api: Api, job: int, open_page: Any) -> None:
    # An unknown token: 401, said plainly, and the page stops asking.
    watched = open_page()
    sign_in(watched.page, api.base_url, "sp_not-a-token")
    auth = watched.page.get_by_test_id("auth-status")
    expect(auth).to_contain_text("does not accept this token (401)")
    expect(auth).to_contain_text("unknown or revoked token")
    assert all("401" in e for e in watched.errors), watched.errors  # chromium logs the 401
    assert not watched.outside, watched.outside

    # A read token: the job is shown, but scaling needs operate (403, said plainly).
    with api.client() as http:
        r = http.post("/api/v1/tokens", json={"name": "console-reader", "scopes": ["read"]})
        assert r.status_code == 201, r.text
        reader = r.json()
    try:
        watched = open_page()
        sign_in(watched.page, api.base_url, reader["token"])
        page = watched.page
        page.locator(f'[data-testid="job-row"][data-job-id="{job}"]').get_by_test_id(
            "job-link"
        ).click()
        expect(page.get_by_test_id("task-row").first).to_be_visible()
        page.get_by_test_id("rebalance-submit").click()
        action = page.get_by_test_id("action-status")
        expect(action).to_contain_text("rebalance refused (an operate token is needed)")
        expect(action).to_contain_text("operate")
        assert all("403" in e for e in watched.errors), watched.errors
        assert not watched.outside, watched.outside
    finally:
        with api.client() as http:
            http.delete(f"/api/v1/tokens/{reader['id']}")


@on_sqlite
def test_docs_authorize_and_try_an_authorized_call(api: Api, job: int, open_page: Any) -> None:
    watched = open_page()
    page = watched.page
    page.goto(f"{api.base_url}/docs")

    page.locator("button.authorize").click()
    page.locator("#auth-bearer-value").fill(ADMIN_TOKEN)
    page.get_by_role("button", name="Apply credentials").click()
    page.locator(".auth-btn-wrapper button.btn-done").click()

    operation = page.locator("#operations-jobs-list_jobs_api_v1_jobs_get")
    operation.locator(".opblock-summary-control").click()
    operation.get_by_role("button", name="Try it out").click()
    operation.get_by_role("button", name="Execute").click()

    response = operation.locator(".live-responses-table .response")
    expect(response.locator(".response-col_status")).to_have_text("200")
    expect(response.locator(".response-col_description")).to_contain_text(WORDCOUNT["name"])
    expect(operation.locator(".curl-command")).to_contain_text(f"Bearer {ADMIN_TOKEN}")
    watched.assert_clean()


@on_sqlite
def test_redoc_renders_the_reference_offline(api: Api, open_page: Any) -> None:
    """Redoc's bundle hard-codes its logo on its CDN; the app serves the bundle with that
    address pointed at its own icon, so the page makes no request off this machine."""
    watched = open_page()
    page = watched.page
    page.goto(f"{api.base_url}/redoc")
    expect(page.locator("h1").first).to_contain_text("streampilot")
    expect(page.get_by_text("/api/v1/jobs/{job_id}/reconfigurations").first).to_be_attached()
    logo = page.get_by_alt_text("redocly logo")
    expect(logo).to_have_attribute("src", "/static-offline-docs/favicon.png")
    watched.assert_clean()


def test_a_job_s_checkpoints_and_its_recovery_are_shown_after_a_worker_is_killed(
    open_page: Any, tmp_path: Path
) -> None:
    """A server of its own (one of its workers is killed): the job, recovering (held so
    for a while by its restart policy's delay), is badged so; once it runs again, its
    page lists its newest checkpoints as the API does and the recovery under its row."""
    body = {
        "name": "recovered <b>console</b>",
        "job": "examples.wordcount:build",
        "params": {"records": 0, "rate": 1000},
        "checkpoints": {"interval_s": 0.2},
        "restart": {"delay_s": RECOVERY_DELAY_S},
    }
    with running_server("sqlite", str(tmp_path)) as api, api.client() as http:
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        def completed() -> bool:
            page = http.get(f"/api/v1/jobs/{job_id}/checkpoints", params={"status": "completed"})
            return page.json()["total"] >= 2

        wait_until(completed, WAIT_MS / 1000, f"2 completed checkpoints of job {job_id}")
        watched = open_page()
        page = watched.page
        sign_in(page, api.base_url, ADMIN_TOKEN)
        page.goto(f"{api.base_url}/#job={job_id}")
        expect(page.get_by_test_id("job-status")).to_have_text("running")
        expect(page.get_by_test_id("checkpoint-row").first).to_be_visible()

        abstraction = http.get(f"/api/v1/jobs/{job_id}/abstraction").json()
        count = next(op for op in abstraction["operators"] if op["kind"] == "keyed")
        victim = count["tasks"][-1]["resources"]["worker"]
        pid = next(w["pid"] for w in http.get("/api/v1/workers").json() if w["id"] == victim)
        os.kill(pid, signal.SIGKILL)

        # Recovering: a badge of its own, filled, unlike a running job's.
        badge = page.get_by_test_id("job-status").locator(".badge")
        expect(badge).to_have_text("recovering")
        expect(badge).to_have_class(re.compile(r"\brecovering\b"))
        filled = badge.evaluate("b => getComputedStyle(b).backgroundColor")
        assert filled not in ("rgba(0, 0, 0, 0)", "transparent"), filled

        expect(page.get_by_test_id("job-status")).to_have_text("running", timeout=RECOVERY_WAIT_MS)
        recs = http.get(f"/api/v1/jobs/{job_id}/reconfigurations").json()["items"]
        (recovery,) = [rec for rec in recs if rec["origin"] == "recovery"]
        why = recovery["recovery"]
        shown = page.locator(f'[data-testid="recovery-row"][data-id="{recovery["id"]}"]')
        expect(shown.get_by_test_id("recovery-checkpoint")).to_have_text(str(why["checkpoint_id"]))
        expect(shown.get_by_test_id("recovery-reason")).to_have_text(why["reason"])
        expect(shown.get_by_test_id("recovery-lost")).to_have_text(victim)
        (replacement,) = why["placed_on"].values()
        expect(shown.get_by_test_id("recovery-placed")).to_have_text(f"{victim} → {replacement}")
        total = shown.get_by_test_id("recovery-total")
        expect(total).to_have_text(re.compile(r"^[\d,.]+ ms$"))
        assert number(total.inner_text().removesuffix(" ms")) == pytest.approx(
            why["timings_ms"]["total"],
            abs=0.051,  # shown to a tenth: 504.75 reads 504.8
        )
        above = page.locator(f'[data-testid="reconfiguration-row"][data-id="{recovery["id"]}"]')
        expect(above).to_contain_text("recovery")

        # The checkpoints, once the job is stopped (no more come): newest first, as listed.
        assert http.delete(f"/api/v1/jobs/{job_id}").status_code == 200
        expect(page.get_by_test_id("job-status")).to_have_text("stopped")
        listed = http.get(
            f"/api/v1/jobs/{job_id}/checkpoints", params={"limit": CHECKPOINTS_SHOWN}
        ).json()["items"]
        rows = page.get_by_test_id("checkpoint-row")
        expect(rows).to_have_count(len(listed))
        wait_until(
            lambda: (
                rows.evaluate_all("rows => rows.map(r => r.dataset.status)")
                == [c["status"] for c in listed]
            ),
            WAIT_MS / 1000,
            "the page's checkpoints as the API lists them",
            every=0.25,
        )
        ids = rows.evaluate_all("rows => rows.map(r => Number(r.dataset.id))")
        assert ids == [c["checkpoint_id"] for c in listed]
        for c in listed:
            row = page.locator(f'[data-testid="checkpoint-row"][data-id="{c["checkpoint_id"]}"]')
            expect(row.get_by_test_id("checkpoint-status")).to_have_text(c["status"])
            expect(row.get_by_test_id("checkpoint-version")).to_have_text(str(c["version"]))
            for testid, field_ in (
                ("checkpoint-bytes", "bytes"),
                ("checkpoint-full-bytes", "full_bytes"),
            ):
                expect(row.get_by_test_id(testid)).to_have_attribute("title", f"{c[field_]} bytes")
            expect(row.get_by_test_id("checkpoint-error")).to_have_text(c["error"] or "")
            if c["duration_ms"] is not None:
                duration = row.get_by_test_id("checkpoint-duration").inner_text()
                assert number(duration.removesuffix(" ms")) == pytest.approx(
                    c["duration_ms"], abs=0.05
                )
        expect(page.get_by_test_id("job-heading")).to_contain_text(body["name"])
        expect(page.get_by_test_id("job").locator("b")).to_have_count(0)

        (recovering,) = http.get(
            "/api/v1/events", params={"job_id": job_id, "kind": "job.recovering"}
        ).json()["items"]
        assert recovering["data"]["cause"] in why["reason"]  # which leads with the loss
        watched.assert_clean()


@on_sqlite
def test_a_partitioned_source_s_tasks_show_the_partitions_they_read(
    api: Api, open_page: Any, tmp_path: Path
) -> None:
    with api.running_job(growing_submission(tmp_path / "partitions", 3, 3)) as job:
        watched = open_page()
        sign_in(watched.page, api.base_url, ADMIN_TOKEN)
        page = watched.page
        page.locator(f'[data-testid="job-row"][data-job-id="{job}"]').get_by_test_id(
            "job-link"
        ).click()
        for task, shown in (("src-0", "partitions p0, p2"), ("src-1", "partitions p1")):
            row = page.locator(f'[data-testid="task-row"][data-task="{task}"]')
            expect(row.get_by_test_id("task-workload")).to_have_text(shown)
        assert not watched.errors and not watched.outside, (watched.errors, watched.outside)
