"""``/api/v1/tokens``: create, list and revoke bearer tokens (scope admin)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from controlplane.deps import SessionDep, require
from controlplane.pagination import Page, PageParams
from controlplane.params import TokenId

from . import service
from .schemas import TokenCreate, TokenCreated, TokenRead

__all__ = ["router"]

router = APIRouter(prefix="/tokens", tags=["tokens"], dependencies=[Depends(require("admin"))])


@router.post("", status_code=201)
def create_token(body: TokenCreate, session: SessionDep) -> TokenCreated:
    """Create a token; its secret is in this response only."""
    token, secret = service.create_token(session=session, name=body.name, scopes=body.scopes)
    return TokenCreated(**TokenRead.of(token).model_dump(), token=secret)


@router.get("")
def list_tokens(session: SessionDep, page: PageParams) -> Page[TokenRead]:
    rows, total = service.list_tokens(session=session, limit=page.limit, offset=page.offset)
    return Page(items=[TokenRead.of(t) for t in rows], total=total, **vars(page))


@router.delete("/{token_id}", status_code=204)
def revoke_token(token_id: TokenId, session: SessionDep) -> Response:
    """Revoke a token: requests bearing it get 401 from now on."""
    service.delete_token(session=session, token_id=token_id)
    return Response(status_code=204)
