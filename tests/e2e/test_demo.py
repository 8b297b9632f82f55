"""`grpo demo` end to end on CPU: all services as real processes, reward rises, a report appears, nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache holding the quick profile's cold-start model, trained once here (in-process, the code the CLI
    runs) and reused by every demo below, as a user's second `grpo demo` reuses the first one's."""
    import torch

    from grpo.demo import live
    from grpo.demo.config import DemoConfig
    from grpo.demo.demo import prepare

    path, threads = tmp_path_factory.mktemp("cache"), torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRPO_CACHE_DIR", str(path))
        _, _, info = prepare(DemoConfig.quick(), tmp_path_factory.mktemp("cold-start"), live.ViewState(), lambda: None)
    torch.set_num_threads(threads)  # prepare() pins this process to one
    assert info["sft_reused"] is False and info["sft_steps"] > 0
    yield path


# As from a terminal: SIGINT not ignored (a background job of a non-interactive shell, e.g. CI, inherits SIG_IGN
# for SIGINT, and Python then never installs its KeyboardInterrupt handler). Reset by this trampoline before it
# execs the demo, not by a preexec_fn: that forks this process, and a fork of a process that has used gRPC can
# abort before its exec (grpc/grpc#43055; see test_demo_launcher.py).
SIGINT_AS_IN_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
)


