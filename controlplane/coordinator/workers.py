"""Workers started on demand for a job: by a plan (``new-<k>`` placeholders) or by the
stop-and-restart baseline on new processes."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from controlplane.abstraction import NEW_WORKER, Abstraction, Worker
from controlplane.backends import BackendError

from .errors import ReconfigurationError

if TYPE_CHECKING:
    from .model import WorkerInfo
    from .ports import Membership

__all__ = ["NEW_WORKER_TIMEOUT_S", "remap_workers", "start_workers"]

NEW_WORKER_TIMEOUT_S = 30.0  # a worker asked of the backend registers within this


async def start_workers(coordinator: Membership, n: int, why: str) -> list[WorkerInfo]:
    """Start ``n`` workers and wait until they registered; returns them in registration
    order. ``why`` ends the error's "cannot start ..." sentence."""
    if coordinator.backend is None:
        raise ReconfigurationError(f"{why} but no backend can start one")
    before = {w.id for w in coordinator.workers.values()}
    try:
        await coordinator.backend.start_workers(n)
    except BackendError as exc:
        raise ReconfigurationError(f"cannot start a new worker: {exc}") from None
    try:
        await asyncio.wait_for(_registered(coordinator, before, n), NEW_WORKER_TIMEOUT_S)
    except TimeoutError:
        raise ReconfigurationError(
            f"{n} new worker(s) did not register within {NEW_WORKER_TIMEOUT_S:.0f}s"
        ) from None
    fresh = [w for w in coordinator.workers.values() if w.id not in before]
    return sorted(fresh, key=lambda w: w.registered_at)[:n]


def remap_workers(a: Abstraction, mapping: dict[str, WorkerInfo], backend: str) -> Abstraction:
    """``a`` with every task on a worker in ``mapping`` placed on the worker it maps to.

    A ``new-<k>`` placeholder is replaced by its worker; a real worker stays listed (its
    status is refreshed with the others', see :func:`.layouts.refresh_workers`) and the new
    one is added."""
    data = a.to_dict()
    placeholders = {p: i for p, i in mapping.items() if p.startswith(f"{NEW_WORKER}-")}
    data["workers"] = [
        Worker.from_info(placeholders[w["id"]], backend=backend).to_dict()
        if w["id"] in placeholders
        else w
        for w in data["workers"]
    ]
    listed = {w["id"] for w in data["workers"]}
    data["workers"] += [
        Worker.from_info(info, backend=backend).to_dict()
        for info in mapping.values()
        if info.id not in listed
    ]
    for op in data["operators"]:
        for t in op["tasks"]:
            info = mapping.get(t["resources"]["worker"])
            if info is not None:
                t["resources"] = {
                    "worker": info.id,
                    "host": info.host,
                    "cpus": info.cpus,
                    "memory_mb": info.memory_mb,
                }
    return Abstraction.from_dict(data)


async def _registered(coordinator: Membership, before: set[str], n: int) -> None:
    await coordinator.until_registered(
        lambda: len([w for w in coordinator.alive_workers() if w.id not in before]) >= n
    )
