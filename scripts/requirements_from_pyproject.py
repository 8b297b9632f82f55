"""Print the third-party dependencies of the given pyproject.toml files, one per line.

Used by the Dockerfiles to install dependencies in a layer of their own (cached until a
pyproject changes) before the source is copied. Our own `grpo-*` packages are skipped.
"""

from __future__ import annotations

import sys
import tomllib


def main(paths: list[str], extras: list[str]) -> None:
    seen: list[str] = []
    for path in paths:
        with open(path, "rb") as f:
            project = tomllib.load(f)["project"]
        deps = list(project.get("dependencies", []))
        for extra in extras:
            deps += project.get("optional-dependencies", {}).get(extra, [])
        seen += [d for d in deps if not d.startswith("grpo-") and d not in seen]
    sys.stdout.write("\n".join(seen) + "\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    extras = [a.split("=", 1)[1] for a in args if a.startswith("--extra=")]
    main([a for a in args if not a.startswith("--extra=")], extras)
