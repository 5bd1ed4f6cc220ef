"""What shipping key-group state costs each end, in CPU, with nothing else running.

Copying a task's state ahead of a migration (``runtime.precopy``) runs at idle priority
beside the task's records: how long it takes is its CPU cost over the CPU the workers
leave idle. This measures that cost alone, through the code the workers run: a sender
process holds ``--mb`` of word-count state (``(count, padding)`` per word, in 64 key
groups) and copies every group ahead (``precopy.export_base`` and ``send_state`` on a
``PeerLink``, as ``JobRuntime._precopy`` does) to a receiver process that takes the
frames in a ``DataServer`` and reads each copy (``StateInbox``, as ``read_copies``
does). Each process reports its CPU time for the transfer (user and system, and its page faults) and
the wall time from the first byte to the last group read. Rounds alternate between
variants of the worker processes' environment (``--env NAME=VALUE``, e.g. glibc malloc
tunables), each in fresh processes, so that the machine's slow and fast moments fall on
every variant.

Writes JSON to ``bench/results/state_transfer.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GROUPS = 64
WORDS = 5000  # the words of one count task in bench/reconfig.py
SECRET = "bench"


def _cpu() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def _cpu_since(start: tuple[float, float, int]) -> dict:
    user, system, faults = _cpu()
    return {
        "cpu_ms": (user - start[0] + system - start[1]) * 1000,
        "user_ms": (user - start[0]) * 1000,
        "sys_ms": (system - start[1]) * 1000,
        "page_faults": faults - start[2],
    }


def _event_loop_run(main) -> object:  # the workers' loop: uvloop where it is installed
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(main)
    return uvloop.run(main)


async def receive(port_file: str, pooled: bool) -> dict:
    from runtime.dataserver import DataServer
    from runtime.handover import StateInbox
    from runtime.protocol import PayloadPool

    pool = PayloadPool() if pooled else None
    # A spare worker (no tasks behind): each copy is read as it comes (before the pool,
    # by StateInbox.read_copies).
    inbox = StateInbox(pool, idle=(lambda: True) if pooled else None)
    got = asyncio.Event()
    first: list[float] = []
    cpu0 = _cpu()

    def on_state(_job: str, frame: tuple, chunk: bytearray, read) -> None:
        if not first:
            first.append(time.perf_counter())
        inbox.put_frame(frame, chunk, read)
        if len(inbox._unread) + len(inbox._bases) == GROUPS:
            got.set()

    server = DataServer(SECRET, {}, on_state=on_state, pool=pool)
    _host, port = await server.start("127.0.0.1")
    Path(port_file).write_text(str(port))
    reader = asyncio.create_task(inbox.read_copies(lambda: asyncio.sleep(0)))
    await got.wait()
    while inbox._unread:
        await asyncio.sleep(0.001)
    end = time.perf_counter()
    reader.cancel()
    cpu = _cpu_since(cpu0)
    await server.close()
    return {**cpu, "wall_ms": (end - first[0]) * 1000}


async def send(port: int, mb: float) -> dict:
    from runtime import precopy
    from runtime.handover import send_state
    from runtime.peerlink import PeerLink

    pad = int(mb * 2**20 / WORDS)
    groups = [
        {f"word{g}-{i}": (i, os.urandom(pad)) for i in range(WORDS // GROUPS)}
        for g in range(GROUPS)
    ]
    from runtime.handshake import data_key

    job = "bench"  # the state of one job's reconfiguration, over that job's data link
    link = await PeerLink.connect(
        "receiver", "127.0.0.1", port, "sender", job_id=job, key=data_key(SECRET, job)
    )
    cpu0, t0 = _cpu(), time.perf_counter()
    sent = 0
    for g, store in enumerate(groups):
        data, _memo = precopy.export_base(store)
        sent += sum(map(len, data))
        await send_state(link, 1, "count-1", precopy.part_name("base", g), data, raw=True)
        await asyncio.sleep(0)
    cpu, wall = _cpu_since(cpu0), time.perf_counter() - t0
    await link.close()
    return {**cpu, "send_wall_ms": wall * 1000, "bytes": sent}


def one_round(mb: float, env: dict[str, str], pooled: bool) -> dict:
    port_file = Path(f"/tmp/state_transfer.{os.getpid()}.port")
    port_file.unlink(missing_ok=True)
    child_env = {**os.environ, **env}
    me = [sys.executable, __file__]
    receiver = subprocess.Popen(
        [*me, "--role", "receive", "--port-file", str(port_file)]
        + ([] if pooled else ["--no-pool"]),
        env=child_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or receiver.poll() is not None:
                raise RuntimeError("the receiver did not start")
            time.sleep(0.01)
        sender = subprocess.run(
            [*me, "--role", "send", "--port", port_file.read_text(), "--mb", str(mb)],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        out, _ = receiver.communicate(timeout=60)
    finally:
        receiver.kill()
        port_file.unlink(missing_ok=True)
    return {"sender": json.loads(sender.stdout), "receiver": json.loads(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="state of the sending task")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        help="a variant: NAME=VALUE[,NAME=VALUE...] for both processes (repeatable); "
        "the default environment is always one variant",
    )
    parser.add_argument(
        "--no-pool",
        action="store_true",
        help="also run a variant whose receiver takes every payload into a new buffer and "
        "reads the copies in a task of its own (as before runtime.protocol.PayloadPool)",
    )
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "state_transfer.json")
    )
    parser.add_argument("--role", choices=["send", "receive"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "receive":
        print(json.dumps(_event_loop_run(receive(args.port_file, not args.no_pool))))
        return
    if args.role == "send":
        print(json.dumps(_event_loop_run(send(args.port, args.mb))))
        return

    from bench.throughput import write_report

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    variants: dict[str, tuple[dict[str, str], bool]] = {"default": ({}, True)}
    if args.no_pool:
        variants["no pool"] = ({}, False)
    for spec in args.env:
        variants[spec] = (dict(kv.split("=", 1) for kv in spec.split(",")), True)
    rounds: dict[str, list[dict]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, (env, pooled) in variants.items():
            got = one_round(args.mb, env, pooled)
            rounds[name].append(got)
            print(
                f"round {r + 1} {name:<40} sender {got['sender']['cpu_ms']:6.1f} ms CPU "
                f"({got['sender']['sys_ms']:.0f} sys, {got['sender']['page_faults']} faults)  "
                f"receiver {got['receiver']['cpu_ms']:6.1f} ms CPU ({got['receiver']['sys_ms']:.0f} sys, {got['receiver']['page_faults']} faults)  "
                f"wall {got['receiver']['wall_ms']:6.1f} ms",
                flush=True,
            )
    summary = {
        name: {
            **{
                f"{end}_{what}": statistics.median(x[end][what] for x in rs)
                for end in ("sender", "receiver")
                for what in ("cpu_ms", "sys_ms", "page_faults")
            },
            "wall_ms": statistics.median(x["receiver"]["wall_ms"] for x in rs),
            "rounds": rs,
        }
        for name, rs in rounds.items()
    }
    for name, s in summary.items():
        print(
            f"median {name:<40} sender {s['sender_cpu_ms']:6.1f}  "
            f"receiver {s['receiver_cpu_ms']:6.1f}  wall {s['wall_ms']:6.1f} ms"
        )
    write_report(args.out, "state_transfer", started, mb=args.mb, variants=summary)


if __name__ == "__main__":
    main()
