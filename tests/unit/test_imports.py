"""No import cycles between mgpu's modules, and no layer that imports a layer above it.

The graph is read from the source with `ast`: every import, at module level, under `if
TYPE_CHECKING:` and inside functions (a cycle or an upward arrow hidden from the interpreter
is still one in the design).  `from mgpu.x import y` counts as importing the module
`mgpu.x.y` when that is a module, else `mgpu.x`.

The layers, lowest first (docs/ARCHITECTURE.md draws them): the shared base modules
(`mgpu.model`, `mgpu.protocol`, `mgpu.spec`, ...), the pure scheduler, the simulator, then
the master and the agent side by side (neither imports the other), then the client, the
Slurm commands over it (and beside them the pod agent, mgpu.podagent), and the package's
own entry points on top (`mgpu.client.cli`, the `mgpu` command, among them).  Inside the
master: runtime < store < state < security < monitor < control < kube (a Kubernetes
partition's driver) < ha < http < server.
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


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import in the module: at module level, under `if TYPE_CHECKING:`, and inside
    functions (a deferred import is still a dependency of the design)."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


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
        for node in _imports(ast.parse(path.read_text())):
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
    assert "mgpu.master.store.base" in graph["mgpu.master.control.cluster"]  # from x import Y
    assert "mgpu.spec" in graph["mgpu.master.control.submit"]  # from mgpu import spec (a module)
    assert "mgpu.scheduler.types" in graph["mgpu.scheduler.core"]  # from .types import ...
    assert "mgpu.client.api" in graph["mgpu"]  # a package's __init__
    assert "mgpu.agent.launcher" in graph["mgpu.testing"]  # imported in a function


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]


def test_no_import_cycles_between_mgpus_modules() -> None:
    found = cycles(import_graph())
    if found:
        shown = "; ".join(" <-> ".join(sorted(c)) for c in found)
        pytest.fail(f"import cycles between mgpu's modules: {shown}")


BASE, SCHEDULER, SIM, DAEMONS, CLIENT, SLURM, TOP = range(7)
TOP_MODULES = {"mgpu", "mgpu.__main__", "mgpu.testing", "mgpu.client.cli"}
"""The package's entry points: `mgpu.client.cli` is the `mgpu` command, which runs the
client's commands, the master, the node agent and the Slurm commands."""
MASTER_LAYERS = [
    "runtime",
    "store",
    "state",
    "security",
    "monitor",
    "control",
    "kube",
    "ha",
    "http",
    "server",
]


def layer(module: str) -> tuple[int, str]:
    """The module's rank and the name of its layer (a rank may hold peers, e.g. master and
    agent, which must not import each other)."""
    if module in TOP_MODULES:
        return TOP, "top"
    parts = module.split(".")
    package = parts[1] if len(parts) > 1 else ""
    ranks = {"scheduler": SCHEDULER, "sim": SIM, "master": DAEMONS, "agent": DAEMONS}
    ranks["client"] = CLIENT
    ranks["slurm"] = SLURM  # Slurm's commands, over the client (its API, its steps)
    ranks["podagent"] = SLURM  # the agent in a Kubernetes Pod: the agent's grants, the
    # client's leader search; a peer of Slurm's commands (neither imports the other)
    if package in ranks:
        return ranks[package], package
    return BASE, "base"


def master_layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "master":
        return None
    return MASTER_LAYERS.index(parts[2])


def upward(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for importer, imported in sorted(graph.items()):
        for target in sorted(imported):
            (rank_a, name_a), (rank_b, name_b) = layer(importer), layer(target)
            if rank_b > rank_a or (rank_b == rank_a and name_a != name_b):
                found.append(f"{importer} -> {target}")
            low, high = master_layer(importer), master_layer(target)
            if low is not None and high is not None and high > low:
                found.append(f"{importer} -> {target}")
    return found


def test_every_master_module_is_in_a_named_layer() -> None:
    master = [m for m in import_graph() if m.startswith("mgpu.master.")]
    assert master, "no master modules found"
    assert [m for m in master if m.split(".")[2] not in MASTER_LAYERS] == []


def test_upward_imports_are_found() -> None:
    graph = {
        "mgpu.model": {"mgpu.master.security.auth"},
        "mgpu.master.state.registry": {"mgpu.master.control.cluster"},
        "mgpu.agent.agent": {"mgpu.master.state.registry"},
        "mgpu.master.http.app": {"mgpu.master.control.cluster", "mgpu.model"},
    }
    assert upward(graph) == [
        "mgpu.agent.agent -> mgpu.master.state.registry",
        "mgpu.master.state.registry -> mgpu.master.control.cluster",
        "mgpu.model -> mgpu.master.security.auth",
    ]


def test_no_layer_imports_a_layer_above_it() -> None:
    found = upward(import_graph())
    if found:
        pytest.fail("imports against the layers: " + "; ".join(found))
