"""A small client of the StreamManager's REST API (``/api/v1``), for the CLI and the demo.

It knows HTTP and the API's conventions (bearer token, the JSON error body
``{"error": {"code", "message"}}``, reconfigurations polled until they end) and nothing of
Typer: the CLI turns its exceptions into exit codes in :mod:`controlplane.cli.remote`.

:class:`ClientSettings` is the CLI's one settings object: it alone reads the environment
(``STREAMPILOT_SERVER``, ``STREAMPILOT_TOKEN``), and command-line options are layered over
it. The server's own settings are :class:`controlplane.config.Settings`.

Exception tree::

    ClientError (Exception)     the request did not get the answer it wanted
    ├── ApiError                the server answered 4xx or 5xx; .status, .code, .message
    └── CannotConnect           no answer from the address (refused, timed out, bad name)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "API_PREFIX",
    "DEFAULT_SERVER",
    "TERMINAL_RECONFIGURATION",
    "ApiError",
    "CannotConnect",
    "Client",
    "ClientError",
    "ClientSettings",
]

API_PREFIX = "/api/v1"
DEFAULT_SERVER = "http://127.0.0.1:8420"
HTTP_TIMEOUT_S = 60.0  # one request: a job submission deploys its tasks within 30 s
POLL_INTERVAL_S = 0.2  # reconfiguration phases take from milliseconds to seconds
TERMINAL_RECONFIGURATION = frozenset({"completed", "failed", "aborted", "cancelled"})


class ClientSettings(BaseSettings):
    """Where the REST commands connect. Environment: ``STREAMPILOT_SERVER`` (default
    ``http://127.0.0.1:8420``) and ``STREAMPILOT_TOKEN``; constructor arguments win."""

    model_config = SettingsConfigDict(env_prefix="STREAMPILOT_", frozen=True, extra="ignore")

    server: str = Field(DEFAULT_SERVER, description="base URL of the StreamManager")
    token: SecretStr | None = Field(None, description="bearer token (streampilot token create)")

    @field_validator("server")
    @classmethod
    def _http_url(cls, value: str) -> str:
        url = value.strip().rstrip("/")
        if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
            raise ValueError(f"{value!r} is not an http:// or https:// address")
        return url


class ClientError(Exception):
    """Base of the client's errors; ``str(exc)`` is one line for a person."""


class ApiError(ClientError):
    """The server refused the request (4xx) or failed (5xx)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} (HTTP {status} {code})")
        self.status, self.code, self.message = status, code, message


class CannotConnect(ClientError):
    """Nothing answered at the server's address."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"cannot connect to {server}: {reason}")
        self.server = server


def _api_error(response: httpx.Response) -> ApiError:
    try:
        error = response.json()["error"]
        return ApiError(response.status_code, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        first_line = (response.text.strip().splitlines() or [response.reason_phrase])[0]
        return ApiError(response.status_code, "http_error", first_line[:200])


class Client:
    """Calls ``/api/v1`` on one server with one token. Methods take paths relative to the
    API prefix (``"/jobs"``) and return the decoded JSON body (None for an empty one);
    they raise :class:`ApiError` for a 4xx/5xx answer and :class:`CannotConnect` when
    nothing answers. Use as a context manager, or call :meth:`close`."""

    def __init__(self, server: str, token: str | None, timeout: float = HTTP_TIMEOUT_S) -> None:
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.server + API_PREFIX, headers=headers, timeout=timeout
        )

    @classmethod
    def of(cls, settings: ClientSettings) -> Client:
        token = settings.token.get_secret_value() if settings.token else None
        return cls(settings.server, token)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise CannotConnect(self.server, f"no answer within {HTTP_TIMEOUT_S:g}s") from exc
        except httpx.TransportError as exc:
            raise CannotConnect(self.server, str(exc) or type(exc).__name__) from exc
        if response.is_error:
            raise _api_error(response)
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def upload(self, path: str, file: Path, **fields: str | None) -> Any:
        """POST ``file`` as the multipart field ``file``, with the given form fields."""
        data = {k: v for k, v in fields.items() if v is not None}
        with file.open("rb") as f:
            return self.request("POST", path, files={"file": (file.name, f)}, data=data)

    def wait_reconfiguration(
        self,
        job_id: int,
        rid: int,
        timeout: float,
        on_status: Callable[[dict[str, Any]], None] = lambda _rec: None,
    ) -> dict[str, Any]:
        """Poll the reconfiguration until it has ended or ``timeout`` seconds have passed;
        returns its last record (whose status is not terminal after a timeout). Calls
        ``on_status`` with the record each time its status changes."""
        deadline = time.monotonic() + timeout
        seen = None
        while True:
            rec = self.get(f"/jobs/{job_id}/reconfigurations/{rid}")
            if rec["status"] != seen:
                seen = rec["status"]
                on_status(rec)
            if rec["status"] in TERMINAL_RECONFIGURATION or time.monotonic() >= deadline:
                return rec
            time.sleep(POLL_INTERVAL_S)
