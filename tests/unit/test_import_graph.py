"""The client package's modules import each other without a circle.

Why: a circle (consumer.py <-> group_member.py used to be one, hidden behind a function-level
import and a ``TYPE_CHECKING`` one) means neither module can be read, changed or tested without
the other. Every import counts here, wherever it stands (module level, inside a function,
under ``if TYPE_CHECKING:``), read with the stdlib ``ast`` so nothing is executed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import strom

ROOT = Path(strom.__file__).parent
PACKAGE = "strom.client"


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the ``strom`` package."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``strom`` modules ``name`` imports (a ``from pkg import x`` counts as importing
    ``pkg.x`` when that is a module, else ``pkg``)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
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
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _client_graph() -> dict[str, set[str]]:
    modules = _modules(ROOT)
    known = set(modules)
    return {
        name: {m for m in _imports(name, path, known) if m.startswith(PACKAGE + ".")}
        for name, path in modules.items()
        if name.startswith(PACKAGE + ".")
    }


def test_the_client_modules_import_without_a_circle() -> None:
    graph = _client_graph()
    assert "strom.client.consumer" in graph and "strom.client.metadata" in graph
    assert _cycles(graph) == []


def test_the_group_member_does_not_know_the_consumer() -> None:
    graph = _client_graph()
    assert "strom.client.consumer" not in graph["strom.client.group_member"]
    assert "strom.client.group_member" in graph["strom.client.consumer"]


def test_the_cycle_finder_finds_a_circle() -> None:
    # The check above must be able to fail: a hidden (TYPE_CHECKING) back edge is a circle.
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from strom.client import a\n"
    tree_imports = {
        m
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.ImportFrom)
        for m in (f"{node.module}.{a.name}" for a in node.names)
    }
    graph = {"strom.client.a": {"strom.client.b"}, "strom.client.b": tree_imports}
    assert _cycles(graph) == [["strom.client.a", "strom.client.b"]]
