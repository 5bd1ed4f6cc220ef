"""Uploaded code: Python modules that live in memory, named ``code:<id>:callable``.

An admin uploads a module to the StreamManager (``POST /api/v1/code``); it gets an id and
becomes the module ``streampilot_code.c<id>`` wherever it runs, so jobs
(``"job": "code:7:build"``) and logic swaps (``assignLogic`` to ``code:7:count_v2``) can
name its callables. Functions and classes pickle by module name, so every process that
unpickles a graph or a piece of logic from such a module needs the module too: the
coordinator ships the sources a message's pickles mention (:func:`sources_for`) and the
worker installs them (:func:`install_many`) before unpickling. No file is written and no
shared filesystem is assumed (workers on Spark executors have none).

The control plane never executes an upload: it only registers its source (:func:`register`)
to check refs against it and to ship it. Workers and the throwaway processes that build
graphs (:mod:`runtime.jobbuild`) and check uploads (:mod:`runtime.codecheck`) install it.

Contract:

- :func:`register` records a source under its id without executing it (the control
  plane's database row is the truth: a later registration replaces it).
- :func:`install` executes the source once per (id, source) and registers the module in
  ``sys.modules``; installing the same id with the same source again is a no-op; another
  source for an installed id raises :class:`CodeError` (ids are never reused).
- A source that does not compile or raises while executing raises :class:`CodeError`
  naming the line, and leaves nothing installed.
- :func:`resolve` turns ``code:<id>:attr.path`` into the object it names, or raises
  :class:`CodeError` saying what is missing.
"""

from __future__ import annotations

import re
import sys
import threading
import traceback
import types
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import StreamRuntimeError

__all__ = [
    "PACKAGE",
    "CodeError",
    "callables_of",
    "check",
    "install",
    "install_many",
    "is_code_ref",
    "module_name",
    "parse_ref",
    "register",
    "resolve",
    "source_of",
    "sources_for",
]

PACKAGE = "streampilot_code"
_NAME = re.compile(rf"^{PACKAGE}\.c(\d+)$")
_REF = re.compile(r"^code:(\d+):([A-Za-z_][\w.]*)$")

_sources: dict[str, str] = {}  # module name -> source, registered or installed here
_installed: set[str] = set()  # the modules executed here (theirs is the source in _sources)
_lock = threading.Lock()


class CodeError(StreamRuntimeError, ValueError):
    """Uploaded code that cannot be installed or a ``code:`` ref that cannot be resolved."""


def module_name(code_id: int) -> str:
    """The module an upload with id ``code_id`` becomes."""
    return f"{PACKAGE}.c{int(code_id)}"


def is_code_ref(ref: object) -> bool:
    return isinstance(ref, str) and ref.startswith("code:")


def parse_ref(ref: str) -> tuple[int, str]:
    """``code:<id>:attr.path`` as ``(id, "attr.path")``; :class:`CodeError` otherwise."""
    match = _REF.fullmatch(ref) if isinstance(ref, str) else None
    if match is None:
        raise CodeError(f"reference {ref!r} must look like code:<id>:callable")
    return int(match.group(1)), match.group(2)


def register(code_id: int, source: str) -> None:
    """Know ``source`` as upload ``code_id`` here without executing it: it can be shipped
    (:func:`sources_for`) and read (:func:`source_of`), not resolved."""
    with _lock:
        name = module_name(code_id)
        if name not in _installed:
            _sources[name] = source


def source_of(code_id: int) -> str | None:
    """The source registered or installed here as upload ``code_id``, if any."""
    with _lock:
        return _sources.get(module_name(code_id))


def _package() -> types.ModuleType:
    pkg = sys.modules.get(PACKAGE)
    if pkg is None:
        pkg = types.ModuleType(PACKAGE, "Modules uploaded to the StreamManager (in memory).")
        pkg.__path__ = []  # a package, so ``streampilot_code.c7`` is a submodule
        sys.modules[PACKAGE] = pkg
    return pkg


def install(
    code_id: int, source: str, *, filename: str | None = None, replace: bool = False
) -> types.ModuleType:
    """Execute ``source`` as module ``streampilot_code.c<code_id>`` (once) and return it.

    ``replace`` lets the owner of the ids (the control plane, whose database row is the
    truth) install over a module left by an upload whose transaction rolled back."""
    name = module_name(code_id)
    with _lock:
        known = _sources.get(name) if name in _installed else None
        if known is not None:
            if known == source:
                return sys.modules[name]
            if not replace:
                raise CodeError(f"code {code_id} is already installed with another source")
        label = filename or f"<code {code_id}>"
        try:
            compiled = compile(source, label, "exec")
        except SyntaxError as exc:
            raise CodeError(
                f"{label}, line {exc.lineno}: {exc.msg} (the module does not compile)"
            ) from None
        module = types.ModuleType(name)
        module.__file__ = label
        module.__package__ = PACKAGE
        pkg = _package()
        sys.modules[name] = module
        try:
            exec(compiled, module.__dict__)
        except BaseException as exc:
            del sys.modules[name]
            raise CodeError(
                f"{label}, line {_failing_line(exc, label)}: importing the module raised "
                f"{type(exc).__name__}: {exc}"
            ) from None
        setattr(pkg, name.rpartition(".")[2], module)
        _sources[name] = source
        _installed.add(name)
        return module


def _failing_line(exc: BaseException, label: str) -> int | str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == label]
    return frames[-1].lineno if frames and frames[-1].lineno is not None else "?"


def install_many(sources: Mapping[str, str]) -> None:
    """Install modules shipped by :func:`sources_for` (module name -> source)."""
    for name, source in sources.items():
        match = _NAME.match(name)
        if match is None:
            raise CodeError(f"{name!r} is not an uploaded-code module name")
        install(int(match.group(1)), source)


def sources_for(blobs: Iterable[bytes]) -> dict[str, str]:
    """The sources of the modules registered or installed here that any of ``blobs``
    (pickles) refer to: by module name (a pickled function or class of the upload) or by
    ``code:<id>:`` (a :class:`runtime.dataflow.LogicRef` resolved where it is unpickled)."""
    with _lock:
        known = dict(_sources)
    if not known:
        return {}
    blobs = list(blobs)
    found = {}
    for name, source in known.items():
        ref = f"code:{name[len(PACKAGE) + 2 :]}:".encode()
        if any(name.encode() in blob or ref in blob for blob in blobs):
            found[name] = source
    return found


def resolve(ref: str) -> Any:
    """The object ``code:<id>:attr.path`` names in an installed upload."""
    code_id, attr_path = parse_ref(ref)
    module = sys.modules.get(module_name(code_id))
    if module is None or module_name(code_id) not in _installed:
        raise CodeError(f"reference {ref!r}: no uploaded code with id {code_id}")
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CodeError(f"reference {ref!r}: code {code_id} has no {attr_path!r}") from None
    return obj


def callables_of(module: types.ModuleType) -> list[str]:
    """Top-level functions and classes defined by ``module`` itself (not imported)."""
    return sorted(
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and isinstance(obj, (types.FunctionType, type))
        and getattr(obj, "__module__", None) == module.__name__
    )


def check(source: str, filename: str) -> list[str]:
    """Install ``source`` under a scratch id in this process and return its callables
    (what ``python -m runtime.codecheck`` runs in a throwaway interpreter)."""
    return callables_of(install(0, source, filename=filename))
