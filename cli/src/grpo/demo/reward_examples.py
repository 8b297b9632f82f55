"""`python -m grpo.demo.reward_examples`: start the reward service, score a handful of examples over HTTP, show a table."""

from __future__ import annotations

import json
import logging
import sys
import urllib.request
from typing import Any

from grpo.common.logs import setup_logging
from grpo.local.services import start_reward

log = logging.getLogger("grpo.demo.reward_examples")

CODE_OK = "```python\nn = int(input())\nprint(n * n)\n```"
CODE_BAD = "```python\nn = int(input())\nprint(n + n)\n```"
SQUARE_TESTS = [{"stdin": "3", "expected_stdout": "9"}, {"stdin": "4", "expected_stdout": "16"}]

EXAMPLES: list[dict[str, Any]] = [
    {
        "id": "math right",
        "completion": "<think>6 times 7</think><answer>\\boxed{42}</answer>",
        "checks": {"math": {"gold": "42"}},
    },
    {"id": "math wrong", "completion": "\\boxed{\\frac{1}{2^{98}}}", "checks": {"math": {"gold": "\\frac{1}{2^{99}}"}}},
    {"id": "math no answer", "completion": "I am not sure.", "checks": {"math": {"gold": "7"}}},
    {"id": "gold unparseable", "completion": "\\boxed{1}", "checks": {"math": {"gold": ""}}},
    {"id": "code passes", "completion": CODE_OK, "checks": {"code": {"tests": SQUARE_TESTS}}},
    {"id": "code fails", "completion": CODE_BAD, "checks": {"code": {"tests": SQUARE_TESTS}}},
    {"id": "format ok", "completion": "<think>add them</think><answer>5</answer>", "checks": {"format": {}}},
    {"id": "format empty think", "completion": "<think></think><answer>5</answer>", "checks": {"format": {}}},
    {
        "id": "language mixed",
        "prompt": "What is two plus three?",
        "completion": "<think>two plus three 等于五</think><answer>5</answer>",
        "checks": {"language": {"target": "auto"}},
    },
    {
        "id": "all together",
        "prompt": "What is 2+3?",
        "completion": "<think>two plus three is five</think><answer>5</answer>",
        "checks": {"math": {"gold": "5"}, "format": {}, "language": {"target": "en"}},
        "weights": {"format": 0.5, "language": 0.1},
    },
]


def _json(url: str, body: object | None = None, timeout_s: float = 120.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def show(results: list[dict[str, Any]]) -> None:
    """A readable table: rich when installed, else plain log lines."""
    rows = []
    for r in results:
        reward = "null" if r["reward"] is None else f"{r['reward']:.3f}"
        parts = ", ".join(
            f"{name}={'null' if c['score'] is None else round(c['score'], 3)} ({c['status']})"
            for name, c in r["components"].items()
        )
        rows.append((r["id"], reward, r["status"], parts, r["error"]))
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for row in rows:
            log.info("%-20s reward=%-6s %-5s %s %s", *row)
        return
    table = Table(title="grpo-reward: /v1/score")
    for column in ("item", "reward", "status", "components", "why null"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console(stderr=True, width=160).print(table)


def main() -> int:
    setup_logging("INFO")
    service = start_reward("--log-level", "WARNING", workers=2)
    try:
        url = service.http_url
        log.info("reward service up at %s (OpenAPI at %s/docs)", url, url)
        show(_json(f"{url}/v1/score", {"items": EXAMPLES})["results"])
        log.info("sandbox: %s", _json(f"{url}/healthz", timeout_s=5)["sandbox"])
    finally:
        service.stop()
        service.log_path.unlink(missing_ok=True)
    log.info("reward service stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
