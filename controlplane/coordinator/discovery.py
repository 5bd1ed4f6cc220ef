"""New partitions of a partitioned source, found while its job runs, given to its tasks.

1. **Found.** The worker hosting a partitioned source's first task lists its partitions
   every ``discovery_interval_s`` and reports those no task reads
   (``partitions_found``), again at each listing until a change gives them out.
2. **Planned.** :func:`~controlplane.abstraction.add_partitions` gives each to the task
   reading the fewest; the plan names them as ``discovered``, so validation lets it give
   out partitions the base version does not have.
3. **Applied.** With a control plane (the coordinator's ``on_partitions_found``
   listener), it submits the plan like any other, recorded with origin ``discovery``;
   without one, the coordinator applies it. A job that is not running, or busy with
   another change, takes it at a later report. The new partitions' readers start where
   a reader without a position does (the source's settings: for Kafka, ``start``).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import TYPE_CHECKING, Any

from controlplane.abstraction import PlanError, add_partitions
from controlplane.statuses import JobStatus

from .errors import ReconfigurationError

if TYPE_CHECKING:
    from runtime.messages import PartitionsFound

    from .model import RunningJob

__all__ = ["found"]

logger = logging.getLogger(__name__)

_ADDING: weakref.WeakSet[Any] = weakref.WeakSet()  # jobs whose partitions are being added


def found(host: Any, job: RunningJob, msg: PartitionsFound) -> None:
    """Step 1 heard: give ``msg.partitions`` of source ``msg.operator`` out (module
    docstring), unless the job is not running or is already taking them."""
    if job.status != JobStatus.RUNNING or job in _ADDING:
        return
    listener = getattr(host, "on_partitions_found", None)
    if listener is not None:
        try:
            listener(job.id, msg.operator, tuple(msg.partitions))
        except Exception:
            logger.exception("job %s: the partitions listener failed", job.id)
        return
    _ADDING.add(job)
    task = asyncio.ensure_future(_add(host, job, msg.operator, tuple(msg.partitions)))
    task.add_done_callback(lambda _t: _ADDING.discard(job))


async def _add(host: Any, job: RunningJob, operator: str, names: tuple[str, ...]) -> None:
    # Step 2.
    try:
        plan = add_partitions(job.abstraction, operator, names)
    except PlanError as exc:
        logger.warning("job %s: partitions %s not added: %s", job.id, names, exc)
        return
    if not plan:
        return
    # Step 3.
    try:
        report = await host.apply_plan(job.id, plan)
    except (PlanError, ReconfigurationError) as exc:  # busy, or changed meanwhile: next time
        logger.info("job %s: partitions %s not added yet: %s", job.id, names, exc)
        return
    logger.info(
        "job %s: partitions %s of %s added (%s)", job.id, ", ".join(names), operator, report.status
    )
