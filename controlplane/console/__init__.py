"""The dashboard at ``/``: one HTML page, one JavaScript module and one stylesheet, served
by the app itself (no build step, no CDN, nothing fetched from the internet).

The page is a plain client of ``/api/v1``: it asks for a bearer token and keeps it in the
browser's ``localStorage``, lists the jobs, and for the selected job shows the abstraction
as a table of tasks, the metrics window (polled about every 2 s) and the reconfiguration
history with its phase timings; with an ``operate`` token it can scale and rebalance.

:func:`install` adds two things to an app, neither in the OpenAPI description:

- ``GET /``: the page (``static/index.html``);
- ``/console/static/...``: its assets.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["STATIC_DIR", "STATIC_URL", "install"]

STATIC_DIR = Path(__file__).parent / "static"
STATIC_URL = "/console/static"


def install(app: FastAPI) -> None:
    """Serve the dashboard at ``/`` and its assets under :data:`STATIC_URL` on ``app``."""
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="console-static")

    @app.get("/", include_in_schema=False)
    def console() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})
