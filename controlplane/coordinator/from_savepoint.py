"""A job started from a savepoint: whether the savepoint fits the job's graph, and the
copy of its files the new job starts from.

A savepoint (step 5 of :mod:`.checkpoint_protocol`) is restored into a *new* job, which
may run other logic and other parallelisms, as long as its state finds its place:

- every **keyed operator** of the savepoint is in the graph by name, keyed, with the same
  ``max_parallelism`` (its key groups), and every keyed operator of the graph is in the
  savepoint; its parallelism is free: each new task reads its key groups' chains,
  whichever task held them (:func:`.recovery.restore_of`);
- every **source** of the savepoint is in the graph with the same parallelism, and every
  source of the graph is in the savepoint: a position is per source task; a
  partitioned source's parallelism is free (a position is per partition) as long as it
  still lists every partition it read at the savepoint;
- every **sink** that had state at the savepoint (what its writer had written) is in the
  graph with the same parallelism: that state too is per task.

Stateless operators may change freely. :func:`incompatibility` says what does not fit,
naming the operator. :func:`parse_manifest` checks that a manifest read from the store is
one (:class:`ValueError` saying what is wrong otherwise).

**Never dependent on the savepoint's files.** Before the new job deploys,
:func:`copy_savepoint` copies every part file the savepoint's chains read into the new
job's own directory of the store, ``<job>/chk-<savepoint id>/``, and writes there a
manifest of the copy (the new job's version 1): the new job's checkpoints build on its
copy, its retention removes the copy once nothing refers to it, a recovery before its
first checkpoint goes back to it, and the savepoint may be deleted as soon as the
submission returns (Flink's "no claim" mode, with a copy instead of a first full
checkpoint).

The functions that read or write the store block: run them on a thread.
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack

from runtime.checkpoints.store import CheckpointStore
from runtime.dataflow import JobGraph

from .checkpoint_protocol import checkpoint_dir
from .checkpoint_report import CheckpointKind
from .checkpointer import manifest_path

__all__ = ["copy_savepoint", "incompatibility", "parse_manifest", "stored_savepoints"]

logger = logging.getLogger(__name__)

_SAVEPOINT_MANIFEST = "/_savepoint.msgpack"


def parse_manifest(data: bytes) -> dict[str, Any]:
    """The savepoint manifest in ``data``; :class:`ValueError` naming what is wrong when
    it is not one (not msgpack, a field missing or of the wrong type)."""
    try:
        manifest = msgpack.unpackb(data, strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"it is not a manifest (not msgpack: {exc})") from None
    if not isinstance(manifest, dict):
        raise ValueError("it is not a manifest (not a map)")
    for name, kind in (
        ("job_id", str),
        ("checkpoint_id", int),
        ("tasks", dict),
        ("operators", dict),
    ):
        if not isinstance(manifest.get(name), kind):
            raise ValueError(f"its field {name!r} is missing or not a {kind.__name__}")
    for task, part in manifest["tasks"].items():
        groups = part.get("groups") if isinstance(part, dict) else None
        if not isinstance(groups, dict):
            raise ValueError(f"the part of task {task!r} has no key groups map")
        for g, chain in groups.items():
            if not isinstance(chain, list | tuple) or not all(
                isinstance(link, list | tuple) and len(link) == 5 and isinstance(link[0], str)
                for link in chain
            ):
                raise ValueError(f"task {task!r}: the chain of key group {g} is not a chain")
    for name, op in manifest["operators"].items():
        if not isinstance(op, dict) or not {"kind", "parallelism", "max_parallelism"} <= set(op):
            raise ValueError(f"operator {name!r} is not described (kind, parallelism, ...)")
    return manifest


def incompatibility(manifest: dict[str, Any], graph: JobGraph) -> str | None:
    """Why ``graph`` cannot start from the savepoint ``manifest`` (module docstring),
    naming the operator; None when it can."""
    saved: dict[str, dict[str, Any]] = manifest["operators"]
    ops = {op.name: op for op in graph.operators}
    with_sink_state = {
        tid.rpartition("-")[0]
        for tid, part in manifest["tasks"].items()
        if part.get("sink") is not None
    }
    for name, was in saved.items():
        op = ops.get(name)
        kind, parallelism = was["kind"], was["parallelism"]
        if kind == "keyed":
            if op is None or not op.keyed:
                now = "is not in the job" if op is None else f"is a {op.kind} operator in the job"
                return (
                    f"keyed operator {name!r} of the savepoint {now}: its state would be "
                    f"lost; keep a keyed operator named {name!r}"
                )
            if op.max_parallelism != was["max_parallelism"]:
                return (
                    f"keyed operator {name!r} has {was['max_parallelism']} key groups "
                    f"(max_parallelism) in the savepoint and {op.max_parallelism} in the job: "
                    f"set max_parallelism={was['max_parallelism']}"
                )
        elif kind == "source" or (kind == "sink" and name in with_sink_state):
            what = "source" if kind == "source" else "sink"
            if op is None or op.kind != kind:
                now = "is not in the job" if op is None else f"is a {op.kind} operator in the job"
                return (
                    f"{what} {name!r} of the savepoint {now}: its tasks' state (positions, "
                    f"what they wrote) would be lost; keep a {what} named {name!r}"
                )
            if kind == "source" and op.partitions == ():
                continue  # listed when the job is submitted: checked again then
            if kind == "source" and op.partitions is not None:
                read = {
                    p
                    for tid, part in manifest["tasks"].items()
                    if tid.rpartition("-")[0] == name and isinstance(part.get("position"), dict)
                    for p in part["position"]
                }
                if lost := sorted(read - set(op.partitions)):
                    return (
                        f"source {name!r} read partition(s) {', '.join(lost)} at the savepoint, "
                        f"which it does not list now ({', '.join(op.partitions)}): their "
                        "positions would be lost"
                    )
                continue  # partitions go to whichever task reads them: any parallelism
            if op.parallelism != parallelism:
                return (
                    f"{what} {name!r} ran {parallelism} task(s) at the savepoint and would run "
                    f"{op.parallelism} in the job: its state is per task, so keep its "
                    f"parallelism at {parallelism}"
                )
    for op in graph.operators:
        if (op.keyed or op.kind == "source") and op.name not in saved:
            what = "keyed operator" if op.keyed else "source"
            return (
                f"{what} {op.name!r} of the job is not in the savepoint (it has "
                f"{', '.join(sorted(saved))}): is it a savepoint of this job?"
            )
    return None


def copy_savepoint(store: CheckpointStore, manifest: dict[str, Any], job_id: str) -> dict[str, Any]:
    """Copy the part files ``manifest`` (a savepoint of another job) reads into job
    ``job_id``'s directory and write the manifest of the copy (module docstring); returns
    it: the savepoint's, its chains naming the copies, as a completed checkpoint of
    ``job_id`` at version 1. Raises the store's errors."""
    sid = int(manifest["checkpoint_id"])
    target = checkpoint_dir(job_id, sid)
    copies: dict[str, str] = {}
    for part in manifest["tasks"].values():
        for chain in part["groups"].values():
            for link in chain:
                old = link[0]
                if old not in copies:
                    where, _, name = old.rpartition("/")
                    copies[old] = f"{target}/from-{where.rpartition('/')[2]}-{name}"
    for old, new in copies.items():
        store.put(new, store.get(old))
    tasks = {
        tid: {
            **part,
            "groups": {
                g: [[copies[link[0]], *link[1:]] for link in chain]
                for g, chain in part["groups"].items()
            },
        }
        for tid, part in manifest["tasks"].items()
    }
    base = {
        **manifest,
        "job_id": job_id,
        "kind": str(CheckpointKind.CHECKPOINT),
        "version": 1,
        "tasks": tasks,
        "from_savepoint": f"{manifest['job_id']}/{sid}",
    }
    store.put(manifest_path(job_id, sid), msgpack.packb(base, use_bin_type=True))
    logger.info(
        "job %s: savepoint %s/%s copied (%d files)", job_id, manifest["job_id"], sid, len(copies)
    )
    return base


def stored_savepoints(store: CheckpointStore, job_id: str) -> list[dict[str, Any]]:
    """The manifests of job ``job_id``'s savepoints in ``store`` (to pin them again when
    the job resumes under a new control plane); one that cannot be read is left out,
    with a warning (its files are then no longer protected)."""
    found = []
    for path in store.list(job_id):
        if path.endswith(_SAVEPOINT_MANIFEST):
            try:
                found.append(parse_manifest(store.get(path)))
            except Exception as exc:
                logger.warning("job %s: savepoint manifest %s unreadable: %s", job_id, path, exc)
    return found
