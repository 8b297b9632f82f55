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


def _stack_config(tmp_path: Path, run_id: str, steps: int, colocate: bool = False) -> Path:
    """The demo's tiny model and task behind a stack config with a trainer of `steps` steps (colocated: the trainer
    hosts the one replica)."""
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
    if colocate:
        config["colocate"] = True
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("colocate", [False, True], ids=["separate", "colocated"])
def test_up_status_down_leaves_no_process(tmp_path: Path, colocate: bool) -> None:
    """Colocated (`colocate: true`), no rollout process starts: the trainer's own replica serves the run."""
    _stack_config(tmp_path, "updown", 100000, colocate)

    up = _run(["up", "-c", str(tmp_path / "stack.yaml"), "--detach"], tmp_path, 300)
    assert up.returncode == 0, up.stderr[-3000:]
    state_path = tmp_path / "runs" / "updown" / "stack.json"
    state = json.loads(state_path.read_text())
    names = [p["name"] for p in state["processes"]]
    assert names == ["redis", "reward", *([] if colocate else ["rollout-0"]), "trainer"]
    pids = [p["pid"] for p in state["processes"]]
    assert _ours(state["processes"]) == pids

    deadline = time.monotonic() + 120
    while True:  # the trainer is healthy before its colocated replica has registered (it loads the model first)
        status = _run(["status", "--json"], tmp_path, 60)
        assert status.returncode == 0, status.stderr[-3000:]
        shown = json.loads(status.stdout)
        if shown["replicas"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert [p["alive"] for p in shown["processes"]] == [True] * len(names)
    assert shown["trainer"]["phase"] in ("starting", "grpo", "eval")
    books = shown["trainer"]  # the groups beside the books too, not only the tasks in them
    assert all(isinstance(books[k], int) for k in ("tasks_published", "groups_trained", "duplicates", "superseded"))
    assert set(shown["queues"]) == {"tasks", "groups"}
    assert [r["replica_id"] for r in shown["replicas"]] == ["updown-colocated" if colocate else "updown-rollout-0"]

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
        status = _run(["status", "--json"], tmp_path, 60)
        assert status.returncode == 0, status.stderr[-3000:]
        shown = json.loads(status.stdout)
        assert [p["alive"] for p in shown["processes"]] == [True, True, True, False]
        assert shown["trainer"]["phase"] == "finished" and shown["trainer"]["alive"] is False
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


FILES = Path(__file__).resolve().parents[2] / "k8s" / "grpo" / "files"


def _head(source: Path, target: Path, rows: int) -> str:
    target.write_text("".join(source.read_text().splitlines(keepends=True)[:rows]))
    return str(target)


def _staged_config(tmp_path: Path, run_id: str) -> Path:
    """R1's two stages on the built-in tiny model and the shipped addition task, each as short as a stage can be: 2
    SFT steps, then 2 GRPO steps with the baseline and the final evaluation (the summary's before and after)."""
    trainer = {
        "train_data": _head(FILES / "train.jsonl", tmp_path / "train.jsonl", 16),
        "eval_data": _head(FILES / "eval.jsonl", tmp_path / "eval.jsonl", 4), "eval_size": 4,
        "steps": 2, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8, "torch_threads": 1, "lr": 1e-5,
        "skip_zero_variance": False,
        "stages": [{"mode": "sft", "train_data": _head(FILES / "sft.jsonl", tmp_path / "sft.jsonl", 16), "steps": 2,
                    "prompts_per_step": 8, "micro_batch_size": 8}, {"mode": "grpo"}],
    }  # fmt: skip
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump({"run_id": run_id, "reward": {"workers": 1}, "rollout": {"torch_threads": 1},
                                    "trainer": trainer}))  # fmt: skip
    return path


def _wait_for_the_trainer(tmp_path: Path, run_id: str, timeout: float = 300) -> None:
    state = json.loads((tmp_path / "runs" / run_id / "stack.json").read_text())
    trainer = next(p for p in state["processes"] if p["name"] == "trainer")
    deadline = time.monotonic() + timeout
    while _ours([trainer]) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _ours([trainer]), f"the trainer did not end in {timeout:.0f} s"


