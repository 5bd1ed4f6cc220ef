"""Durable files on a local filesystem."""

from __future__ import annotations

import os

__all__ = ["fsync_dir"]


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make the entries of ``directory`` (files created or renamed there) durable.
    Raises :class:`OSError` if it cannot be opened or synced."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
