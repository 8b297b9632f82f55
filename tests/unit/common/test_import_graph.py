"""grpo.common has no import circle: read from the sources (ast), and each module imports alone in a fresh interpreter.

A circle hidden by deferred imports (an import inside a function) still counts: the graph takes every import
statement, wherever it stands, except those under `if TYPE_CHECKING:` (never run).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "common" / "src"
PACKAGE = "grpo.common"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((SRC / "grpo" / "common").rglob("*.py"))}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path) -> set[str]:
    """The grpo.common modules `name` imports (a `from package import module` counts as that module)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    skip: set[int] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if _type_checking_only(node):
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t in MODULES and t != name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_the_weights_package() -> None:
    graph = {name: imports_of(name, path) for name, path in MODULES.items()}
    assert "grpo.common.weights.codec" in graph["grpo.common.weights.data_port"]
    assert "grpo.common.net" in graph["grpo.common.weights.data_port"]


def test_a_circle_is_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_grpo_common_has_no_import_cycle() -> None:
    graph = {name: imports_of(name, path) for name, path in MODULES.items()}
    assert find_cycle(graph) is None, f"import cycle in {PACKAGE}: {' -> '.join(find_cycle(graph) or [])}"


@pytest.mark.parametrize(
    "name", sorted(n for n in MODULES if n.startswith(f"{PACKAGE}.weights") or n == f"{PACKAGE}.net")
)
def test_each_weights_module_imports_alone(name: str) -> None:
    """First in a fresh interpreter: a circle would show as an ImportError on a partly initialised module."""
    run = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
