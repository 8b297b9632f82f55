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


OWN_TASK_FILE = re.compile(r"^`mytask/([\w.]+)`[^\n]*\n(?:[^\n]+\n)*?\n```\w*\n(.*?)```", re.S | re.M)
OWN_TASK_COMMAND = re.compile(r"```bash\n(cd mytask && grpo up[^\n]*)\n```")


def own_task_example() -> tuple[dict[str, str], str]:
    """The "Train your own task" section's files (name → text, each the fenced block after its `mytask/NAME` line)
    and its `grpo up` command line."""
    section = README.read_text().split("## Train your own task", 1)[1].split("\n## ", 1)[0]
    files = {name: text for name, text in OWN_TASK_FILE.findall(section)}
    command = OWN_TASK_COMMAND.search(section)
    assert command is not None, "the section's `cd mytask && grpo up ...` block is missing"
    return files, command.group(1).split("#")[0].strip()


def compose_results_commands() -> str:
    """The README's shell block that copies a compose run's results out of the checkpoints volume."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    return next(block for block in blocks if "tar -xf - -C results" in block)
