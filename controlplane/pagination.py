"""Pagination of list endpoints: ``?limit=&offset=`` in, :class:`Page` out.

Every list endpoint returns ``{"items": [...], "total": N, "limit": L, "offset": O}``,
newest first; ``total`` counts every item the filters match, so the next page is at
``offset + limit`` while that is below ``total``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar

from fastapi import Depends, Query
from pydantic import BaseModel, Field

from controlplane.params import MAX_ID

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "Page", "PageParams", "Paging"]

DEFAULT_LIMIT = 50
MAX_LIMIT = 500

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int = Field(description="items matching the query, over all pages")
    limit: int
    offset: int


@dataclass(frozen=True)
class Paging:
    limit: int
    offset: int


def _paging(
    limit: Annotated[
        int, Query(ge=1, le=MAX_LIMIT, description="items per page (newest first)")
    ] = DEFAULT_LIMIT,
    offset: Annotated[int, Query(ge=0, le=MAX_ID, description="items to skip")] = 0,
) -> Paging:
    return Paging(limit, offset)


PageParams = Annotated[Paging, Depends(_paging)]
