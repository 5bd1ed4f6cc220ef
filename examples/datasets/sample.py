"""Write a small, deterministic sample of raw inputs: stock orders (CSV) and text (JSON lines).

``python -m examples.datasets.sample OUTDIR [--orders N] [--lines N] [--seed S]`` writes

- ``orders.csv``: ``time,order_id,symbol,side,price,qty`` in event-time order (a few
  orders per second over a handful of symbols, Zipf-skewed);
- ``text.jsonl``: ``{"time": ..., "text": "..."}`` sentences over a small vocabulary.

Times are seconds since the epoch from 2026-01-01; the same seed writes the same files.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random

__all__ = ["write_orders", "write_text"]

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SYMBOLS = ["ACME", "BOLT", "CRUX", "DYNE", "EPIC", "FLUX", "GRIT", "HALO"]
WORDS = [
    "stream",
    "key",
    "group",
    "task",
    "worker",
    "barrier",
    "state",
    "plan",
    "scale",
    "move",
    "swap",
    "logic",
    "spark",
]


def _times(rng: random.Random, n: int, per_s: float) -> list[float]:
    t, out = EPOCH, []
    for _ in range(n):
        t += rng.expovariate(per_s)
        out.append(round(t, 6))
    return out


def write_orders(path: str, n: int = 2_000, seed: int = 7) -> None:
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(SYMBOLS))]
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f)
        out.writerow(["time", "order_id", "symbol", "side", "price", "qty"])
        for i, t in enumerate(_times(rng, n, 50.0)):
            symbol = rng.choices(SYMBOLS, weights)[0]
            price = round(100 + rng.gauss(0, 2), 2)
            out.writerow([t, i, symbol, rng.choice(["buy", "sell"]), price, rng.randint(1, 100)])


def write_text(path: str, n: int = 1_000, seed: int = 7) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for t in _times(rng, n, 20.0):
            words = rng.choices(WORDS, k=rng.randint(3, 9))
            f.write(json.dumps({"time": t, "text": " ".join(words)}) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--orders", type=int, default=2_000)
    parser.add_argument("--lines", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    os.makedirs(args.outdir, exist_ok=True)
    write_orders(os.path.join(args.outdir, "orders.csv"), args.orders, args.seed)
    write_text(os.path.join(args.outdir, "text.jsonl"), args.lines, args.seed)


if __name__ == "__main__":
    main()
