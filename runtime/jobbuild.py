"""``python -m runtime.jobbuild < request``: build a job's graph in a throwaway process.

The control plane never calls a job's code: it runs this module in a child (through
``controlplane.isolation.run_check``) and reads the answer. Protocol:

1. The request, on stdin, is one JSON object: ``ref`` (``module:callable`` or
   ``code:<id>:callable``, already checked against the registered code), ``params`` (the
   dict the callable gets), ``code`` (module name -> source: the uploads the ref needs)
   and ``job_dir`` (the absolute directory of the job's output).
2. The child installs ``code``, calls the callable with ``params`` and compiles the graph
   (:func:`runtime.dataflow.load_job`), then gives every sink whose ``path`` is relative
   (a dataclass sink with a ``path`` field, such as :class:`runtime.sinks.Collect`) that
   path under ``job_dir``.
3. It prints, as the last line of stdout (what the job's code printed comes before), one
   JSON object: ``{"graph": ..., "sinks": [...]}`` (:func:`encode`) or
   ``{"error": {"code": ..., "message": ...}}``, the code being one of ``bad_job_ref``,
   ``bad_params``, ``invalid_job``, ``job_build_failed``.

The graph is plain JSON: each operator's structure, its logic and its inputs' key
selectors as ``{"ref": logic_ref, "pickle": base64}``. :func:`decode` turns it back into
a :class:`~runtime.dataflow.JobGraph` whose logic is :class:`~runtime.dataflow.Pickled`,
without unpickling anything: the control plane reads the structure and ships the graph,
and the workers that unpickle it get the real objects. ``sinks`` lists each sink operator
with the path it writes under (``None`` for a sink without one), as given and as made
absolute, and whether it says it commits with checkpoints (``Sink.exactly_once``).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import pickle
import sys
from collections.abc import Mapping
from typing import Any

from . import codeload
from .dataflow import (
    DataflowError,
    InputSpec,
    JobGraph,
    JobRefError,
    OperatorSpec,
    Pickled,
    load_job,
    logic_ref,
)
from .errors import StreamRuntimeError
from .params import ParamError

__all__ = ["BuildError", "SinkPath", "build", "decode", "encode"]

logger = logging.getLogger(__name__)


class BuildError(StreamRuntimeError, ValueError):
    """A job that does not build, or an answer that is not a graph; ``code`` says which
    (``bad_job_ref``, ``bad_params``, ``invalid_job``, ``job_build_failed``)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True, slots=True)
class SinkPath:
    """Where a sink operator writes: ``given`` by the job, ``path`` made absolute (under
    the job's directory when ``given`` is relative); both None for a sink without a path.
    ``exactly_once``: what its sink says of itself (``Sink.exactly_once``)."""

    operator: str
    given: str | None
    path: str | None
    exactly_once: bool = False


def build(ref: str, params: Mapping[str, Any], job_dir: str) -> tuple[JobGraph, list[SinkPath]]:
    """Step 2: the compiled graph of ``ref`` with ``params``, relative sink paths moved
    under ``job_dir``; :class:`BuildError` with the reason otherwise. Runs the job's code:
    call it in the throwaway process only."""
    try:
        graph = load_job(ref, dict(params))
    except JobRefError as exc:
        raise BuildError(str(exc), "bad_job_ref") from None
    except ParamError as exc:
        raise BuildError(str(exc), "bad_params") from None
    except DataflowError as exc:
        raise BuildError(f"job {ref!r} builds an invalid graph: {exc}", "invalid_job") from None
    except (TypeError, ValueError) as exc:
        raise BuildError(f"job {ref!r} rejected its params: {exc}", "bad_params") from None
    except Exception as exc:
        raise BuildError(
            f"job {ref!r} raised {type(exc).__name__} while building: {exc}", "job_build_failed"
        ) from None
    operators, sinks = [], []
    for op in graph.operators:
        if op.kind == "sink":
            op, where = _confine(op, job_dir)
            sinks.append(where)
        operators.append(op)
    return JobGraph(graph.name, tuple(operators)), sinks


