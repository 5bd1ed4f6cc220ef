"""A task's input gate tells when its task has run dry (``InputGate.on_dry``): the worker's
background work (state copied ahead, sent or received) waits for every task to have run
dry, and is woken by the last one instead of polling for it."""

from __future__ import annotations

import asyncio

from runtime.channels import InputChannel, InputGate
from runtime.records import Batch


def batch(*values: int) -> Batch:
    return Batch(list(values), [0.0] * len(values))


async def gate_with_one_channel() -> tuple[InputGate, InputChannel, list[str]]:
    events: list[str] = []
    gate = InputGate(on_dry=lambda: events.append("dry"))
    channel = InputChannel("job-1/split-0/count-0", "split-0")
    gate.add(channel)
    return gate, channel, events


def test_a_gate_says_its_task_ran_dry_only_once_nothing_is_left() -> None:
    async def main() -> list[str]:
        gate, channel, events = await gate_with_one_channel()
        channel.push(batch(1, 2))
        channel.push(batch(3))
        for _ in range(2):  # two batches waiting: the task takes both without running dry
            _, item = await gate.next()
            events.append(f"took {item.values}")
        reader = asyncio.create_task(gate.next())
        await asyncio.sleep(0)  # one turn of the loop (no time): the reader runs until it waits
        assert not reader.done()  # waiting for input, and said so
        channel.push(batch(4))
        _, item = await asyncio.wait_for(reader, 1.0)
        events.append(f"took {item.values}")
        return events

    assert asyncio.run(main()) == ["took [1, 2]", "took [3]", "dry", "took [4]"]


def test_a_gate_without_a_listener_waits_as_before() -> None:
    async def main() -> object:
        gate = InputGate()
        channel = InputChannel("job-1/split-0/count-0", "split-0")
        gate.add(channel)
        reader = asyncio.create_task(gate.next())
        await asyncio.sleep(0)  # one turn of the loop (no time): the reader runs until it waits
        assert not reader.done()
        channel.push(batch(7))
        _, item = await asyncio.wait_for(reader, 1.0)
        return item.values

    assert asyncio.run(main()) == [7]
