"""The partitions of a job's partitioned sources, listed by a worker when it is submitted.

A partitioned source names its partitions (a topic's, a set of streams) by asking its
broker. The control plane never runs a job's code, and builds a job's graph in a child
without network, so the graph comes with ``partitions=()`` for such a source; before
placing the job, the coordinator asks a worker (workers run job code and reach brokers)
to list them (``list_partitions`` -> ``partitions_listed``) and gives them out in the
first layout. A source that cannot (a broker unreachable, a topic missing) refuses the
submission with its message: :class:`~.errors.SourceError`.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
from dataclasses import replace
from typing import Any

from runtime import codeload, messages
from runtime.dataflow import DataflowError, JobGraph, checked_partitions

from .errors import SourceError

__all__ = ["LIST_TIMEOUT_S", "listed", "took_reply"]

LIST_TIMEOUT_S = 30.0  # a worker answers within this (its own limit per source is 20 s)

_requests = itertools.count(1)


async def listed(host: Any, graph: JobGraph, worker: str) -> JobGraph:
    """``graph`` with the partitions of each partitioned source that has none yet, as
    ``worker`` lists them (``graph`` itself when there is none). Raises
    :class:`SourceError` naming the source when one cannot list them, when the names are
    not valid, or when the worker does not answer in time."""
    wanted = tuple(op.name for op in graph.operators if op.partitions == ())
    if not wanted:
        return graph
    request_id = next(_requests)
    reply: asyncio.Future[messages.PartitionsListed] = asyncio.get_running_loop().create_future()
    host.listings[request_id] = reply
    data = pickle.dumps(graph)
    host.send(
        worker,
        messages.ListPartitions(request_id, data, codeload.sources_for([data]), wanted),
    )
    try:
        answer = await asyncio.wait_for(reply, LIST_TIMEOUT_S)
    except TimeoutError:
        raise SourceError(
            f"worker {worker} did not list the partitions of {', '.join(wanted)} within "
            f"{LIST_TIMEOUT_S:g}s"
        ) from None
    finally:
        host.listings.pop(request_id, None)
    if answer.error is not None:
        raise SourceError(answer.error)
    ops = []
    for op in graph.operators:
        if op.name in wanted:
            try:
                op = replace(op, partitions=checked_partitions(op, answer.partitions.get(op.name)))
            except DataflowError as exc:
                raise SourceError(str(exc)) from None
        ops.append(op)
    return JobGraph(graph.name, tuple(ops))


def took_reply(host: Any, msg: messages.PartitionsListed) -> None:
    """A worker answered a listing: wake whoever waits for it (a late answer is dropped)."""
    reply = host.listings.get(msg.request_id)
    if reply is not None and not reply.done():
        reply.set_result(msg)
