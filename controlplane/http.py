"""The one place where exceptions become HTTP responses.

Every error response is ``{"error": {"code": str, "message": str}}`` (request validation
errors add ``"details"``: one ``{"field", "message"}`` per problem). Service errors map by
their class in :data:`STATUS`; FastAPI's request validation errors become 422
``invalid_request`` naming each field; Starlette's own errors (unknown route, wrong
method) keep their status. Anything else is a bug: 500 ``internal_error``, logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from controlplane.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    ServiceError,
    Unauthenticated,
    Unavailable,
)

__all__ = ["STATUS", "error_body", "install", "status_of"]

logger = logging.getLogger(__name__)

STATUS: dict[type[ServiceError], int] = {
    NotFound: 404,
    InvalidRequest: 422,
    Conflict: 409,
    Unavailable: 503,
    Unauthenticated: 401,
    Forbidden: 403,
}

_STARLETTE_CODES = {404: "not_found", 405: "method_not_allowed"}


def status_of(exc: ServiceError) -> int:
    """The HTTP status of ``exc``: that of its nearest class in :data:`STATUS`."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


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
    return {"field": _field(loc), "message": message}


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = [_problem(e) for e in exc.errors()]
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


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
