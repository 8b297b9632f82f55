"""The README's "Where is …" table points at real places: every path exists, every name is defined there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def where_rows() -> list[tuple[str, str]]:
    """(what, where) per row of the table under **Where is …**."""
    text = (ROOT / "README.md").read_text()
    table = text.split("**Where is …**", 1)[1].split("\n\n", 2)[1]
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("| ")]
    return [(what.strip(), where.strip()) for what, where in rows[1:] if not set(where.strip()) <= {"-"}]


def defined_names(path: Path) -> set[str]:
    """Top-level functions, classes and assignments of a module, and `Class.method` for its classes' methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_the_table_has_its_rows() -> None:
    assert len(where_rows()) >= 10


def test_every_path_exists_and_every_name_is_defined_there() -> None:
    problems: list[str] = []
    for what, where in where_rows():
        paths_part, _, names_part = where.partition(" — ")
        paths = [ROOT / p for p in re.findall(r"`([^`]+)`", paths_part)]
        assert paths, f"row {what!r} names no path"
        problems += [f"{what}: {p.relative_to(ROOT)} does not exist" for p in paths if not p.exists()]
        if not names_part:
            continue
        base = paths[0]
        modules = [base / n for n in re.findall(r"`([^`]+\.py)`", names_part)] if base.is_dir() else [base]
        problems += [f"{what}: {m.relative_to(ROOT)} does not exist" for m in modules if not m.exists()]
        if base.is_dir():
            continue
        defined = defined_names(base)
        problems += [f"{what}: {n} is not defined in {base.relative_to(ROOT)}"
                     for n in re.findall(r"`([^`]+)`", names_part) if n not in defined]  # fmt: skip
    assert not problems, problems
