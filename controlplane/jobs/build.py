"""A job's graph, built from registered code in a throwaway process, with its sinks confined.

Steps:

1. The ref must name registered code (:func:`registered_job`, before anything is
   recorded): :class:`BadJob` ``bad_job_ref`` with how to register it otherwise.
2. :func:`build_graph`: ``python -m runtime.jobbuild`` builds and compiles the graph in a child
   (:func:`controlplane.isolation.run_check`, bounded by :data:`BUILD_TIMEOUT_S`), given
   the ref, the params, the upload it names (if any) and the job's directory; relative
   sink paths land in that directory.
3. The answer is decoded without unpickling anything (:func:`runtime.jobbuild.decode`):
   the graph's logic stays as the child pickled it, for the workers.
4. Unless the caller may write anywhere (an admin), every sink path must lie in the job's
   directory (:func:`confine_sinks`): :class:`BadJob` ``sink_path_refused`` otherwise.

The job's directory is ``<settings.data_dir>/jobs/<job key>`` (:func:`job_dir`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from controlplane.code.registry import Registry
from controlplane.config import Settings
from controlplane.errors import BadJob
from controlplane.isolation import run_check
from runtime import codeload
from runtime.dataflow import JobGraph
from runtime.jobbuild import BuildError, SinkPath, decode

__all__ = ["BUILD_TIMEOUT_S", "build_graph", "confine_sinks", "job_dir", "registered_job"]

logger = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 20.0  # importing a job's modules and building its graph takes at most this
SINK_RULE = (
    "a job submitted with an operate token writes only under its directory {root} "
    "(relative paths land there; '..' and symlinks leading out of it are refused); an "
    "admin token may name any path"
)


def job_dir(settings: Settings, key: str) -> Path:
    """The absolute directory of job ``key``'s output: ``<data_dir>/jobs/<key>``."""
    return Path(settings.data_dir).resolve() / "jobs" / key


def registered_job(settings: Settings, ref: str) -> str:
    """Step 1: the ``module:callable`` or ``code:<id>:callable`` job ``ref`` names (an
    entry point's name gives its target); :class:`BadJob` ``bad_job_ref`` saying how to
    register code otherwise."""
    return Registry.of(settings).job(ref)


def build_graph(
    target: str,
    params: Mapping[str, Any],
    *,
    directory: Path,
    write_anywhere: bool,
    settings: Settings,
) -> tuple[JobGraph, list[SinkPath]]:
    """Steps 2 to 4: the compiled graph of registered job ``target`` (from
    :func:`registered_job`) with ``params``, and where and how its sinks write;
    :class:`BadJob` (codes bad_job_ref, bad_params, invalid_job, job_build_failed,
    sink_path_refused) with the reason otherwise."""
    # Step 2.
    code = {}
    if codeload.is_code_ref(target):
        code_id, _ = codeload.parse_ref(target)
        code[codeload.module_name(code_id)] = codeload.source_of(code_id) or ""
    request = {"ref": target, "params": dict(params), "code": code, "job_dir": str(directory)}
    try:
        answer = run_check(
            "runtime.jobbuild",
            [],
            json.dumps(request),
            timeout=BUILD_TIMEOUT_S,
            error=BadJob,
            doing=f"building job {target!r}",
            settings=settings,
        )
    except BadJob as exc:
        raise BadJob(exc.message, code="job_build_failed") from None
    # Step 3.
    try:
        graph, sinks = decode(answer)
    except BuildError as exc:
        raise BadJob(str(exc), code=exc.code) from None
    # Step 4.
    if not write_anywhere:
        confine_sinks(sinks, directory)
    return graph, sinks


def confine_sinks(sinks: list[SinkPath], directory: Path) -> None:
    """:class:`BadJob` ``sink_path_refused`` naming the first sink whose path has a ``..``
    or, symlinks resolved, lies outside ``directory``."""
    root = Path(os.path.realpath(directory))
    for sink in sinks:
        if sink.path is None or sink.given is None:
            continue
        escapes = ".." in PurePath(sink.given).parts
        if not escapes:
            real = Path(os.path.realpath(sink.path))
            escapes = not real.is_relative_to(root)
        if escapes:
            raise BadJob(
                f"sink {sink.operator!r} would write to {sink.given!r} ({sink.path}): "
                + SINK_RULE.format(root=directory),
                code="sink_path_refused",
            )
