"""Pagination of list endpoints: ``?limit=&offset=`` in, :class:`Page` out.

Every list endpoint returns ``{"items": [...], "total": N, "limit": L, "offset": O}``,
newest first; ``total`` counts every item the filters match, so the next page is at
``offset + limit`` while that is below ``total``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Depends, Query
from pydantic import BaseModel, Field
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from controlplane.params import MAX_ID

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "Page", "PageParams", "Paging", "fetch_page"]

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


def fetch_page(
    session: Session, query: Select, order_by: Any, limit: int, offset: int
) -> tuple[list[Any], int]:
    """The rows of ``query`` on one page, in ``order_by``, and how many rows it matches."""
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = list(session.scalars(query.order_by(order_by).limit(limit).offset(offset)))
    return rows, total
