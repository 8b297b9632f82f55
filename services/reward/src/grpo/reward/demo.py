"""`python -m grpo.reward.demo`: start the reward service, score a handful of examples over HTTP, show a table."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from typing import Any

import httpx

from grpo.common.logs import setup_logging
from grpo.common.net import free_port

log = logging.getLogger("grpo.reward.demo")

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


def start_service(
    *flags: str, workers: int = 2, timeout_s: float = 60.0, quiet: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """The reward service (with extra `flags`) as a child process on free loopback ports, once /healthz
    answers; returns (process, base URL). `quiet` discards its output (benchmarks)."""
    http_port, grpc_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "grpo.reward", "--host", "127.0.0.1", "--http-port", str(http_port)]
    cmd += ["--grpc-port", str(grpc_port), "--workers", str(workers), "--log-level", "WARNING", *flags]
    output = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(cmd, stdout=output, stderr=output)
    url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"reward service exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.terminate()
    raise TimeoutError(f"reward service not healthy within {timeout_s}s")


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
    logging.getLogger("httpx").setLevel(logging.WARNING)
    proc, url = start_service()
    try:
        log.info("reward service up at %s (OpenAPI at %s/docs)", url, url)
        response = httpx.post(f"{url}/v1/score", json={"items": EXAMPLES}, timeout=120)
        response.raise_for_status()
        show(response.json()["results"])
        health = httpx.get(f"{url}/healthz", timeout=5).json()
        log.info("sandbox: %s", health["sandbox"])
    finally:
        proc.terminate()
        proc.wait(15)
    log.info("reward service stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
