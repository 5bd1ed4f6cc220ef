"""Screenshots of the console's views of a job a controller reconfigures.

1. Start ``streampilot server`` (SQLite and its data in a temporary directory, 3 local workers:
   :func:`controlplane.cli.demo.local_server`) with an admin token made in its database.
2. Submit the stock exchange of ``bench/controllers.py``'s autoscaler scenario: match
   costing ``WORK_US`` per order, the order rate stepping up by ``STEP`` at 25% of the run
   and back down at 60%.
3. Once ``WARMUP_S`` have passed, attach a built-in controller (``--builtin``, default
   ``latency_autoscaler`` with the scenario's config and safety; another built-in runs
   with its defaults and the same safety).
4. At the end of the run, open the console in Debian's chromium (headless, Playwright),
   wait until its charts and heat map have points, and save a PNG of each view (graph,
   charts, heat map, controllers, workers) into ``--out`` (default ``docs/images/console``).
5. Stop the job and the server.

Run with ``.venv/bin/python bench/console_shots.py [--duration S] [--out DIR]``; a run of
180 s or more shows the step up, the controller's reconfigurations and the step down.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import Page, sync_playwright

from bench.controllers import AUTOSCALER, STEP, WARMUP_S, autoscaler_params, step_times
from controlplane.cli.client import Client
from controlplane.cli.demo import attach_builtin, free_port, local_server
from controlplane.cli.server import server_settings
from controlplane.cli.tokens import create_token_in_database

CHROMIUM = "/usr/bin/chromium"  # Debian's (never `playwright install`)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
OUT = Path(__file__).resolve().parent.parent / "docs" / "images" / "console"
VIEWS = ("graph", "charts", "heatmap", "controllers", "workers")
WORKERS = 3  # as the autoscaler scenario
VIEWPORT = {"width": 1280, "height": 900}
PAGE_WAIT_MS = 30_000  # the views read the series every 4 s
PROGRESS_S = 10.0  # a line on the terminal this often
# The charts and the heat map have points (views.js keeps each uPlot on its element).
CHARTS_DRAWN = """() => {
  const u = document.querySelector('[data-testid="chart-throughput"]')?.uplot;
  const heat = document.querySelector('[data-testid="heatmap-chart"]');
  return u && u.data[1].some((v) => v > 0) && Number(heat?.dataset.cells) > 0;
}"""


def shoot(page: Page, base: str, token: str, job_id: int, out: Path) -> list[Path]:
    """Step 4: the job's page with ``token``, then a PNG of each view."""
    page.goto(f"{base}/")
    page.evaluate("token => localStorage.setItem('streampilot.token', token)", token)
    page.goto(f"{base}/#job={job_id}")
    page.reload()  # a change of the address's fragment alone does not load the page again
    page.wait_for_function(CHARTS_DRAWN, timeout=PAGE_WAIT_MS)
    shots = []
    for view in VIEWS:
        path = out / f"{view}.png"
        page.get_by_test_id(f"view-{view}").screenshot(path=path)
        shots.append(path)
    return shots


def run(duration: float, builtin: str, out: Path) -> list[Path]:
    """Steps 1 to 5 of the module docstring."""
    out.mkdir(parents=True, exist_ok=True)
    config = AUTOSCALER["config"] if builtin == AUTOSCALER["builtin"] else {}
    up, down = step_times(duration)
    with tempfile.TemporaryDirectory(prefix="streampilot-shots-") as tmp:
        # The server, a child process, reads STREAMPILOT_*: its data (the checkpoints) goes
        # to the temporary directory, not under the working directory.
        os.environ["STREAMPILOT_DATA_DIR"] = str(Path(tmp, "data"))
        settings = server_settings(database_url=f"sqlite:///{tmp}/shots.db")
        token = create_token_in_database(settings, "console-shots", ["admin"])
        log = Path(tmp, "server.log")
        with (
            local_server(settings.database_url, free_port(), WORKERS, log) as base,
            Client(base, token) as api,
        ):
            # Step 2.
            body = {
                "name": "stock exchange, rate step",
                "job": "examples.stock_exchange:build",
                "params": autoscaler_params(duration),
            }
            job = api.post("/jobs", body)
            if job["status"] == "failed":
                raise RuntimeError(f"the job failed to start: {job['error']}")
            job_id, start = job["id"], time.monotonic()
            print(f"job {job_id}: order rate x{STEP:g} from {up:g} s to {down:g} s")
            # Step 3.
            time.sleep(WARMUP_S)
            cid = attach_builtin(api, job_id, builtin, config, AUTOSCALER["safety"])["id"]
            print(f"controller {cid} ({builtin}) attached at {time.monotonic() - start:.0f} s")
            while (left := duration - (time.monotonic() - start)) > 0:
                time.sleep(min(PROGRESS_S, left))
                recs = api.get(f"/jobs/{job_id}/reconfigurations")["total"]
                print(f"  {time.monotonic() - start:5.1f} s: {recs} reconfigurations", flush=True)
            # Step 4.
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_context(viewport=VIEWPORT).new_page()
                    shots = shoot(page, base, token, job_id, out)
                finally:
                    browser.close()
            # Step 5.
            api.delete(f"/jobs/{job_id}")
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=240.0, help="seconds the job runs")
    parser.add_argument("--builtin", default=AUTOSCALER["builtin"], help="built-in controller")
    parser.add_argument("--out", type=Path, default=OUT, help="directory of the PNG files")
    args = parser.parse_args()
    if args.duration <= WARMUP_S:
        parser.error(f"--duration must be over the {WARMUP_S:g} s before the controller joins")
    for path in run(args.duration, args.builtin, args.out):
        print(path)


if __name__ == "__main__":
    main()
