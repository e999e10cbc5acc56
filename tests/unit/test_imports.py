"""No import cycles between mgpu's modules.

The graph is read from the source with `ast`: every import at module level, including
those under `if TYPE_CHECKING:` (a cycle hidden from the interpreter is still a cycle in
the design).  Imports inside functions are left out: they are how a module defers a heavy
or optional import, and run only when called.  `from mgpu.x import y` counts as importing
the module `mgpu.x.y` when that is a module, else `mgpu.x`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "mgpu").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _module_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports run when the module is imported (or type-checked): not those in functions."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            found += _module_level(node.body) + _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            found += _module_level(node.body) + _module_level(node.orelse)
            found += _module_level(node.finalbody)
            for handler in node.handlers:
                found += _module_level(handler.body)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str | None] = set()
        for node in _module_level(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                edges.update(owner(a.name) for a in node.names if a.name.startswith("mgpu"))
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            if base == "mgpu" or base.startswith("mgpu."):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    edges.add(full if full in modules else owner(base))
        edges.discard(None)
        edges.discard(name)
        graph[name] = {e for e in edges if e is not None}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_of_every_kind() -> None:
    graph = import_graph()
    assert "mgpu.master.store" in graph["mgpu.master.cluster"]  # from x import Y
    assert "mgpu.spec" in graph["mgpu.master.submit"]  # from mgpu import spec (a module)
    assert "mgpu.scheduler.types" in graph["mgpu.scheduler.core"]  # from .types import ...
    assert "mgpu.client.api" in graph["mgpu"]  # a package's __init__
    assert "mgpu.agent.launcher" not in graph["mgpu.testing"]  # imported in a function


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]


def test_no_import_cycles_between_mgpus_modules() -> None:
    found = cycles(import_graph())
    if found:
        shown = "; ".join(" <-> ".join(sorted(c)) for c in found)
        pytest.fail(f"import cycles between mgpu's modules: {shown}")
