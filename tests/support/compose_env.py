"""docker-compose.yml's environment for one service, interpolated as Compose does (no Docker needed).

Compose substitutes `${VAR}`, `${VAR:-default}` (default when unset or empty), `${VAR-default}`
(default when unset) and `$VAR`; `$$` is a literal `$`. An unset variable without a default becomes
''. The result keeps empty strings: that is what the containers see (and what once broke auth).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
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
