"""A job whose module, when imported, notes which process imported it: it appends its
pid to the file named by ``STREAMPILOT_TEST_IMPORTS``, if that is set. Tests that a
worker loads a job's code ahead use it (workers inherit the variable from the test)."""

from __future__ import annotations

import os
from typing import Any

from runtime import Dataflow
from runtime.sinks import Null
from runtime.sources import Generator

_NOTES = os.environ.get("STREAMPILOT_TEST_IMPORTS")
if _NOTES:
    with open(_NOTES, "a") as notes:
        notes.write(f"{os.getpid()}\n")


def key_of(record: str) -> str:
    return record


def count(key: str, value: Any, state: Any) -> tuple:
    n = state.get(0) + 1
    state.set(n)
    return ((key, n),)


def build(params: dict[str, Any]) -> Dataflow:
    """Keys counted, unbounded at ``rate`` records/s."""
    flow = Dataflow("import-noting")
    src = flow.source("keys", Generator(records=None, rate=params.get("rate", 1_000), keys=10))
    src.key_by(key_of).process("count", count, parallelism=2).sink("out", Null())
    return flow
