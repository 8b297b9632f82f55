"""`grpo up` checks every model a section names before it starts anything, as each service does at start-up: a
missing folder is one line per setting and exit 2, with no process started (docs/demo.md's example stack)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

# docs/demo.md's example stack, as a new user copies it: the model folder is not on this machine.
DOCS_STACK = """\
run_id: myrun
redis_url: null
replicas: 2
reward: {workers: 4}
rollout: {model: /models/Qwen2.5-0.5B-Instruct, engine: vllm}
trainer: {model: /models/Qwen2.5-0.5B-Instruct, train_data: data/train.jsonl, steps: 500}
"""
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _up(tmp_path: Path, config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "grpo.cli", "--runs-dir", str(tmp_path / "runs"), "up", "-c", str(config)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
                          env={**os.environ, **(env or {})})  # fmt: skip


def _started_anything(tmp_path: Path) -> list[str]:
    """What `grpo up` left of a start: service logs, a state file, or a live process naming the run folder."""
    run_dir = tmp_path / "runs" / "myrun"
    logs = sorted(p.name for p in (run_dir / "logs").glob("*")) if (run_dir / "logs").is_dir() else []
    state = ["stack.json"] if (run_dir / "stack.json").exists() else []
    procs = [str(p.pid) for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    return logs + state + procs


def test_up_refuses_the_docs_stack_with_a_missing_model_before_starting(tmp_path: Path) -> None:
    config = tmp_path / "stack.yaml"
    config.write_text(DOCS_STACK)
    done = _up(tmp_path, config)
    assert done.returncode == 2, done.stderr[-3000:]
    for setting in ("rollout.model", "trainer.model"):  # both, not only the first service to fail
        assert f"{setting}: no such model folder or hub id: '/models/Qwen2.5-0.5B-Instruct'" in done.stderr, (
            done.stderr[-3000:]
        )
    assert "2 invalid setting(s), nothing started" in done.stderr
    assert _started_anything(tmp_path) == []


def test_every_model_is_checked_and_a_cached_hub_id_passes(tmp_path: Path) -> None:
    """A stage's own model is checked too; a hub id that check_model accepts (here from the offline cache) is no
    problem. The stack still has one bad key, so it stops at the check whatever the models."""
    hub = tmp_path / "hub" / "models--acme--tiny-lm"
    (hub / "snapshots" / COMMIT).mkdir(parents=True)
    (hub / "snapshots" / COMMIT / "config.json").write_text("{}")
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text(COMMIT)
    (tmp_path / "no-config").mkdir()  # a folder, but not a Hugging Face model folder
    config = tmp_path / "stack.yaml"
    config.write_text(
        "run_id: myrun\n"
        "reward: {wrokers: 2}\n"
        "rollout: {model: acme/tiny-lm}\n"
        "trainer:\n"
        "  model: acme/tiny-lm\n"
        "  train_data: t.jsonl\n"
        "  stages: [{mode: sft, model: no-config, train_data: s.jsonl}, {mode: grpo, model: acme/missing}]\n"
    )
    done = _up(tmp_path, config, {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert done.returncode == 2, done.stderr[-3000:]
    problems = [line.strip() for line in done.stderr.splitlines() if line.startswith("  ")]
    assert len(problems) == 3, done.stderr[-3000:]
    assert problems[0] == "reward.wrokers: unknown setting (did you mean workers?)"
    assert problems[1].startswith("trainer.stages[1].model: ") and "no-config has no config.json" in problems[1]
    assert problems[2].startswith("trainer.stages[2].model: 'acme/missing' is not a local folder")
    assert _started_anything(tmp_path) == []
