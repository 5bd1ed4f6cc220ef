"""The console's operations views in a real browser (Debian's chromium through Playwright,
the fixtures of ``test_console_browser``) against a real server running a word count with
checkpoints, a controller attached in dry-run mode and a scale-out made by the test: the
job graph has a box per task on its worker, the charts (uPlot) have points and mark the
scale-out, the checkpoints and the controller's decisions, the heat map has cells with load
and names each key group's owner, the controller can be stopped and started from the page,
and the workers' charts have a line per worker.

A PNG of each view goes to the directory named by ``STREAMPILOT_SCREENSHOTS`` when it is
set (e.g. to look at them after a change), else to the test's ``tmp_path``. Every wait is
on the page's state, bounded by ``VIEW_WAIT_MS``.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_support import ADMIN_TOKEN, Api
from playwright.sync_api import Page, expect
from test_console_browser import browser, open_page, sign_in  # noqa: F401  (fixtures)

VIEW_WAIT_MS = 30_000  # the views read the series every 4 s; a job's first points take ~10 s
VIEWS = ("graph", "charts", "heatmap", "controllers", "workers")
WORDCOUNT = {
    "name": "wordcount views",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000, "zipf": 1.2},
    "checkpoints": {"interval_s": 2.0},
}
# Asks every second to scale count to 4; in dry-run mode each ask is only recorded, and
# without a cooldown (a dry run counts for it) every one is a dry run.
NO_LIMITS = {"cooldown_s": 0}
SCALER = textwrap.dedent(
    """
    from controllers import Controller, scale

    class AsksForFour(Controller):
        def decide(self, view):
            print("count has", view.abstraction.operator("count").parallelism, "tasks")
            return scale(view.abstraction, "count", 4)
    """
)

# The values of each line of the uPlot chart with this test id that are above 0.
LINES_ABOVE_ZERO = """([testid]) => {
  const u = document.querySelector(`[data-testid="${testid}"]`)?.uplot;
  return u ? u.data.slice(1).map((line) => line.filter((v) => v > 0).length) : null;
}"""
CHART_LABELS = """([testid]) => document.querySelector(`[data-testid="${testid}"]`)
  .uplot.series.slice(1).map((s) => s.label)"""
RATES_IN_BOXES = """() => [...document.querySelectorAll("[data-rate-of]")]
  .some((text) => /[1-9]/.test(text.textContent))"""
HEAT_CELLS = """() => Number(document.querySelector('[data-testid="heatmap-chart"]')
  ?.dataset.cells) > 0"""


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("STREAMPILOT_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def job(api: Api) -> Iterator[int]:
    with api.running_job(WORDCOUNT) as job_id:
        yield job_id


def wait_for_lines(page: Page, testid: str, lines: int) -> None:
    """Until the chart ``testid`` has ``lines`` lines, each with a point above 0."""
    page.wait_for_function(
        f"args => {{ const n = ({LINES_ABOVE_ZERO})(args); "
        f"return n !== null && n.length === {lines} && n.every((x) => x > 0); }}",
        arg=[testid],
        timeout=VIEW_WAIT_MS,
    )


@pytest.mark.parametrize("api", ["sqlite"], indirect=True, ids=["sqlite"])
def test_each_view_shows_the_running_job(
    api: Api,
    job: int,
    open_page: Any,  # noqa: F811  (the fixture imported above)
    screenshots: Path,
) -> None:
    with api.client() as http:
        form = {"name": "asks-for-4", "job_id": str(job), "config": '{"interval_s": 1}'}
        r = http.post(
            "/api/v1/controllers",
            data={**form, "dry_run": "true", "safety": json.dumps(NO_LIMITS)},
            files={"file": ("scaler.py", SCALER.encode(), "text/x-python")},
        )
        assert r.status_code == 201, r.text
        controller = r.json()
        r = http.post(f"/api/v1/jobs/{job}/scale", json={"operator": "count", "parallelism": 3})
        assert r.status_code == 202, r.text
        rec = api.wait_reconfiguration(http, job, r.json()["id"])
        assert rec["status"] == "completed", rec
        abstraction = http.get(f"/api/v1/jobs/{job}/abstraction").json()
    operators = abstraction["operators"]
    tasks = {t["id"]: t for op in operators for t in op["tasks"]}
    workers = sorted({t["resources"]["worker"] for t in tasks.values()})

    watched = open_page()
    page = watched.page
    sign_in(page, api.base_url, ADMIN_TOKEN)
    page.goto(f"{api.base_url}/#job={job}")
    expect(page.get_by_test_id("job-version")).to_have_text(str(abstraction["job"]["version"]))

    # The graph: a box per task, on its worker; an arrow per input, its partitioning named.
    boxes = page.get_by_test_id("graph-task")
    expect(boxes).to_have_count(len(tasks))
    shown = boxes.evaluate_all("gs => gs.map(g => [g.dataset.task, g.dataset.worker])")
    assert sorted(shown) == sorted([t, x["resources"]["worker"]] for t, x in tasks.items())
    edges = page.get_by_test_id("graph-edge").evaluate_all(
        "gs => gs.map(g => [g.dataset.from, g.dataset.to, g.dataset.partitioning])"
    )
    assert edges == [
        [i["upstream"], op["name"], i["partitioning"]] for op in operators for i in op["inputs"]
    ]
    expect(page.get_by_test_id("graph-worker")).to_have_count(len(abstraction["workers"]))
    page.wait_for_function(RATES_IN_BOXES, timeout=VIEW_WAIT_MS)  # the window's rates

    # The charts: a line per operator (per sink for latency), with points, and the marks.
    wait_for_lines(page, "chart-throughput", len(operators))
    labels = page.evaluate(CHART_LABELS, ["chart-throughput"])
    assert labels == [
        f"{op['name']} (out)" if op["kind"] == "source" else op["name"] for op in operators
    ]
    wait_for_lines(page, "chart-latency", 1)
    assert page.evaluate(CHART_LABELS, ["chart-latency"]) == ["sink p99"]
    backpressure = page.evaluate(LINES_ABOVE_ZERO, ["chart-backpressure"])
    assert backpressure is not None and len(backpressure) == len(operators)
    throughput = page.get_by_test_id("chart-throughput")
    scaled = throughput.locator(f'[data-marker="reconfiguration"][data-id="{rec["id"]}"]')
    expect(scaled).to_have_count(1, timeout=VIEW_WAIT_MS)
    title = re.compile(rf"^Reconfiguration {rec['id']} \(scale\) completed \(")  # (its time)
    expect(scaled).to_have_attribute("title", title)
    expect(throughput.locator('[data-marker="checkpoint"]').first).to_be_attached()
    expect(throughput.locator('[data-marker="decision"]').first).to_be_attached()

    # The heat map: cells with load, and the owners of the key groups as the abstraction says.
    heat = page.locator('[data-testid="heatmap"][data-operator="count"]')
    page.wait_for_function(HEAT_CELLS, timeout=VIEW_WAIT_MS)
    count = next(op for op in operators if op["name"] == "count")
    owners = heat.get_by_test_id("heatmap-owner")
    expect(owners).to_have_count(len(count["tasks"]))
    for task in count["tasks"]:
        owner = heat.locator(f'[data-testid="heatmap-owner"][data-task="{task["id"]}"]')
        expect(owner).to_contain_text(f"({len(task['workload']['key_groups'])})")
        expect(owner).to_contain_text(task["resources"]["worker"])

    # The controller: its dry-run decisions, its log, and Stop then Start from the page.
    row = page.locator(f'[data-testid="controller-row"][data-id="{controller["id"]}"]')
    expect(row.get_by_test_id("controller-status")).to_have_text("running")
    decision = page.get_by_test_id("decision-row").first
    expect(decision.get_by_test_id("decision-status")).to_have_text("dry_run")
    expect(decision.get_by_test_id("decision-plan")).to_contain_text("workload of")
    expect(page.get_by_test_id("controller-logs")).to_contain_text("count has 3 tasks")
    row.get_by_test_id("controller-stop").click()
    expect(row.get_by_test_id("controller-status")).to_have_text("stopped")
    expect(page.get_by_test_id("controllers-status")).to_have_text(
        f"Controller {controller['id']} (asks-for-4) is stopped."
    )
    row.get_by_test_id("controller-start").click()
    expect(row.get_by_test_id("controller-status")).to_have_text("running")

    # The workers: a CPU and a memory line per worker hosting the job.
    wait_for_lines(page, "chart-rss", len(workers))
    assert page.evaluate(CHART_LABELS, ["chart-cpu"]) == workers
    assert page.evaluate(CHART_LABELS, ["chart-rss"]) == workers

    for view in VIEWS:
        page.get_by_test_id(f"view-{view}").screenshot(path=screenshots / f"console-{view}.png")
    assert all((screenshots / f"console-{view}.png").stat().st_size > 0 for view in VIEWS)
    watched.assert_clean()
