"""SIGTERM during the rollout's start-up (model loading can take minutes) exits at once, without serving."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from grpo.common.tiny_model import ensure_tiny_model
from grpo.local.procs import spawn

ROOT = Path(__file__).resolve().parents[2]


def log_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def start_then_terminate(python: Path, engine: str, cwd: Path) -> tuple[int, str, list[int]]:
    """Start `grpo.rollout`, send SIGTERM (to it alone, as an orchestrator does) once it is loading; return its
    exit code, its log and the pids of the processes it had started by then."""
    args = [str(python), "-m", "grpo.rollout", "--engine", engine, "--model", str(ensure_tiny_model()),
            "--grpc-port", "0", "--http-port", "0"]  # fmt: skip
    child = spawn(f"rollout-{engine}", args, cwd / f"rollout-{engine}.log")
    try:
        # The whole log, not its tail: vLLM writes dozens of lines right after "starting: loading", and on a busy
        # machine the marker scrolled out of a 20-line tail before a poll saw it (the signal then came late).
        child.wait_ready(lambda: any(m in log_text(child.log_path) for m in ("starting: loading", "listening")), 120)
        children = [c.pid for c in psutil.Process(child.pid).children(recursive=True)]
        child.proc.send_signal(signal.SIGTERM)
        code = child.proc.wait(timeout=120)
    finally:
        child.stop(grace_s=5)
    return code, child.log_path.read_text(), children


def test_sigterm_while_loading_exits_at_once_without_starting_servers(tmp_path: Path) -> None:
    code, log, _ = start_then_terminate(Path(sys.executable), "hf", tmp_path)
    # Before: the signal only set a stop event nobody polled yet; start-up went on, servers came up, then exit 0.
    assert code == 128 + signal.SIGTERM, log[-3000:]
    assert "signal SIGTERM during start-up: exiting" in log
    assert "listening" not in log and "rollout ready" not in log


@pytest.mark.vllm
def test_sigterm_while_vllm_loads_exits_at_once_and_leaves_no_process(tmp_path: Path) -> None:
    """vLLM's start-up (imports, engine, compile) takes the longest; a SIGTERM in it must end it and its helpers."""
    python = ROOT / ".venv-vllm" / "bin" / "python"
    code, log, children = start_then_terminate(python, "vllm", tmp_path)
    assert code == 128 + signal.SIGTERM, log[-3000:]
    assert "listening" not in log and "rollout ready" not in log
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) for pid in children):
        time.sleep(0.2)
    alive = [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not alive, f"left behind: {alive}"
