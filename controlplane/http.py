"""The one place where exceptions become HTTP responses.

Every error response is ``{"error": {"code": str, "message": str}}`` (request validation
errors add ``"details"``: one ``{"field", "message"}`` per problem). Service errors map by
their class in :data:`STATUS`; FastAPI's request validation errors become 422
``invalid_request`` naming each field; Starlette's own errors (unknown route, wrong
method) keep their status. Anything else is a bug: 500 ``internal_error``, logged.

No error echoes more than :data:`MAX_MESSAGE_CHARS` of a message (a message quoting a
client's 20 MB value is cut, saying so), and a request body over the server's
``max_request_bytes`` is refused with 413 ``payload_too_large`` before it is read whole
(:class:`BodyLimit`).

Responses of at least :data:`GZIP_MIN_BYTES` are gzip-compressed for a client that accepts
it: the console reads five minutes of series every few seconds (a keyed operator's heat map
alone is over 100 KB of JSON, mostly digits), and Prometheus scrapes ask for gzip too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    Unauthenticated,
    Unavailable,
)

__all__ = ["MAX_MESSAGE_CHARS", "STATUS", "BodyLimit", "error_body", "install", "status_of"]

logger = logging.getLogger(__name__)

STATUS: dict[type[ServiceError], int] = {
    NotFound: 404,
    InvalidRequest: 422,
    Conflict: 409,
    Unavailable: 503,
    Unauthenticated: 401,
    Forbidden: 403,
    PayloadTooLarge: 413,
}

_STARLETTE_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}

MAX_MESSAGE_CHARS = 2000  # an error names what to fix; it never echoes a client's bulk back
GZIP_MIN_BYTES = 1024  # a smaller body gains less than the header and the CPU cost
GZIP_LEVEL = 5  # most of level 9's gain on JSON of numbers at a fraction of its CPU
MAX_PROBLEMS = 20  # a body with 100,000 bad fields gets the first ones named, not all


def status_of(exc: ServiceError) -> int:
    """The HTTP status of ``exc``: that of its nearest class in :data:`STATUS`."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def _cut(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[: MAX_MESSAGE_CHARS - 80]}... (cut: {len(text)} characters in all)"


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The body of an error response; ``message`` cut to :data:`MAX_MESSAGE_CHARS`."""
    return {"error": {"code": code, "message": _cut(message), **extra}}


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    return ".".join(parts) if parts else "request"


async def _service_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else None
    return JSONResponse(error_body(exc.code, exc.message), status_of(exc), headers=headers)


def _problem(error: Mapping[str, Any]) -> dict[str, str]:
    loc = tuple(error.get("loc", ()))
    kind = error.get("type")
    message = str(error.get("msg"))
    if loc == ("body",) and kind in ("model_attributes_type", "dict_type"):
        message = "expected a JSON object (and the header Content-Type: application/json)"
    elif kind == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "")
        message = f"invalid JSON{': ' + str(reason) if reason else ''}"
        loc = ("body",)
    return {"field": _cut(_field(loc)), "message": _cut(message)}


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = [_problem(e) for e in exc.errors()[:MAX_PROBLEMS]]
    message = "; ".join(f"{d['field']}: {d['message']}" for d in details) or "invalid request"
    return JSONResponse(error_body("invalid_request", message, details=details), 422)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STARLETTE_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = "no such endpoint; the API is under /api/v1 (see /docs)"
    return JSONResponse(
        error_body(code, message), exc.status_code, headers=getattr(exc, "headers", None)
    )


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        error_body("internal_error", f"internal error ({type(exc).__name__}); see the server log"),
        500,
    )


class BodyLimit:
    """ASGI middleware refusing request bodies over ``max_bytes`` with 413: at once when
    ``Content-Length`` says so, else (a chunked body) as soon as the bytes read pass it,
    so that a large body is never buffered whole."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return (
            f"the request body is over the server's limit of {self.max_bytes} bytes "
            "(STREAMPILOT_MAX_REQUEST_BYTES)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            response = JSONResponse(error_body("payload_too_large", self._message()), 413)
            await response(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # FastAPI lets an HTTPException from reading the body through as it is.
                    raise StarletteHTTPException(413, self._message())
            return message

        await self.app(scope, limited, send)


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``, and the body limit of its settings."""
    app.add_middleware(BodyLimit, max_bytes=app.state.settings.max_request_bytes)
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=GZIP_LEVEL)
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
