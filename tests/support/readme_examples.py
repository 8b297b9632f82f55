"""The README's standalone-verifier calls, read from the README itself so the tests keep it true.

Each `curl -s localhost:8002/<path> ... -d '<json>'` block becomes (path, body, expected), where expected
is every `"key": scalar` of the `# {...}` reply comment under it, except timings (keys ending in `_s`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"
CALL = re.compile(r"curl -s localhost:8002(/\S+) .*?-d '(.*?)'\n# (\{.*?)\n", re.S)
SCALAR = re.compile(r'"(\w+)": ("(?:[^"\\]|\\.)*"|true|false|null|-?\d+(?:\.\d+)?)')


def verifier_examples() -> list[tuple[str, dict[str, Any], list[tuple[str, Any]]]]:
    section = README.read_text().split("## Standalone verifier", 1)[1].split("\n## ", 1)[0]
    out = []
    for path, body, reply in CALL.findall(section):
        expected = [(k, json.loads(v)) for k, v in SCALAR.findall(reply) if not k.endswith("_s")]
        out.append((path, json.loads(body), expected))
    return out


def values_of(obj: Any, key: str) -> list[Any]:
    """Every value of `key` anywhere in a JSON document."""
    if isinstance(obj, dict):
        return [v for k, v in obj.items() if k == key] + [x for v in obj.values() for x in values_of(v, key)]
    if isinstance(obj, list):
        return [x for v in obj for x in values_of(v, key)]
    return []


def mismatches(reply: Any, expected: list[tuple[str, Any]]) -> list[str]:
    """The documented fields the reply does not have (empty when it answers as the README says)."""
    return [f"{k}={v!r} not in {values_of(reply, k)!r}" for k, v in expected if v not in values_of(reply, k)]