def test_up_shows_progress_and_ends_with_the_result(tmp_path: Path) -> None:
    """Attached `grpo up` was silent until "the trainer exited with code 0": it shows the demo's progress line (off a
    terminal) and ends with the demo's closing lines, the accuracies and where the summary and report are."""
    up = _run(["up", "-c", str(_staged_config(tmp_path, "shown"))], tmp_path, 400)
    assert up.returncode == 0, up.stderr[-3000:]
    progress = [line for line in up.stderr.splitlines() if "phase: " in line and " | step: " in line]
    assert progress, up.stderr[-3000:]
    run_dir = (tmp_path / "runs" / "shown").resolve()
    assert "held-out accuracy: " in up.stdout and "after 2 GRPO steps" in up.stdout, up.stdout
    assert (
        f"summary:     {run_dir / 'summary.json'}" in up.stdout and f"report:      {run_dir / 'report.md'}" in up.stdout
    )
    assert "exited with code 0" not in up.stderr


def test_status_of_a_finished_staged_run(tmp_path: Path) -> None:
    """After SFT → GRPO, `grpo status` said `{'phase': 'exited', 'finished': False}` and no step: it says finished,
    the last stage and step, and the summary's accuracies; by default in a short view, `--json` the raw one."""
    up = _run(["up", "-c", str(_staged_config(tmp_path, "staged")), "--detach"], tmp_path, 300)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        _wait_for_the_trainer(tmp_path, "staged")
        raw = _run(["status", "--json"], tmp_path, 60)
        assert raw.returncode == 0, raw.stderr[-3000:]
        trainer = json.loads(raw.stdout)["trainer"]
        assert (trainer["phase"], trainer["finished"], trainer["alive"]) == ("finished", True, False), trainer
        assert (trainer["stage"], trainer["step"], trainer["total_steps"]) == ("2/2 grpo", 2, 2), trainer
        summary = json.loads(raw.stdout)["summary"]
        assert summary["eval_accuracy_before"] is not None and summary["eval_accuracy_after"] is not None
        assert summary["path"] == str((tmp_path / "runs" / "staged" / "summary.json").resolve())
        view = _run(["status"], tmp_path, 60)
        assert view.returncode == 0, view.stderr[-3000:]
        lines = view.stdout.splitlines()
        assert len(lines) <= 14, view.stdout
        assert any(line.split()[:2] == ["phase", "finished"] for line in lines), view.stdout
        assert "stage 2/2 grpo" in view.stdout and "step 2 / 2" in view.stdout, view.stdout
        assert "held-out accuracy" in view.stdout and "after 2 GRPO steps" in view.stdout, view.stdout
        assert "{" not in view.stdout  # no raw JSON
    finally:
        down = _run(["down"], tmp_path, 120)
    assert down.returncode == 0, down.stderr[-3000:]


def test_status_of_a_detached_run_whose_trainer_failed(tmp_path: Path) -> None:
    """After a crash in `--detach` mode `grpo status` said `error: ''`, the reason only in trainer.log: it says
    failed, with the error's last line from that log."""
    config = _stack_config(tmp_path, "broke", 100000)
    data = yaml.safe_load(config.read_text())
    data["trainer"].update(min_replicas=2, replica_wait_s=20)  # fails once it has waited 20 s for a second replica
    config.write_text(yaml.safe_dump(data))
    up = _run(["up", "-c", str(config), "--detach"], tmp_path, 300)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        _wait_for_the_trainer(tmp_path, "broke")
        raw = _run(["status", "--json"], tmp_path, 60)
        trainer = json.loads(raw.stdout)["trainer"]
        assert (trainer["phase"], trainer["finished"]) == ("failed", False), trainer
        assert "only 1 live rollout replica(s)" in trainer["error"] and "\n" not in trainer["error"], trainer
        view = _run(["status"], tmp_path, 60)
        error = next((line for line in view.stdout.splitlines() if line.startswith("error")), "")
        assert "only 1 live rollout replica(s)" in error, view.stdout
        assert "trainer.log" in view.stdout  # where the rest is
    finally:
        down = _run(["down"], tmp_path, 120)
    assert down.returncode == 0, down.stderr[-3000:]


def test_up_exits_2_when_the_trainer_refuses_its_data(tmp_path: Path) -> None:
    """A row the trainer refuses at start-up (its own exit 2, naming file and line) is a usage error of `grpo up`
    too: exit 2, as a script or CI job tells bad input from a failed run (it exited 1)."""
    config = _stack_config(tmp_path, "baddata", 2)
    data = Path(yaml.safe_load(config.read_text())["trainer"]["train_data"])
    data.write_text(data.read_text() + '{"prompt": "1+1=", "checks": {"nope": {}}}\n')

    up = _run(["up", "-c", str(config)], tmp_path, 300)
    assert up.returncode == 2, up.stderr[-3000:]
    assert "while starting" in up.stderr and str(data) in up.stderr, up.stderr[-3000:]
    assert _descendants_of_run(tmp_path / "runs" / "baddata") == []
