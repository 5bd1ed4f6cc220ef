"""What copying a task's state ahead costs the sending worker's own thread: on it, as
``runtime.precopy`` does today, against a forked child sending a copy-on-write snapshot.

At 100 MB per task the moves of a whole task are bound by the sending worker: its one
event loop runs its tasks and the copying ahead, so the copy's CPU is taken from the
records (docs/design.md, "Pre-copy", says why). A child forked when the copying starts holds
the same state, page for page, and could pickle and send it on another core; the parent
then pays for the fork and for the pages its records write while the child lives (the
kernel copies each such page once). This measures both, in one process holding
``--mb`` of word-count state (``(count, padding)`` per word, 64 key groups, as
``bench/state_transfer.py``), which applies ``--updates`` records to it (a new
``(count + 1, padding)`` per record, random words) while the groups are copied
(``precopy.export_base``) and written to a socket that another process drains:

- ``none``: the records only, no copying (what the others are compared with);
- ``on the loop``: a group copied and written between each 1/64th of the records;
- ``forked``: a child forked first copies and writes every group; the parent applies the
  records meanwhile and then waits for the child.

Each variant reports the parent's CPU time and page faults, the fork's time and the wall
time until the last byte was written; rounds alternate the variants. Writes JSON to
``bench/results/fork_copy.json``. Nothing in the runtime forks yet: this says whether it
would pay.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import machine
from runtime import precopy

GROUPS = 64
WORDS = 5000  # the words of one count task in bench/reconfig.py
VARIANTS = ("none", "on the loop", "forked")
OUT = Path(__file__).parent / "results" / "fork_copy.json"


def _usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


class Sink:
    """A process that reads whatever is written to it (the receiving worker's part is
    not measured here)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.pid = os.fork()
        if self.pid == 0:  # the sink: read every connection to its end
            try:
                while True:
                    conn, _ = self.server.accept()
                    threading.Thread(target=self._drain, args=(conn,), daemon=True).start()
            finally:
                os._exit(0)
        self.server.close()

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        with conn:
            while conn.recv(1 << 20):
                pass

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port))

    def close(self) -> None:
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)


def _send_group(sock: socket.socket, store: dict) -> None:
    pieces, _memo = precopy.export_base(store)
    sock.sendall(sum(map(len, pieces)).to_bytes(8, "big"))
    for piece in pieces:
        sock.sendall(piece)


def one_round(variant: str, groups: list[dict], updates: int, sink: Sink, seed: int) -> dict:
    keys = [(g, k) for g, store in enumerate(groups) for k in store]
    rng = random.Random(seed)

    def apply(n: int) -> None:  # the count task's writes: a new tuple, the same padding
        for _ in range(n):
            g, k = keys[rng.randrange(len(keys))]
            count, pad = groups[g][k]
            groups[g][k] = (count + 1, pad)

    sock = sink.connect()
    cpu0, faults0 = _usage()
    t0 = time.perf_counter()
    fork_ms = 0.0
    if variant == "none":
        apply(updates)
    elif variant == "on the loop":
        share = updates // GROUPS
        for store in groups:
            _send_group(sock, store)
            apply(share)
        apply(updates - share * GROUPS)
    else:
        pid = os.fork()
        if pid == 0:  # the child: send the snapshot, then go without cleaning up
            try:
                for store in groups:
                    _send_group(sock, store)
            finally:
                os._exit(0)
        fork_ms = (time.perf_counter() - t0) * 1000
        apply(updates)
        os.waitpid(pid, 0)
    wall_ms = (time.perf_counter() - t0) * 1000
    cpu, faults = _usage()
    sock.close()
    return {
        "variant": variant,
        "parent_cpu_ms": round((cpu - cpu0) * 1000, 1),
        "parent_page_faults": faults - faults0,
        "fork_ms": round(fork_ms, 2),
        "wall_ms": round(wall_ms, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="state of the sending task")
    parser.add_argument("--updates", type=int, default=150_000, help="records applied meanwhile")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    pad = int(args.mb * 2**20 / WORDS)
    groups = [
        {f"word{g}-{i}": (i, os.urandom(pad)) for i in range(WORDS // GROUPS)}
        for g in range(GROUPS)
    ]
    sink = Sink()
    rounds: list[dict] = []
    try:
        for r in range(args.rounds):
            for variant in VARIANTS:
                row = one_round(variant, groups, args.updates, sink, seed=r)
                rounds.append({"round": r + 1, **row})
                print(
                    f"round {r + 1} {variant:12s} parent {row['parent_cpu_ms']:7.1f} ms CPU "
                    f"({row['parent_page_faults']} faults)  fork {row['fork_ms']:5.2f} ms  "
                    f"wall {row['wall_ms']:7.1f} ms",
                    flush=True,
                )
    finally:
        sink.close()
    medians = {}
    for variant in VARIANTS:
        rows = [x for x in rounds if x["variant"] == variant]
        medians[variant] = {
            k: statistics.median(x[k] for x in rows)
            for k in ("parent_cpu_ms", "parent_page_faults", "fork_ms", "wall_ms")
        }
    base = medians["none"]["parent_cpu_ms"]
    for variant in VARIANTS:
        medians[variant]["copy_cpu_ms_on_parent"] = round(
            medians[variant]["parent_cpu_ms"] - base, 1
        )
        print(f"median {variant:12s} {medians[variant]}")
    result = {
        "benchmark": "fork_copy",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "command": "python bench/fork_copy.py " + " ".join(sys.argv[1:]),
        "state_mb": args.mb,
        "updates": args.updates,
        "rounds": rounds,
        "medians": medians,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