def _confine(op: OperatorSpec, job_dir: str) -> tuple[OperatorSpec, SinkPath]:
    """The sink operator with a relative ``path`` under ``job_dir``, and where it writes."""
    sink = op.logic
    once = getattr(sink, "exactly_once", False) is True
    given = getattr(sink, "path", None) if dataclasses.is_dataclass(sink) else None
    if not isinstance(given, str | os.PathLike):
        return op, SinkPath(op.name, None, None, once)
    given = os.fspath(given)
    if os.path.isabs(given):
        return op, SinkPath(op.name, given, given, once)
    path = os.path.join(job_dir, given)
    moved = dataclasses.replace(sink, path=path)  # type: ignore[type-var]
    return dataclasses.replace(op, logic=moved), SinkPath(op.name, given, path, once)


def _held(obj: Any) -> dict[str, str]:
    return {"ref": logic_ref(obj), "pickle": base64.b64encode(pickle.dumps(obj)).decode()}


def encode(graph: JobGraph, sinks: list[SinkPath]) -> dict[str, Any]:
    """The answer for a built graph (module docstring, step 3)."""
    return {
        "graph": {
            "name": graph.name,
            "operators": [
                {
                    "name": op.name,
                    "kind": op.kind,
                    "parallelism": op.parallelism,
                    "max_parallelism": op.max_parallelism,
                    "partitions": None if op.partitions is None else list(op.partitions),
                    "event_time": None if op.event_time is None else _held(op.event_time),
                    "combinable": op.combinable,
                    "logic": _held(op.logic),
                    "inputs": [
                        {
                            "upstream": inp.upstream,
                            "partitioning": inp.partitioning,
                            "key": None if inp.key is None else _held(inp.key),
                        }
                        for inp in op.inputs
                    ],
                }
                for op in graph.operators
            ],
        },
        "sinks": [dataclasses.asdict(s) for s in sinks],
    }


def decode(answer: Mapping[str, Any]) -> tuple[JobGraph, list[SinkPath]]:
    """The graph and sink paths of an answer, logic as :class:`Pickled` (never unpickled);
    the structure is validated again (:meth:`JobGraph.of`). :class:`BuildError` for the
    child's own refusal, or (``job_build_failed``) an answer that is not a graph."""
    if "error" in answer:
        error = answer["error"]
        if isinstance(error, Mapping):
            raise BuildError(str(error.get("message")), str(error.get("code")))
        raise BuildError(str(error), "job_build_failed")
    try:
        graph = answer["graph"]
        operators = [
            OperatorSpec(
                _string(op["name"]),
                _string(op["kind"]),  # type: ignore[arg-type]
                _pickled(op["logic"]),
                _integer(op["parallelism"]),
                tuple(
                    InputSpec(
                        _string(inp["upstream"]),
                        _string(inp["partitioning"]),  # type: ignore[arg-type]
                        None if inp["key"] is None else _pickled(inp["key"]),
                    )
                    for inp in op["inputs"]
                ),
                _integer(op["max_parallelism"]),
                _partitions(op.get("partitions")),
                None if op.get("event_time") is None else _pickled(op["event_time"]),
                op.get("combinable") is True,
            )
            for op in graph["operators"]
        ]
        sinks = [
            SinkPath(
                _string(s["operator"]),
                _optional(s["given"]),
                _optional(s["path"]),
                s.get("exactly_once") is True,
            )
            for s in answer["sinks"]
        ]
        return JobGraph.of(_string(graph["name"]), operators), sinks
    except (KeyError, TypeError, ValueError) as exc:
        raise BuildError(
            f"the job's build answered no graph ({exc!r})", "job_build_failed"
        ) from None


def _partitions(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise TypeError(f"partitions must be a list, got {type(value).__name__}")
    return tuple(_string(p) for p in value)


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _optional(value: Any) -> str | None:
    return None if value is None else _string(value)


def _integer(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    return value


def _pickled(value: Any) -> Pickled:
    return Pickled(_string(value["ref"]), base64.b64decode(_string(value["pickle"]), validate=True))


def main() -> int:
    request = json.loads(sys.stdin.read())
    try:
        codeload.install_many(request.get("code", {}))
        graph, sinks = build(request["ref"], request.get("params", {}), request["job_dir"])
        answer: dict[str, Any] = encode(graph, sinks)
    except codeload.CodeError as exc:  # an upload that no longer imports
        answer = {"error": {"code": "job_build_failed", "message": str(exc)}}
    except BuildError as exc:
        answer = {"error": {"code": exc.code, "message": str(exc)}}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")  # last line: the job's prints above
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
