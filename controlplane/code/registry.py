"""Registered code: what a job, a logic ref (``assignLogic``) and so a key selector may name.

A job's code runs on the workers, and its build runs in a throwaway process
(:mod:`runtime.jobbuild`), never in the control plane; but which code runs is never a
caller's free choice. Registered code is:

1. **uploads**, ``code:<id>:<callable>``: modules an admin uploaded (``POST /api/v1/code``);
2. **job entry points** the installation declares in the :data:`ENTRY_POINTS` group
   (``[project.entry-points."streampilot.jobs"]``: name -> ``module:callable``; the
   bundled examples declare theirs), and the modules they live in;
3. **job modules** of ``settings.job_modules`` (``STREAMPILOT_JOB_MODULES``).

Rules (:meth:`Registry.job`, :meth:`Registry.logic`):

- A job ref is an entry point's name, ``module:callable`` with ``module`` registered
  (2 or 3, the exact module name), or ``code:<id>:callable`` of an upload.
- A logic ref is ``module:callable`` or ``code:<id>:callable`` (not an entry point's name).
- ``callable`` is a function or class the module defines at its top level (``def`` or
  ``class``), not a name it imports or assigns: ``examples.wordcount:os`` is refused.
- Anything else is refused with :class:`~controlplane.errors.BadJob` (code
  ``bad_job_ref``) or :class:`~controlplane.abstraction.BadLogic`, whose message says how
  to register code.

Checking a ref executes nothing: a module's file is found without importing it (the
finders of ``importlib.util.find_spec`` for its top-level package, which only look at the
file system, then ``PathFinder`` for each submodule in its parent's directories), read and
parsed with :mod:`ast`; an upload's source is the one :mod:`runtime.codeload` holds (the
control plane registers every stored upload there, without executing it).
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import logging
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path

from controlplane.abstraction import BadLogic
from controlplane.config import Settings
from controlplane.errors import BadJob
from runtime import codeload
from runtime.dataflow import LogicRef

__all__ = ["ENTRY_POINTS", "REGISTER_HINT", "Registry", "declared_jobs"]

logger = logging.getLogger(__name__)

ENTRY_POINTS = "streampilot.jobs"
REGISTER_HINT = (
    "to register code, an admin uploads it (POST /api/v1/code, then name "
    "code:<id>:<callable>) or the installation declares it (an entry point of the "
    f"{ENTRY_POINTS} group, or a module in STREAMPILOT_JOB_MODULES)"
)
_SHOWN = 8  # names listed in a refusal


@functools.cache
def declared_jobs() -> Mapping[str, str]:
    """The installation's job entry points, name -> ``module:callable`` (read once from
    the installed packages' metadata; nothing is imported)."""
    return {ep.name: f"{ep.module}:{ep.attr}" for ep in entry_points(group=ENTRY_POINTS)}


class Registry:
    """The registered code of one installation: its entry points and job modules, and the
    uploads :mod:`runtime.codeload` holds when a ref is checked."""

    def __init__(self, jobs: Mapping[str, str], modules: Iterable[str]) -> None:
        self.jobs = dict(jobs)
        self.modules = frozenset(modules) | {ref.partition(":")[0] for ref in self.jobs.values()}

    @classmethod
    def of(cls, settings: Settings) -> Registry:
        """The registry of ``settings.job_modules`` and the declared entry points."""
        return cls(declared_jobs(), settings.job_modules)

    def job(self, ref: str) -> str:
        """The ``module:callable`` or ``code:<id>:callable`` job ``ref`` names (an entry
        point's name is replaced by its target); :class:`BadJob` (``bad_job_ref``)
        otherwise."""
        if ":" not in ref and ref in self.jobs:
            return self.jobs[ref]
        refusal = self._refusal(ref, entry_point=True)
        if refusal is not None:
            raise BadJob(f"job {ref!r} is not registered code: {refusal}", code="bad_job_ref")
        return ref

    def logic(self, ref: str) -> LogicRef:
        """Logic ``ref`` as a :class:`~runtime.dataflow.LogicRef` (resolved by the workers
        that unpickle it); :class:`BadLogic` otherwise. The control plane's coordinator
        uses it as its ``resolve_logic``."""
        refusal = self._refusal(ref, entry_point=False)
        if refusal is not None:
            raise BadLogic(f"{ref!r} is not registered code: {refusal}")
        return LogicRef(ref)

    def _refusal(self, ref: str, *, entry_point: bool) -> str | None:
        """Why ``ref`` is not registered code (with how to register it), or None."""
        if codeload.is_code_ref(ref):
            reason = self._upload_refusal(ref)
        elif isinstance(ref, str) and ":" not in ref and entry_point:
            reason = (
                f"no {ENTRY_POINTS} entry point is named {ref!r}, and a reference to a "
                "module's callable is module:callable"
            )
        elif not isinstance(ref, str) or ref.count(":") != 1:
            reason = "a reference is module:callable or code:<id>:callable"
        else:
            module, name = ref.split(":")
            reason = self._module_refusal(module, name)
        if reason is None:
            return None
        return f"{reason}. {self._known(entry_point)}; {REGISTER_HINT}"

    def _upload_refusal(self, ref: str) -> str | None:
        try:
            code_id, name = codeload.parse_ref(ref)
        except codeload.CodeError as exc:
            return str(exc)
        source = codeload.source_of(code_id)
        if source is None:
            return f"no uploaded code with id {code_id}"
        return _definition_refusal(source, f"code {code_id}", name)

    def _module_refusal(self, module: str, name: str) -> str | None:
        if module not in self.modules:
            return f"module {module!r} is not registered"
        source = _module_source(module)
        if source is None:
            return f"module {module!r} is registered but its source file cannot be found"
        return _definition_refusal(source, f"module {module!r}", name)

    def _known(self, entry_point: bool) -> str:
        parts = []
        if entry_point:
            parts.append(f"entry points: {_listed(self.jobs)}")
        parts.append(f"registered modules: {_listed(self.modules)}")
        return "; ".join(parts)


def _listed(names: Iterable[str]) -> str:
    names = sorted(names)
    shown = ", ".join(names[:_SHOWN]) or "none"
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _definition_refusal(source: str, where: str, name: str) -> str | None:
    """Why ``name`` is not a top-level function or class of ``source``, or None."""
    try:
        defined = _top_level_definitions(source)
    except SyntaxError as exc:
        return f"{where} does not parse (line {exc.lineno}: {exc.msg})"
    if name in defined:
        return None
    return (
        f"{name!r} is not a function or class defined at the top level of {where} "
        "(names it imports or assigns are not registered)"
    )


@functools.lru_cache(maxsize=256)
def _top_level_definitions(source: str) -> frozenset[str]:
    tree = ast.parse(source)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return frozenset(node.name for node in tree.body if isinstance(node, kinds))


def _module_source(module: str) -> str | None:
    """The source of ``module``, found without importing it or its packages; None when
    it has no Python source file."""
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: no parent to import
    except (ImportError, ValueError):
        return None
    for i in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            return None
        locations = list(spec.submodule_search_locations)
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), locations)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        return Path(spec.origin).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        logger.warning("cannot read the source of registered module %s: %s", module, exc)
        return None
