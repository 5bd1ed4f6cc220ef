"""The dashboard at ``/``: one HTML page, its JavaScript modules and stylesheet, and uPlot
(``static/vendor/uplot-1.6.32``, MIT, with its licence) for the charts, all served by the
app itself (no build step, no CDN, nothing fetched from the internet).

The page is a plain client of ``/api/v1``: it asks for a bearer token and keeps it in the
browser's ``localStorage``, lists the jobs, and for the selected job shows the job graph,
charts of the last five minutes (``/jobs/{id}/metrics/series``) with reconfigurations,
recoveries, checkpoints and controller decisions marked, a heat map of each keyed
operator's key-group load, its controllers (decisions, logs, start and stop), its
workers' CPU and memory, and as tables the abstraction's tasks, the metrics window (polled
about every 2 s), the reconfiguration history with its phase timings and the newest
checkpoints; with an ``operate`` token it can scale and rebalance.

``console.js`` runs the page (polling, tables, actions) over ``api.js`` (the client),
``dom.js`` and ``format.js``; ``views.js`` feeds the operations views: ``graph.js``,
``charts.js`` (uPlot charts and their markers), ``heatmap.js`` and ``controllers.js``.

:func:`install` adds these to an app, none in the OpenAPI description:

- ``GET /``: the page (``static/index.html``);
- ``/console/static/...``: its assets;
- ``GET /redoc``: the Redoc reference, with fastapi-offline's bundle served from
  ``/console/redoc.standalone.js`` with the one address it hard-codes (its logo, on its
  CDN) pointed at the app's own icon, so that the page asks nothing of the internet.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

__all__ = ["STATIC_DIR", "STATIC_URL", "install"]

STATIC_DIR = Path(__file__).parent / "static"
STATIC_URL = "/console/static"
OFFLINE_DOCS_URL = "/static-offline-docs"  # where fastapi-offline serves its assets
REDOC_BUNDLE = Path(fastapi_offline.__file__).parent / "static" / "redoc.standalone.js"
REDOC_CDN_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@cache
def _redoc_bundle() -> bytes:
    """fastapi-offline's Redoc bundle with its CDN logo replaced by the app's icon."""
    text = REDOC_BUNDLE.read_text(encoding="utf-8")
    return text.replace(REDOC_CDN_LOGO, f"{OFFLINE_DOCS_URL}/favicon.png").encode()


def install(app: FastAPI) -> None:
    """Serve the dashboard at ``/`` and its assets under :data:`STATIC_URL` on ``app``."""
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="console-static")

    @app.get("/", include_in_schema=False)
    def console() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/console/redoc.standalone.js", include_in_schema=False)
    def redoc_bundle() -> Response:
        return Response(_redoc_bundle(), media_type="text/javascript")

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}/console/redoc.standalone.js",
            redoc_favicon_url=f"{root}{OFFLINE_DOCS_URL}/favicon.png",
            with_google_fonts=False,
        )