def _demo(tmp_path: Path, cache: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "GRPO_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-m", "grpo.cli", "--runs-dir", str(tmp_path / "runs"), "demo", "--no-live", *args]
    return subprocess.Popen([sys.executable, "-c", SIGINT_AS_IN_A_TERMINAL, *cmd], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _leftovers(run_dir: Path, state: dict[str, object] | None) -> list[str]:
    """Recorded PIDs still running their command, plus any process whose command line names the run folder."""
    found = []
    for p in (state or {}).get("processes", []):  # type: ignore[union-attr]
        try:
            proc = psutil.Process(p["pid"])
            if proc.status() != psutil.STATUS_ZOMBIE and abs(proc.create_time() - p["create_time"]) < 0.01:
                found.append(f"{p['name']} pid {p['pid']}")
        except psutil.NoSuchProcess:
            pass
    for proc in psutil.process_iter(["cmdline", "pid"]):
        try:
            if any(str(run_dir) in part for part in proc.info["cmdline"] or []):
                found.append(f"pid {proc.info['pid']}: {' '.join(proc.info['cmdline'])[:200]}")
        except psutil.Error:
            pass
    return found


def _torch_in(pid: int) -> bool:
    """Whether the process has torch's library mapped (it imported torch)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def _driver_while_training(proc: subprocess.Popen[str], run_dir: Path) -> tuple[bool, float]:
    """Wait for the GRPO phase (stack.json), then (the demo's own process has torch loaded, its RSS in MB)."""
    deadline = time.monotonic() + 300
    while not (run_dir / "stack.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the services did not come up"
        time.sleep(0.5)
    return _torch_in(proc.pid), psutil.Process(proc.pid).memory_info().rss / 2**20


def test_demo_reward_rises_through_all_services(tmp_path: Path, cache: Path) -> None:
    started = time.monotonic()
    proc = _demo(tmp_path, cache, "--quick", "--run-id", "e2e")
    # The demo's own process holds no model while the services train (the cold start ran in a child): it held
    # ~590 MB through the GRPO phase when it ran SFT itself.
    torch_loaded, driver_mb = _driver_while_training(proc, tmp_path / "runs" / "e2e")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert not torch_loaded and driver_mb < 150, (torch_loaded, driver_mb)
    run_dir = tmp_path / "runs" / "e2e"
    summary = json.loads((run_dir / "summary.json").read_text())
    # The learning claim of this test: mean training reward over the last steps beats the first steps.
    assert summary["reward_last_steps"] > summary["reward_first_steps"], summary
    assert summary["grpo_steps"] == 40 and summary["eval_accuracy_before"] is not None
    assert summary["sft_reused"] is True and "reusing the SFT model of an earlier run" in out
    assert len(summary["eval_history"]) >= 3 and summary["eval_accuracy_after"] is not None
    for name in ("report.md", "reward.png", "accuracy.png", "kl.png", "length.png", "step_time.png"):
        assert (run_dir / name).stat().st_size > 0, name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert str(run_dir / "report.md") in out
    names = [p["name"] for p in json.loads((run_dir / "stack.json").read_text())["processes"]]
    assert names == ["redis", "reward", "rollout-0", "trainer"]  # separate real processes
    assert _leftovers(run_dir, json.loads((run_dir / "stack.json").read_text())) == []
    assert time.monotonic() - started < 600


def test_colocated_demo_trains_with_the_replica_inside_the_trainer(tmp_path: Path, cache: Path) -> None:
    """`grpo demo --colocate`: no rollout process; the trainer's own replica generates every group and evaluation."""
    proc = _demo(tmp_path, cache, "--quick", "--colocate", "--run-id", "colo")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    run_dir = tmp_path / "runs" / "colo"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["grpo_steps"] == 40 and summary["config"]["colocate"] is True
    assert summary["reward_last_steps"] > summary["reward_first_steps"], summary
    state = json.loads((run_dir / "stack.json").read_text())
    assert [p["name"] for p in state["processes"]] == ["redis", "reward", "trainer"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["push/bytes_sent"] == 0 for r in rows if "push/bytes_sent" in r)
    assert "colocated rollout replica colo-colocated" in (run_dir / "logs" / "trainer.log").read_text()
    assert _leftovers(run_dir, state) == []


def test_ctrl_c_stops_every_child(tmp_path: Path, cache: Path) -> None:
    proc = _demo(tmp_path, cache, "--quick", "--steps", "1000", "--run-id", "intr")
    run_dir = tmp_path / "runs" / "intr"
    deadline = time.monotonic() + 300
    while not (run_dir / "stack.json").exists():  # written once every service is healthy
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "services did not come up"
        time.sleep(0.5)
    state = json.loads((run_dir / "stack.json").read_text())
    assert len(_leftovers(run_dir, state)) >= 4  # the sanity check of the scan: all of them run now
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-4000:]
    assert _leftovers(run_dir, state) == []


def test_demo_with_step_rewards_trains_on_them(tmp_path: Path, cache: Path) -> None:
    """`grpo demo --preset prm`: the reward service scores each scratchpad column (rule column_addition), the
    rollout places the steps on tokens, the trainer turns them into per-token advantages, and the model learns."""
    proc = _demo(tmp_path, cache, "--quick", "--preset", "prm", "--steps", "20", "--run-id", "prm")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    run_dir = tmp_path / "runs" / "prm"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["grpo_steps"] == 20 and summary["config"]["preset"] == "prm"
    assert summary["eval_accuracy_after"] > summary["eval_accuracy_before"], summary["eval_history"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "train/loss" in r]
    assert len(trained) == 20 and all("train/step_score_mean" in r for r in trained)
    # Three columns and the answer for a well-formed answer: the steps are the scratchpad's, not one per sample.
    assert max(r["train/steps_per_completion"] for r in trained) > 3.0
    assert rows[-1]["tasks/dropped/unscored"] == 0 and rows[-1]["tasks/dropped/failed"] == 0


def test_demo_with_vineppo_estimates_values_through_the_rollout(tmp_path: Path, cache: Path) -> None:
    """`grpo demo --preset vineppo`: value tasks (continuations of each completion's prefixes at its scratchpad
    steps) go through Redis to the rollout and the reward service, every one is used or dropped with a reason,
    their cost is measured, and the policy is trained on the value differences."""
    proc = _demo(tmp_path, cache, "--quick", "--preset", "vineppo", "--steps", "4", "--run-id", "vine")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    run_dir = tmp_path / "runs" / "vine"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "train/loss" in r]
    assert len(trained) == 4
    last = trained[-1]
    dropped = sum(last[f"vine/value_dropped/{reason}"] for reason in ("failed", "unscored", "timeout", "stopped"))
    assert last["vine/value_tasks"] > 0 and last["vine/value_used"] + dropped == last["vine/value_tasks"]
    assert last["vine/value_used"] > 0.9 * last["vine/value_tasks"]  # nothing is slow or failing here
    assert all(r["vine/rollout_tokens_per_trained_token"] > 1.5 for r in trained)  # the price of the values
    assert rows[-1]["tasks/dropped/failed"] == 0 and rows[-1]["tasks/dropped/unscored"] == 0
