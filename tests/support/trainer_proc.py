"""The trainer as a real process for tests: its config file, start-up, and what it writes (metrics)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo.common.net import free_port
from grpo.local.procs import spawn
from tests.support.polling import exited, wait_until

ROLLOUT_ENV = {
    "GRPO_ROLLOUT_HEARTBEAT_S": "0.3",
    "GRPO_ROLLOUT_RECLAIM_IDLE_S": "5",
    "GRPO_ROLLOUT_REGISTRY_TTL_S": "3",
    "GRPO_ROLLOUT_WORKER_BLOCK_MS": "200",
}


def colocated(reward_addr: str) -> dict[str, Any]:
    """The trainer's `colocate` setting for a replica in its own process, as quick as ROLLOUT_ENV's replicas."""
    return {"reward_addr": reward_addr, "heartbeat_s": 0.3, "reclaim_idle_s": 5, "registry_ttl_s": 3,
            "worker_block_ms": 200}  # fmt: skip


def write_data(path: Path, n: int, offset: int = 0) -> Path:
    rows = [
        {"id": f"q{i}", "prompt": f"What is {i} + {i + 1}?", "gold": str(2 * i + 1)} for i in range(offset, offset + n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def trainer_config(tmp: Path, run: str, redis_url: str, **extra: Any) -> Path:
    config = {
        "run_id": run,
        "redis_url": redis_url,
        "train_data": str(write_data(tmp / "train.jsonl", 16)),
        "output_dir": str(tmp / "out"),
        "group_size": 4,
        "prompts_per_step": 3,
        "max_new_tokens": 16,
        "temperature": 1.0,
        "stop": ["e"],
        "overlong_soft_penalty": True,
        "overlong_buffer": 8,
        "reward_weights": {"overlong": 1.0, "math": 1.0},
        "beta": 0.0,
        "mask_truncated": False,
        "lr": 1e-5,
        "micro_batch_size": 8,
        "grpc_port": free_port(),
        "http_port": free_port(),
        "host": "127.0.0.1",
        "torch_threads": 1,
        "replica_wait_s": 60,
        "push_timeout_s": 30,
        **extra,
    }
    path = tmp / "trainer.json"
    path.write_text(json.dumps(config))
    return path


def start_trainer(config: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`python -m grpo.trainer *extra` with `config`, output appended to `log`; the test waits for or kills it."""
    env = {"OMP_NUM_THREADS": "1", "GRPO_TRAINER_CONFIG": str(config)}
    return spawn("trainer", [sys.executable, "-m", "grpo.trainer", *extra], log, env=env).proc


def run_trainer(config: Path, log: Path, timeout: float = 150, *, ranks: int = 1) -> None:
    """Run the trainer to its end; it must exit 0 within `timeout` (killed otherwise). ranks > 1: under torchrun, one
    process per rank (DeepSpeed on CPU with gloo: the config sets backend deepspeed)."""
    for _ in range(3):
        start = log.stat().st_size if log.exists() else 0  # spawn appends: judge this attempt's lines only
        if ranks == 1:
            proc = start_trainer(config, log)
        else:
            env = {"OMP_NUM_THREADS": "1", "GRPO_TRAINER_CONFIG": str(config), "TOKENIZERS_PARALLELISM": "false"}
            torchrun = Path(sys.executable).with_name("torchrun")
            cmd = [str(torchrun), f"--nproc-per-node={ranks}", f"--master-port={free_port()}", "-m", "grpo.trainer"]
            proc = spawn("torchrun", cmd, log, env=env).proc
        try:
            code = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
        # the master port taken between free_port() and torchrun's bind (a parallel test): the store never came up,
        # no step ran; run again on another port
        if code == 0 or ranks == 1 or not port_taken(log.read_bytes()[start:].decode(errors="replace")):
            break
    assert code == 0, log.read_text()[-4000:]


def port_taken(log: str) -> bool:
    """Whether torchrun failed because its master port was in use (the rendezvous store's bind)."""
    return "EADDRINUSE" in log or "address already in use" in log.lower()


def run_failing_trainer(config: Path, log: Path, timeout: float = 150) -> str:
    """Run the trainer to its end; it must fail as a run fails for a reason of the user's (exit 1, one line, no
    traceback). Its log, for the test to check the reason."""
    proc = start_trainer(config, log)
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 1, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    return text


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen[bytes], log: Path) -> Any:
    """wait_until, given up once the trainer has failed, with the trainer's log tail in the message."""
    return wait_until(
        predicate,
        timeout,
        what,
        every=0.3,
        stop=exited(proc, failed_only=True),
        context=lambda: f" (exit {proc.poll()}):\n{log.read_text()[-4000:]}",
    )


def read_metrics(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
