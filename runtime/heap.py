"""Memory faulted in ahead for key-group state about to arrive (glibc's malloc on Linux).

Unpickling a key group's state puts its values in memory the process has not touched
yet, and Linux faults each fresh 4 KB page in on its first write: about 25,600 faults
per 100 MB, which took 55-70 ms of system time on the 2-core VMs here, against 14 ms to
unpickle the same into memory touched before (``bench/state_transfer.py`` and the notes
in BENCHMARKS.md). A worker told in a prepare how much state is coming to it
(:meth:`Heap.reserve`) grows its heap by that much at once and faults it in from a
thread, then hands it to malloc as free memory that malloc keeps instead of giving it
back to the system; the state then lands in memory already there, like a JVM started
with ``-XX:+AlwaysPreTouch``, but per change and sized by it. When the change is over
(:meth:`Reservation.release`), whatever free memory is left is given back.

How:

1. The event loop's thread ``malloc``s the reservation in pieces of :data:`PIECE_BYTES`,
   from the heap the state will be unpickled into (glibc gives each thread an arena of
   its own; a piece malloc'd by the helper thread would sit in the wrong one).
2. A helper thread faults each piece in (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14,
   or writing zeros), then frees it: ctypes calls let go of the interpreter lock, so the
   tasks run on meanwhile and the first pieces are free for the first state to come.
3. malloc keeps free memory at the top of its heap up to a trim threshold, set above
   what is reserved while reservations are held; on release it goes back to
   :data:`KEEP_BYTES` and ``malloc_trim`` gives back the free memory beyond.

Elsewhere than glibc on Linux nothing is reserved (:func:`available` is False). Reserving
never fails a change: what cannot be reserved is logged and unpickling faults as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import mmap
import sys
import threading
from typing import Any

import psutil

__all__ = ["Heap", "Reservation", "available"]

logger = logging.getLogger(__name__)

PIECE_BYTES = 8 << 20  # a piece freed sooner lets the first state in sooner
# Blocks at least this large are mapped by malloc on their own and unmapped when freed;
# glibc's own threshold climbs to this (its maximum) once a process frees blocks that
# large, as workers do; fixed here so that the pieces come from the heap.
MMAP_THRESHOLD = 32 << 20
# Free memory at the heap's top that malloc keeps outside reservations (the most glibc's
# own threshold keeps, twice the mmap threshold).
KEEP_BYTES = 2 * MMAP_THRESHOLD
AVAILABLE_SHARE = 0.5  # reserve at most this share of the machine's available memory

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MADV_POPULATE_WRITE = 23
_PAGE = mmap.PAGESIZE


def _glibc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for name in ("mallopt", "malloc_trim", "malloc", "free", "madvise"):
            getattr(libc, name)
    except (OSError, AttributeError):
        return None
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free.restype = None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


_LIBC = _glibc()


def available() -> bool:
    """True where reserving works (glibc's malloc on Linux)."""
    return _LIBC is not None


class Reservation:
    """Memory reserved by :meth:`Heap.reserve`; :meth:`release` it once the change is
    over (again is harmless). ``done`` is set once every piece is faulted in and free."""

    def __init__(self, heap: Heap, nbytes: int) -> None:
        self.heap = heap
        self.nbytes = nbytes
        self.done = threading.Event()
        self.released = False
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.heap._held.remove(self)
        if self.done.is_set():
            self.heap._trim()
        # else the helper thread trims once it has freed its pieces (see _fault_in)

    def _faulted_in(self) -> None:
        """In the helper thread, once every piece is free."""
        self.done.set()
        if not self.released:
            return
        if self._loop is None:
            self.heap._trim()
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: the process is ending
            self._loop.call_soon_threadsafe(self.heap._trim)


class Heap:
    """The worker process's malloc heap, as far as reservations go: one per process,
    used from one thread (the event loop's)."""

    def __init__(self, libc: Any | None = _LIBC) -> None:
        self._libc = libc
        self._held: list[Reservation] = []
        self._tuned = False

    def reserve(self, nbytes: int) -> Reservation | None:
        """Start reserving ``nbytes`` (at most :data:`AVAILABLE_SHARE` of the machine's
        available memory) for state about to arrive; None when nothing is reserved (less
        than a piece asked, or no glibc). Returns at once: a helper thread faults the
        pieces in, each free for malloc as soon as it is."""
        if self._libc is None or nbytes < PIECE_BYTES:
            return None
        nbytes = min(nbytes, int(psutil.virtual_memory().available * AVAILABLE_SHARE))
        libc = self._libc
        held = sum(r.nbytes for r in self._held) + nbytes
        # Step 3 first: the freed pieces must stay with malloc.
        if not self._tuned:
            libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            self._tuned = True
        libc.mallopt(_M_TRIM_THRESHOLD, min(KEEP_BYTES + held, 2**31 - 1))
        # Step 1.
        pieces = []
        for _ in range(-(-nbytes // PIECE_BYTES)):
            p = libc.malloc(PIECE_BYTES)
            if not p:
                break
            pieces.append(p)
        if not pieces:
            return None
        reservation = Reservation(self, len(pieces) * PIECE_BYTES)
        self._held.append(reservation)
        # Step 2.
        threading.Thread(
            target=_fault_in, args=(libc, pieces, reservation), name="heap-reserve", daemon=True
        ).start()
        return reservation

    def held(self) -> int:
        """Bytes reserved and not released."""
        return sum(r.nbytes for r in self._held)

    def _trim(self) -> None:
        """Give back the free memory beyond :data:`KEEP_BYTES`, once nothing is held."""
        if self._held or self._libc is None:
            return
        self._libc.mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES)
        self._libc.malloc_trim(KEEP_BYTES)


def _fault_in(libc: Any, pieces: list[int], reservation: Reservation) -> None:
    """Step 2, in the helper thread: fault each piece in, then free it."""
    try:
        for p in pieces:
            try:
                start = -(-p // _PAGE) * _PAGE
                end = (p + PIECE_BYTES) // _PAGE * _PAGE
                if libc.madvise(start, end - start, _MADV_POPULATE_WRITE) != 0:
                    ctypes.memset(p, 0, PIECE_BYTES)  # before Linux 5.14: write it instead
            finally:
                libc.free(p)
    finally:
        reservation._faulted_in()
