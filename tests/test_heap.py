"""Memory faulted in ahead for state about to arrive (runtime.heap), measured in fresh
processes: page faults and resident memory, as the kernel counts them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runtime import heap

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 60.0

# Unpickles 64 MB of word-count-like state (21 KB values in 48 key groups), with or
# without reserving that much first, and reports the page faults of the unpickling; then
# reserves as much again, unused, and reports the resident memory before and after
# releasing it.
PROBE = textwrap.dedent(
    """
    import json, pickle, resource, sys
    import psutil
    from runtime.heap import Heap

    blobs = [
        pickle.dumps({f"w{i}": (i, bytes(21_000)) for i in range(64)}, protocol=5)
        for _ in range(48)
    ]
    total = sum(map(len, blobs))
    heap = Heap()
    reservation = heap.reserve(total) if sys.argv[1] == "reserve" else None
    if reservation is not None:
        assert reservation.done.wait(30), "the reservation was not faulted in within 30 s"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    state = [pickle.loads(b) for b in blobs]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    held = heap.held()
    if reservation is not None:
        reservation.release()
        reservation.release()  # again: harmless
    # A reservation the state does not take goes back to the system on release.
    unused = heap.reserve(total)
    assert unused.done.wait(30)
    rss_unused = psutil.Process().memory_info().rss
    unused.release()
    out = {
        "bytes": total,
        "reserved": reservation.nbytes if reservation else 0,
        "held": held,
        "held_after": heap.held(),
        "faults": faults,
        "rss_unused": rss_unused,
        "rss_released": psutil.Process().memory_info().rss,
        "keys": sum(len(s) for s in state),
    }
    print(json.dumps(out))
    """
)


def _probe(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(not heap.available(), reason="needs glibc's malloc on Linux")
def test_state_lands_in_memory_faulted_in_ahead_and_the_rest_goes_back() -> None:
    plain, reserved = _probe("plain"), _probe("reserve")
    assert plain["keys"] == reserved["keys"] == 48 * 64
    assert plain["reserved"] == 0
    # At least what was asked, in whole pieces.
    assert reserved["reserved"] >= reserved["bytes"]
    assert reserved["reserved"] % heap.PIECE_BYTES == 0
    assert reserved["held"] == reserved["reserved"] and reserved["held_after"] == 0
    # Fresh memory faults in each 4 KB page it writes: 64 MB is ~16,000 faults.
    assert plain["faults"] > reserved["bytes"] // 4096 * 0.8, plain
    assert reserved["faults"] < plain["faults"] / 5, (plain, reserved)
    # Memory reserved and not taken is given back once released (all but what malloc
    # keeps anyway, KEEP_BYTES at most).
    for run in (plain, reserved):
        given_back = run["rss_unused"] - run["rss_released"]
        assert given_back > run["bytes"] - heap.KEEP_BYTES / 2, run


def test_nothing_is_reserved_without_glibc_or_for_less_than_a_piece() -> None:
    assert heap.Heap(libc=None).reserve(1 << 30) is None
    h = heap.Heap()
    assert h.reserve(heap.PIECE_BYTES - 1) is None
    assert h.reserve(0) is None
    assert h.held() == 0
