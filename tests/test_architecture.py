"""The package layout is the architecture: no import cycles, and dependencies point inward.

Every ``import`` inside ``forge`` counts, at module level, inside functions (lazy imports) and
under ``TYPE_CHECKING``: a cycle through a lazy import is still two modules that cannot be
understood apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import forge

ROOT = Path(forge.__file__).parent

#: Layers from the inside out; a module may import its own layer or any inner one.
LAYERS = [
    {"model", "errors", "files"},
    {"store", "llm", "envs"},
    {"engine"},
    {"learn", "share", "curate"},
    {"population"},
    {"protocols", "team"},
    {"integrations", "server", "client", "cli", "__init__"},
]
#: Imports that point outward on purpose, each with its reason.
ALLOWED_OUTWARD = {
    # The scripted test LLM obeys rules in its prompt, so it reads the rule grammar.
    ("forge.llm.testing", "forge.learn.rules"),
    # Memory.add_messages is the library's front door for conversations (mem0's add(messages));
    # what it runs, extraction and admission, lives in curate, above the engine. One lazy call.
    ("forge.engine.memory", "forge.curate.messages"),
    # Memory.learn / Memory.outcome are the library's front door for a user's own agent's
    # outcomes; the learning (reflection, credit, the one learning function) lives in learn.
    ("forge.engine.memory", "forge.learn.online"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("forge", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the forge modules it imports (a ``from pkg import mod`` names the module)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names]
            for target in targets:
                if target == "forge" or target.startswith("forge."):
                    resolved = _resolve(target, modules)
                    if resolved and resolved != name:
                        edges.add(resolved)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{module}: its package {top!r} has no layer in tests/test_architecture.py")


def test_the_checker_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_and_type_checking_imports():
    graph = import_graph()
    # the curation pass imports consolidation lazily, inside curate()
    assert "forge.curate.consolidate" in graph["forge.curate.lifecycle"]
    assert len(graph) > 90 and sum(map(len, graph.values())) > 300


def test_no_import_cycles_inside_forge():
    assert cycles(import_graph()) == []


def test_dependencies_point_inward():
    outward = sorted(
        (src, dst)
        for src, dsts in import_graph().items()
        for dst in dsts
        if _layer(dst) > _layer(src) and (src, dst) not in ALLOWED_OUTWARD
    )
    assert outward == []


def test_no_loose_modules_beyond_the_package_face():
    loose = sorted(p.stem for p in ROOT.glob("*.py"))
    assert loose == ["__init__", "cli", "client", "errors", "files", "model"]
