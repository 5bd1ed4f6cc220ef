"""API shapes of tokens."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from .models import Token
from .service import Scope

__all__ = ["TokenCreate", "TokenCreated", "TokenRead"]


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, examples=["autoscaler"])
    scopes: list[Scope] = Field(min_length=1, examples=[["operate"]])


class TokenRead(BaseModel):
    id: int
    name: str
    scopes: list[str]
    created_at: datetime

    @classmethod
    def of(cls, token: Token) -> TokenRead:
        return cls(id=token.id, name=token.name, scopes=token.scopes, created_at=token.created_at)


class TokenCreated(TokenRead):
    token: str = Field(description="the bearer secret; shown only in this response")
