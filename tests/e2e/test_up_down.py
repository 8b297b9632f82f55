"""`grpo up --detach` / `grpo status` / `grpo down` with real processes: everything starts, reports, and is gone after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
GRPO = [sys.executable, "-m", "grpo.cli"]


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRPO_CACHE_DIR": str(cwd / "cache")}
    return subprocess.run([*GRPO, "--runs-dir", str(cwd / "runs"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


def _ours(processes: list[dict[str, object]]) -> list[int]:
    """The recorded processes still running: same PID and same start time (psutil)."""
    alive = []
    for rec in processes:
        try:
            p = psutil.Process(int(rec["pid"]))  # type: ignore[call-overload]
            if p.status() != psutil.STATUS_ZOMBIE and abs(p.create_time() - float(rec["create_time"])) < 0.01:  # type: ignore[arg-type]
                alive.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _descendants_of_run(run_dir: Path) -> list[psutil.Process]:
    """Any process anywhere whose command line mentions the run folder (config files live there)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(run_dir) in part for part in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


def _stack_config(tmp_path: Path, run_id: str, steps: int) -> Path:
    """The demo's tiny model and task behind a stack config with a trainer of `steps` steps."""
    import torch

    from grpo.demo.model import build_model_folder
    from grpo.demo.task import make_splits, prompt_rows

    torch.set_num_threads(1)
    model = build_model_folder(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in prompt_rows(make_splits(50, 50, 10).grpo, "t")))
    config = {
        "run_id": run_id,
        "reward": {"workers": 1},
        "rollout": {"model": str(model), "torch_threads": 1},
        # The untrained model's groups mostly score one reward each; kept (not skipped), they count as trained: a
        # run that trains on no group fails, and these tests are about the stack, not about learning.
        "trainer": {"model": str(model), "train_data": str(data), "steps": steps, "prompts_per_step": 2,
                    "group_size": 2, "max_new_tokens": 8, "torch_threads": 1, "lr": 1e-5,
                    "skip_zero_variance": False},
    }  # fmt: skip
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_up_status_down_leaves_no_process(tmp_path: Path) -> None:
    _stack_config(tmp_path, "updown", 100000)

    up = _run(["up", "-c", str(tmp_path / "stack.yaml"), "--detach"], tmp_path, 300)
    assert up.returncode == 0, up.stderr[-3000:]
    state_path = tmp_path / "runs" / "updown" / "stack.json"
    state = json.loads(state_path.read_text())
    names = [p["name"] for p in state["processes"]]
    assert names == ["redis", "reward", "rollout-0", "trainer"]
    pids = [p["pid"] for p in state["processes"]]
    assert _ours(state["processes"]) == pids

    status = _run(["status"], tmp_path, 60)
    assert status.returncode == 0, status.stderr[-3000:]
    shown = json.loads(status.stdout)
    assert [p["alive"] for p in shown["processes"]] == [True] * 4
    assert shown["trainer"]["phase"] in ("starting", "grpo", "eval")
    books = shown["trainer"]  # the groups beside the books too, not only the tasks in them
    assert all(isinstance(books[k], int) for k in ("tasks_published", "groups_trained", "duplicates", "superseded"))
    assert set(shown["queues"]) == {"tasks", "groups"}
    assert [r["replica_id"] for r in shown["replicas"]] == ["updown-rollout-0"]

    again = _run(["up", "-c", str(tmp_path / "stack.yaml"), "--detach"], tmp_path, 60)
    assert again.returncode == 2 and "already up" in again.stderr

    down = _run(["down"], tmp_path, 120)
    assert down.returncode == 0, down.stderr[-3000:]
    assert "trainer" in down.stdout and "redis" in down.stdout
    assert _ours(state["processes"]) == []
    assert _descendants_of_run(tmp_path / "runs" / "updown") == []
    assert not state_path.exists()
    assert _run(["status"], tmp_path, 60).returncode == 1  # nothing left to show


def test_status_keeps_the_trainer_section_after_it_exits(tmp_path: Path) -> None:
    """A detached run whose trainer has finished: `grpo status` still says where it ended (not a vanished section)."""
    config = _stack_config(tmp_path, "ended", 2)
    up = _run(["up", "-c", str(config), "--detach"], tmp_path, 300)
    assert up.returncode == 0, up.stderr[-3000:]
    state = json.loads((tmp_path / "runs" / "ended" / "stack.json").read_text())
    trainer = next(p for p in state["processes"] if p["name"] == "trainer")
    try:
        deadline = time.monotonic() + 240
        while _ours([trainer]) and time.monotonic() < deadline:
            time.sleep(1)
        assert not _ours([trainer]), "the 2-step trainer did not finish in 240 s"
        status = _run(["status"], tmp_path, 60)
        assert status.returncode == 0, status.stderr[-3000:]
        shown = json.loads(status.stdout)
        assert [p["alive"] for p in shown["processes"]] == [True, True, True, False]
        assert shown["trainer"]["phase"] == "exited" and shown["trainer"]["alive"] is False
        assert shown["trainer"]["finished"] is True and shown["trainer"]["step"] == 2
    finally:
        down = _run(["down"], tmp_path, 120)
    assert down.returncode == 0, down.stderr[-3000:]
    assert _ours(state["processes"]) == []


def test_up_exits_with_the_trainers_code_when_its_run_fails(tmp_path: Path) -> None:
    """Attached `grpo up` whose trainer fails after it is healthy (it needs 2 live replicas, the stack has 1): an
    ERROR line naming the trainer and its log, the trainer's exit code, and the whole stack stopped."""
    config = _stack_config(tmp_path, "crash", 100000)
    data = yaml.safe_load(config.read_text())
    # Long enough for the replica to be healthy first, so the failure comes while `up` supervises, not starts.
    data["trainer"].update(min_replicas=2, replica_wait_s=20)
    config.write_text(yaml.safe_dump(data))

    up = _run(["up", "-c", str(config)], tmp_path, 300)
    assert up.returncode == 1, up.stderr[-3000:]
    log_path = tmp_path / "runs" / "crash" / "logs" / "trainer.log"
    error = next((line for line in up.stderr.splitlines() if " ERROR grpo.cli: trainer (pid " in line), "")
    assert f"exited with code 1; last log lines of {log_path}" in error, up.stderr[-3000:]
    assert "while starting" not in error  # else this test did not reach the supervising loop
    assert "only 1 live rollout replica(s)" in up.stderr  # the tail of the trainer's log
    assert not (tmp_path / "runs" / "crash" / "stack.json").exists()
    assert _descendants_of_run(tmp_path / "runs" / "crash") == []
