"""The import graph of the coordinator, the worker backends and the runtime has no cycle.

Read from the module files (ast), not by importing them: every ``import`` counts, also one
inside a function or under ``TYPE_CHECKING``. Only imports between the modules checked
make edges; importing a submodule is not counted as importing its package's
``__init__`` (which would make every package with re-exports a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("controlplane/coordinator", "controlplane/backends", "runtime")

# Cycles still there, each listed until a later change removes it (edges: importer, imported).
KNOWN_CYCLES: set[frozenset[tuple[str, str]]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for top in CHECKED:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The checked modules that module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports the submodule pkg.mod when there is one, and
            # pkg itself for a name that is not a submodule.
            subs = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t for t in subs if t in known]
            if len(targets) < len(subs):
                targets.append(base)
        else:
            continue
        for target in targets:
            while target and target not in known:  # ``import a.b.c``: the deepest known
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _edges(graph: dict[str, set[str]], component: list[str]) -> frozenset[tuple[str, str]]:
    members = set(component)
    return frozenset((a, b) for a in component for b in graph[a] if b in members)


def test_the_walk_sees_the_imports_it_must():
    graph = _graph()
    assert "controlplane.coordinator.cluster" in graph["controlplane.coordinator.core"]
    assert "controlplane.backends.base" in graph["controlplane.backends"]
    assert "runtime.messages" in graph["controlplane.coordinator.cluster"]


def test_no_import_cycle():
    graph = _graph()
    cycles = [c for c in _cycles(graph) if _edges(graph, c) not in KNOWN_CYCLES]
    described = [
        " <-> ".join(c) + ": " + ", ".join(f"{a} -> {b}" for a, b in sorted(_edges(graph, c)))
        for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_the_runtime_never_imports_the_control_plane():
    offenders = []
    for name, path in _modules().items():
        if not name.startswith("runtime"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{name} imports {n}" for n in names if n.split(".")[0] == "controlplane"]
    assert not offenders, offenders


def test_the_backends_do_not_import_the_coordinator():
    graph = _graph()
    reaching = {
        (a, b)
        for a, imported in graph.items()
        if a.startswith("controlplane.backends")
        for b in imported
        if b.startswith("controlplane.coordinator")
    }
    assert not reaching, reaching
