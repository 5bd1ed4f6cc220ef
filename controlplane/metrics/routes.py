"""``/api/v1/jobs/{id}/metrics`` and ``/api/v1/jobs/{id}/metrics/series`` (read scope), and
``/metrics`` (Prometheus text).

``/metrics`` needs no token: Prometheus scrapers are configured with a static target and
rarely carry bearer tokens, and what it exposes is aggregate (counts by status, per-job
rates and latency, worker count: no names, params, plans or code). Put the control plane
behind a network boundary, or a proxy, if even that must stay private.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from controlplane.deps import EngineDep, SessionDep, require
from controlplane.params import JobId

from . import series, service
from .schemas import JobMetricsRead
from .series import MIN_STEP_S, JobSeriesRead

__all__ = ["MAX_WINDOW_S", "prometheus", "router"]

MAX_WINDOW_S = 300.0  # the coordinator keeps this much history (coordinator.metrics.WINDOW_S)
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter(tags=["metrics"])
prometheus = APIRouter(tags=["metrics"])


@router.get("/jobs/{job_id}/metrics", dependencies=[Depends(require("read"))])
def job_metrics(
    job_id: JobId,
    session: SessionDep,
    engine: EngineDep,
    window_s: Annotated[
        float, Query(gt=0, le=MAX_WINDOW_S, description="seconds of history to summarize")
    ] = 10.0,
) -> JobMetricsRead:
    """Rates, busy and backpressure fractions, queues and key-group counts per task and
    operator, the traffic matrix between tasks, sink latency and worker usage over the
    last ``window_s`` seconds."""
    return service.job_metrics(session=session, engine=engine, job_id=job_id, window_s=window_s)


@router.get("/jobs/{job_id}/metrics/series", dependencies=[Depends(require("read"))])
def job_metrics_series(
    job_id: JobId,
    session: SessionDep,
    engine: EngineDep,
    window_s: Annotated[
        float, Query(gt=0, le=MAX_WINDOW_S, description="seconds of history, up to now")
    ] = MAX_WINDOW_S,
    step_s: Annotated[
        float,
        Query(
            ge=MIN_STEP_S,
            le=MAX_WINDOW_S,
            description="seconds per point (at most window_s)",
        ),
    ] = 2.0,
) -> JobSeriesRead:
    """The last ``window_s`` seconds in steps of ``step_s``, for charts: per operator its
    rates, busy and backpressured fractions, queued records and (sinks) latency p99; per
    keyed operator the records per second of each key group; per worker its CPU and RSS."""
    return series.job_series(
        session=session, engine=engine, job_id=job_id, window_s=window_s, step_s=step_s
    )


@prometheus.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}, "description": "Prometheus text"}},
)
def prometheus_metrics(session: SessionDep, engine: EngineDep) -> Response:
    """Prometheus text exposition (no token; see the module docstring)."""
    body = service.prometheus_text(session=session, engine=engine)
    return Response(body, media_type=PROMETHEUS_CONTENT_TYPE)
