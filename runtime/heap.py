"""A worker's memory reserve: heap memory faulted in at start and kept for the state that
comes later.

A process that takes a task's state over (a migration, a scale out) writes it into fresh
memory, and the kernel faults in each 4 KB page of it on first touch: on the 2-core VM of
the benchmarks about 2 us a page (docs/design.md, "Pre-copy"), so taking 100 MB of word-count state in cost 55 ms of
CPU instead of 17 (``precopy.load_base`` alone, the copy's 5,000 payloads of 21 KB). A
worker started with a reserve (``--reserve-mb``) grows its C heap by that much at start,
touching every page, and tells the C library to keep what is freed up to that size (glibc
``mallopt``: ``M_TRIM_THRESHOLD``, and ``M_MMAP_THRESHOLD`` fixed at its dynamic maximum,
so that allocations below 32 MB come from the heap too): the state that arrives later
fills pages already there. Flink's ``taskmanager.memory.preallocate`` and the JVM's
``-XX:+AlwaysPreTouch`` trade the same way: a worker's resident memory starts at its
reserve, and its start takes the faults (about 15 ms per 100 MB here) instead of a change.

Objects of 512 bytes or less come from Python's own allocator (arenas of their own), not
from the reserve: it serves values such as the payloads above, not a multitude of small
counts. Only glibc has these settings: elsewhere :func:`reserve` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["MMAP_THRESHOLD", "reserve"]

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's dynamic mmap threshold rises to at most this (on 64-bit); fixing a trim threshold
# stops the rise, so the threshold is fixed here instead: larger blocks are mapped apart.
MMAP_THRESHOLD = 32 << 20
_BLOCK = 64 << 10  # reserve blocks, well under the mmap threshold: they come from the heap


def reserve(mb: int) -> bool:
    """Fault in ``mb`` MiB of C heap and keep it for later allocations; False (and a
    warning) where the C library is not glibc. Call it once, early. glibc keeps at most
    2 GiB less :data:`MMAP_THRESHOLD` of freed heap (its setting is an int): a larger
    reserve is faulted in but partly given back."""
    if mb <= 0:
        return True
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError):
        logger.warning("no glibc mallopt here: the %d MB memory reserve is not made", mb)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    keep = min((mb << 20) + MMAP_THRESHOLD, 2**31 - 1)  # mallopt takes an int
    if not (mallopt(_M_TRIM_THRESHOLD, keep) and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)):
        logger.warning("glibc refused the settings of a %d MB memory reserve", mb)
        return False
    blocks = [bytearray(_BLOCK) for _ in range((mb << 20) // _BLOCK)]  # zero-filled: touched
    del blocks
    return True
