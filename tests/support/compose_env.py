"""docker-compose.yml's environment for one service, interpolated as Compose does (no Docker needed), and the
secrets its init-secrets service writes (deploy/compose/secrets.sh, run here as the container runs it).

Compose substitutes `${VAR}`, `${VAR:-default}` (default when unset or empty), `${VAR-default}`
(default when unset) and `$VAR`; `$$` is a literal `$`. An unset variable without a default becomes
''. The result keeps empty strings: that is what the containers see (and what once broke auth).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
SECRETS_SCRIPT = COMPOSE_FILE.parent / "deploy" / "compose" / "secrets.sh"
SECRETS_MOUNT = "/run/grpo/"  # where the containers mount the secret volumes
_VAR = re.compile(r"\$(?:\$|\{(\w+)(?:(:?-)([^}]*))?\}|(\w+))")


def interpolate(value: str, variables: Mapping[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        given = variables.get(name)
        if m.group(2) == ":-":
            return given if given else m.group(3)
        if m.group(2) == "-":
            return given if given is not None else m.group(3)
        return given or ""

    return _VAR.sub(one, value)


def compose_env(service: str, variables: Mapping[str, str], compose: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment compose gives `service`'s container when the shell has `variables`."""
    compose = compose or yaml.safe_load(COMPOSE_FILE.read_text())
    environment = compose["services"][service].get("environment", {})
    return {k: interpolate(str(v), variables) for k, v in environment.items()}


def write_secrets(root: Path, variables: Mapping[str, str]) -> Path:
    """Run deploy/compose/secrets.sh with the environment compose gives init-secrets, into `root`/api and
    `root`/redis (the containers' /run/grpo/api and /run/grpo/redis). Again on the same root keeps what it wrote."""
    for volume in ("api", "redis"):
        (root / volume).mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **compose_env("init-secrets", variables)}
    subprocess.run(["sh", str(SECRETS_SCRIPT), str(root / "api"), str(root / "redis")], env=env, check=True,
                   capture_output=True, text=True, timeout=30)  # fmt: skip
    return root


def local_secret_paths(env: Mapping[str, str], root: Path) -> dict[str, str]:
    """`env` with each path under the containers' secret mounts moved under `root` (see write_secrets)."""
    return {k: str(root / v.removeprefix(SECRETS_MOUNT)) if v.startswith(SECRETS_MOUNT) else v for k, v in env.items()}
