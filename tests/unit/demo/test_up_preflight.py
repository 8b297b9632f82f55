"""What `grpo up` (and `grpo demo --redis-url`) check before they start anything: the stack file reads, the Redis
it names answers (and holds no other run's keys unnoticed), and a hub id is not waited on without a network. Each
problem is one line, in seconds, exit code 2, with nothing started (issue 34)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis

from grpo.common.net import free_port

TRAIN_DATA = Path(__file__).resolve().parents[3] / "k8s" / "grpo" / "files" / "train.jsonl"


def _grpo(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    """`grpo --runs-dir <tmp>/runs ARGS` as a user runs it; (the finished process, seconds it took)."""
    cmd = [sys.executable, "-m", "grpo.cli", "--runs-dir", str(tmp_path / "runs"), *args]
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=tmp_path,
                          env={**os.environ, "GRPO_CACHE_DIR": str(tmp_path / "cache"), **(env or {})})  # fmt: skip
    return done, time.monotonic() - began


def _started_anything(run_dir: Path) -> list[str]:
    """Service logs, a state file, or a live process naming the run folder."""
    logs = sorted(p.name for p in (run_dir / "logs").glob("*")) if (run_dir / "logs").is_dir() else []
    state = ["stack.json"] if (run_dir / "stack.json").exists() else []
    procs = [str(p.pid) for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    return logs + state + procs


def _stack(tmp_path: Path, redis_url: str, run_id: str = "r") -> Path:
    path = tmp_path / "stack.yaml"
    path.write_text(
        f"run_id: {run_id}\nredis_url: {redis_url}\nreward: {{workers: 1}}\nrollout: {{torch_threads: 1}}\n"
        f"trainer: {{train_data: {TRAIN_DATA}, steps: 2, torch_threads: 1}}\n"
    )
    return path


def test_an_unreachable_redis_is_one_line_in_seconds(tmp_path: Path) -> None:
    """It took 153–217 s (the trainer's outage retries) and ended in a 25-line traceback."""
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    done, seconds = _grpo(tmp_path, "up", "-c", str(_stack(tmp_path, url)), timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    assert seconds < 15, f"{seconds:.0f} s"  # 140 s before; now under 2 s
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"redis_url {url}: no Redis answers there" in errors[0], done.stderr[-3000:]
    assert "redis_url: null" in errors[0]  # how to get a private one instead
    assert "Traceback" not in done.stderr
    assert _started_anything(tmp_path / "runs" / "r") == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"run_id: r\nreward: {workers: 2\n", "not valid YAML or JSON: line 3, column 1"),
        (b"run_id: r\nreward: {workers: 2}  # caf\xe9\n", "not UTF-8 text (invalid continuation byte at byte 37)"),
        (b"- 1\n", "must hold a mapping"),
    ],
)
def test_a_stack_file_that_does_not_read_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    """The trainer's `--config` answers these in one line; `grpo up -c` gave PyYAML's or Python's traceback."""
    from grpo.cli.main import main

    config = tmp_path / "stack.yaml"
    config.write_bytes(content)
    assert main(["--runs-dir", str(tmp_path / "runs"), "up", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"config file {config}: {message}" in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    assert not (tmp_path / "runs").exists()


BAD_URL_LINE = "redis_url: must start with redis://, rediss:// or unix:// (got …'localhost:6379')"


def test_a_bad_redis_url_is_said_once_in_one_wording(tmp_path: Path) -> None:
    """The rollout's and the trainer's sections said it in two wordings (redis-py's and the trainer's)."""
    done, _ = _grpo(tmp_path, "up", "-c", str(_stack(tmp_path, "localhost:6379")), timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    assert BAD_URL_LINE in done.stderr, done.stderr[-3000:]
    assert done.stderr.count("redis_url: ") == 1 and "following schemes" not in done.stderr


def test_the_demo_checks_its_redis_before_the_cold_start(tmp_path: Path) -> None:
    """`grpo demo --redis-url` trained the SFT cold start for minutes before it said anything about the URL."""
    done, seconds = _grpo(tmp_path, "demo", "--redis-url", "localhost:6379", "--no-live", timeout=60)
    wording = BAD_URL_LINE.removeprefix("redis_url: ")
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"invalid option --redis-url localhost:6379: {wording}" in done.stderr, done.stderr[-3000:]
    url = f"redis://127.0.0.1:{free_port()}/0"
    done, seconds = _grpo(tmp_path, "demo", "--redis-url", url, "--no-live", timeout=60)
    assert done.returncode == 2 and f"redis_url {url}: no Redis answers there" in done.stderr, done.stderr[-3000:]
    assert seconds < 15 and "sft" not in done.stderr


def test_a_redis_with_another_runs_keys_is_said(tmp_path: Path, redis_url: str) -> None:
    """The services' default Redis is 127.0.0.1:6379, where another run may already live: `grpo up` says whose keys
    it found there (a stack without a trainer: Redis and the reward service only)."""
    client = redis.Redis.from_url(redis_url)
    client.xadd("grpo:{someone-else}:tasks", {"m": b""})
    config = tmp_path / "stack.yaml"
    config.write_text(f"run_id: mine\nredis_url: {redis_url}\nreplicas: 0\nreward: {{workers: 1}}\n")
    try:
        done, _ = _grpo(tmp_path, "up", "-c", str(config), "--detach", timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        warning = next((line for line in done.stderr.splitlines() if " WARNING " in line), "")
        assert "holds the keys of another run: ['someone-else']" in warning, done.stderr[-3000:]
    finally:
        down, _ = _grpo(tmp_path, "down", timeout=60)
    assert down.returncode == 0, down.stderr[-3000:]


def test_a_hub_id_without_a_network_fails_in_seconds(tmp_path: Path) -> None:
    """A made-up hub id with no way to the hub took 54 s and 22 warning lines (huggingface_hub's retries). The hub
    address is one that never resolves (.invalid), so this is the no-network path wherever the test runs."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT="https://hub.invalid", HF_HUB_CACHE=str(tmp_path / "hub"))
    config = tmp_path / "stack.yaml"
    config.write_text(
        f"run_id: h\nreward: {{workers: 1}}\nrollout: {{model: acme/made-up-model}}\n"
        f"trainer: {{model: acme/made-up-model, train_data: {TRAIN_DATA}, steps: 2}}\n"
    )
    cmd = [sys.executable, "-m", "grpo.cli", "--runs-dir", str(tmp_path / "runs"), "up", "-c", str(config)]
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path, env=env)
    seconds = time.monotonic() - began
    assert done.returncode == 2, done.stderr[-3000:]
    assert seconds < 20, f"{seconds:.0f} s"  # 54 s before; now 2–10 s, most of it the trainer settings' torch import
    problems = [line.strip() for line in done.stderr.splitlines() if line.startswith("  ")]
    assert [p.split(":")[0] for p in problems] == ["rollout.model", "trainer.model"], done.stderr[-3000:]
    for problem in problems:
        assert "'acme/made-up-model' is not a local folder" in problem and "HF_HUB_OFFLINE" in problem, problem
        assert "local folder" in problem and "hub.invalid" in problem
    assert "WARNING" not in done.stderr and "Retrying" not in done.stderr, done.stderr[-3000:]
    assert _started_anything(tmp_path / "runs" / "h") == []
