"""The options every REST command shares, the one place their failures become exit
codes, and the registration of commands written as functions of a client.

``--server`` and ``--token`` override :class:`~controlplane.cli.client.ClientSettings`
(``STREAMPILOT_SERVER``, ``STREAMPILOT_TOKEN``). Inside :func:`connect`, an answer of 4xx
or 5xx prints the server's message on one line and exits 1; an address that does not
answer, or a bad option, exits 2. :func:`rest_command` turns ``call(api, job_id, ...)``
into a command with those options and ``--json``: the sub-apps declare only their own
arguments and how to render the answer.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from .client import ApiError, CannotConnect, Client, ClientSettings
from .output import console, emit, fail

__all__ = [
    "CONNECTION_OPTIONS",
    "JobArg",
    "JsonOpt",
    "LimitOpt",
    "OffsetOpt",
    "ServerOpt",
    "TokenOpt",
    "command_with",
    "connect",
    "keyword_option",
    "page_footer",
    "rest_command",
    "settings_or_exit",
]

S = TypeVar("S", bound=BaseSettings)
F = TypeVar("F", bound=Callable[..., Any])

ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="StreamManager address (env STREAMPILOT_SERVER, default http://127.0.0.1:8420)",
        show_default=False,
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", help="bearer token (env STREAMPILOT_TOKEN)", show_default=False),
]
JobArg = Annotated[int, typer.Argument(help="job id", min=1)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the server's JSON answer")]
LimitOpt = Annotated[int, typer.Option(min=1, max=500, help="items per page, newest first")]
OffsetOpt = Annotated[int, typer.Option(min=0, help="items to skip")]


def settings_or_exit(cls: type[S], **overrides: Any) -> S:
    """``cls`` from the environment with the options that were given on top; a value that
    does not validate prints the field and the problem on one line and exits 2."""
    try:
        return cls(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        fail(problems, 2)


@contextmanager
def connect(server: str | None, token: str | None) -> Iterator[Client]:
    """A client for the server and token of the options (or the environment)."""
    settings = settings_or_exit(ClientSettings, server=server, token=token)
    try:
        with Client.of(settings) as client:
            yield client
    except CannotConnect as exc:
        fail(f"{exc} (set --server or STREAMPILOT_SERVER)", 2)
    except ApiError as exc:
        fail(str(exc), 1)


def page_footer(page: dict[str, Any], what: str) -> None:
    """``3 of 12 jobs; next: --offset 50`` under a listing."""
    shown, total, offset = len(page["items"]), page["total"], page["offset"]
    more = offset + shown < total
    tail = f"; next: --offset {offset + shown}" if more else ""
    console.print(f"{shown} of {total} {what}{tail}", highlight=False)


def keyword_option(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    """An option for :func:`command_with`: ``annotation`` is ``Annotated[type, typer.Option]``."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


CONNECTION_OPTIONS = (
    keyword_option("server", ServerOpt, None),
    keyword_option("token", TokenOpt, None),
    keyword_option("as_json", JsonOpt, False),
)


def command_with(
    call: Callable[..., Any], options: Sequence[inspect.Parameter], run: Callable[..., None]
) -> Callable[..., None]:
    """A Typer command function whose parameters are ``call``'s (but its first, ``api``)
    followed by ``options``; invoked, it runs ``run(**arguments_and_options)``. Typer reads
    the parameters from ``__signature__``; help and name come from ``call``."""
    signature = inspect.signature(call, eval_str=True)
    params = [*list(signature.parameters.values())[1:], *options]

    @functools.wraps(call)
    def command(**arguments: Any) -> None:
        run(**arguments)

    # Typer reads __signature__ and __annotations__; it must not follow __wrapped__ to call.
    command.__signature__ = signature.replace(parameters=params, return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    del command.__wrapped__  # type: ignore[attr-defined]
    return command


def rest_command(
    app: typer.Typer,
    name: str,
    render: Callable[[Any], None],
    check: Callable[[Any], None] = lambda _answer: None,
) -> Callable[[F], F]:
    """Register ``call(api, ...)`` as the command ``name`` of ``app``: ``call``'s other
    parameters are the command's arguments and options, plus ``--server``, ``--token``
    and ``--json``. The command connects (see :func:`connect`), returns what ``call``
    returns printed with ``render`` (or as JSON), then runs ``check`` on it (to exit 1
    when it tells of a failure)."""

    def register(call: F) -> F:
        def run(*, server: str | None, token: str | None, as_json: bool, **arguments: Any) -> None:
            with connect(server, token) as api:
                answer = call(api, **arguments)
            emit(answer, as_json, render)
            check(answer)

        app.command(name)(command_with(call, CONNECTION_OPTIONS, run))
        return call

    return register
