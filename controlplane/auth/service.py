"""Bearer tokens: creation, bootstrap from the settings, authentication, scopes.

Scopes are ordered: ``read`` (GET anything), ``operate`` (also submit, reconfigure and
stop jobs), ``admin`` (also tokens, and later code and workers); a scope grants every
scope below it. A token's secret is ``sp_`` + 43 URL-safe characters, stored only as its
SHA-256, and shown once when created. Functions take the session as a keyword and never
commit.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.errors import Forbidden, InvalidRequest, NotFound

from .models import Token

__all__ = [
    "SCOPES",
    "Scope",
    "authenticate",
    "authorize",
    "create_token",
    "delete_token",
    "ensure_token",
    "grants",
    "hash_secret",
    "list_tokens",
]

Scope = Literal["read", "operate", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "operate", "admin")
SECRET_PREFIX = "sp_"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def grants(scopes: Iterable[str], needed: str) -> bool:
    """True if any of ``scopes`` is ``needed`` or above it."""
    rank = {s: i for i, s in enumerate(SCOPES)}
    return any(rank.get(s, -1) >= rank[needed] for s in scopes)


def _check_scopes(scopes: Sequence[str]) -> list[str]:
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise InvalidRequest(
            f"scopes must be a non-empty list of {', '.join(SCOPES)}; got {list(scopes)!r}",
            code="bad_scope",
        )
    return sorted(set(scopes), key=SCOPES.index)


def create_token(*, session: Session, name: str, scopes: Sequence[str]) -> tuple[Token, str]:
    """A new token; returns the row and the secret (the only time it is available)."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    token = Token(name=name, token_hash=hash_secret(secret), scopes=_check_scopes(scopes))
    session.add(token)
    session.flush()
    return token, secret


def ensure_token(*, session: Session, name: str, secret: str, scopes: Sequence[str]) -> Token:
    """Register ``secret`` (e.g. ``STREAMPILOT_ADMIN_TOKEN``) unless it already is; a known
    secret gets ``scopes`` (so changing the configured scope takes effect)."""
    if len(secret) < 16:
        raise InvalidRequest("a configured token must be at least 16 characters long")
    digest = hash_secret(secret)
    token = session.scalar(select(Token).where(Token.token_hash == digest))
    if token is None:
        token = Token(name=name, token_hash=digest, scopes=_check_scopes(scopes))
        session.add(token)
    else:
        token.scopes = _check_scopes(scopes)
    session.flush()
    return token


def authenticate(*, session: Session, secret: str) -> Token | None:
    """The token whose secret is ``secret``, or None."""
    return session.scalar(select(Token).where(Token.token_hash == hash_secret(secret)))


def authorize(token: Token, needed: Scope) -> None:
    """Raise :class:`Forbidden` unless ``token`` grants ``needed``."""
    if not grants(token.scopes, needed):
        raise Forbidden(
            f"this needs scope {needed!r} but token {token.name!r} has "
            f"{', '.join(token.scopes) or 'no scope'}; create one with "
            f"`streampilot token create --scope {needed}`"
        )


def list_tokens(*, session: Session, limit: int, offset: int) -> tuple[list[Token], int]:
    total = session.scalar(select(func.count()).select_from(Token)) or 0
    rows = session.scalars(select(Token).order_by(Token.id.desc()).limit(limit).offset(offset))
    return list(rows), total


def delete_token(*, session: Session, token_id: int) -> None:
    token = session.get(Token, token_id)
    if token is None:
        raise NotFound(f"token {token_id} does not exist")
    session.delete(token)
    session.flush()
