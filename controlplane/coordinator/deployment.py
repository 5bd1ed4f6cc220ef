"""Steps 2-4 of deploying a job (the steps are listed in :mod:`.core`, which does step 1):
deploy a layout on its workers as the job's next attempt and wait for every answer, start
the deployed job, and send its code ahead to the workers it does not use.

A submit, a recovery (:mod:`.recovery`), a resume (:mod:`.resume`) and the
stop-and-restart baseline (:mod:`.restart`) deploy through :meth:`.ports.JobHost.deploy`
and :meth:`.ports.JobHost.start_deployed`, which the coordinator forwards here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from typing import TYPE_CHECKING

from runtime import codeload, messages

from .model import DeployInFlight

if TYPE_CHECKING:
    from runtime.layout import Layout

    from .model import RunningJob
    from .ports import JobHost, Membership

__all__ = ["DEPLOY_TIMEOUT_S", "deploy", "start_deployed", "warm"]

DEPLOY_TIMEOUT_S = 30.0  # workers import the job's modules and open channels within this


async def deploy(
    host: JobHost,
    job: RunningJob,
    layout: Layout,
    restore: dict[str, messages.Restore] | None = None,
) -> str | None:
    """Steps 2-3: deploy ``layout`` on its workers as the job's next attempt; returns
    an error, or None when deployed. A worker it deploys to that is lost meanwhile
    fails it at once, the error naming the worker (see :func:`.inbox.lost`).

    ``restore`` (task -> its key groups' state and source position) seeds tasks with
    state, for a restart from a snapshot.
    """
    used = layout.workers_used()
    missing = [w for w in used if not host.connected(w)]
    if missing:
        return f"workers {missing} are not connected"
    job.attempt += 1
    graph = pickle.dumps(job.graph)
    base = messages.Deploy(
        job_id=job.id,
        graph=graph,
        code=codeload.sources_for([graph, *layout.logic.values()]),
        layout=layout,
        workers=host.data_addresses(),
        config=host.channel_config(),
        attempt=job.attempt,
        checkpoints=job.checkpoint_config,
    )
    deploying = job.deploying = DeployInFlight(used)
    # Step 2. Deploy everywhere.
    for wid in used:
        msg = base
        if restore:
            mine = {t: r for t, r in restore.items() if layout.placement.get(t) == wid}
            msg = dataclasses.replace(base, restore=mine)
        host.send(wid, msg)
    # Step 3. Wait for every worker's answer, or for one of them lost.
    try:
        return await asyncio.wait_for(deploying.outcome, DEPLOY_TIMEOUT_S)
    except TimeoutError:
        return (
            f"deploy timed out after {DEPLOY_TIMEOUT_S:.0f}s: no answer from workers "
            f"{deploying.waiting}"
        )
    finally:
        if job.deploying is deploying:
            job.deploying = None


def start_deployed(host: JobHost, job: RunningJob) -> None:
    """Step 4: tell the workers of ``job``'s layout to start it (``job.started_at`` is
    the clock origin); warm the others."""
    for wid in job.layout.workers_used():
        host.send(wid, messages.Start(job.id, job.started_at))
    warm(host, job, [w.id for w in host.alive_workers()])


def warm(host: Membership, job: RunningJob, workers: list[str]) -> None:
    """Send the job's code to those of ``workers`` that host none of its tasks: each
    imports it at once, so that a task moved there later (a migration to a spare, a
    scale out) does not wait for the imports in the prepare (tens of milliseconds on a
    fresh worker, against a few for the rest of a prepare)."""
    used = set(job.layout.workers_used())
    idle = [w for w in workers if w not in used and host.connected(w)]
    if not idle:
        return
    graph = pickle.dumps(job.graph)
    msg = messages.Warm(job.id, graph, codeload.sources_for([graph, *job.layout.logic.values()]))
    for wid in idle:
        host.send(wid, msg)
