"""Path and query parameters shared by the resource packages.

Ids and version numbers live in ``INTEGER`` columns: 32-bit signed on PostgreSQL, 64-bit
on SQLite. A larger number in a URL used to reach the database driver and fail there
(``OverflowError`` on SQLite, ``NumericValueOutOfRange`` on PostgreSQL): a 500. Bounding
them here to what every backend stores makes it a 422 that names the parameter and its
range, before any query runs.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

__all__ = ["MAX_ID", "CodeId", "ControllerId", "JobId", "ReconfigurationId", "TokenId"]

MAX_ID = 2**31 - 1  # the largest value of a PostgreSQL INTEGER column

CodeId = Annotated[int, Path(ge=1, le=MAX_ID, description="an uploaded module's id")]
ControllerId = Annotated[int, Path(ge=1, le=MAX_ID, description="a controller id")]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id")]
ReconfigurationId = Annotated[int, Path(ge=1, le=MAX_ID, description="a reconfiguration id")]
TokenId = Annotated[int, Path(ge=1, le=MAX_ID, description="a token id")]
