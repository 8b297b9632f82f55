"""Colocated mode (grpo.trainer.colocated): the trainer process hosts a rollout replica on the model it trains.
The real trainer, Redis and reward service, and no rollout process at all; the resume after SIGKILL runs in both
modes in test_trainer_service.py, the trainer's SIGKILL under faults in tests/faults/test_trainer_faults.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from grpo.common.registry import ReplicaInfo, ReplicaRegistry
from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.weights.codec import weights_checksum
from tests.support.trainer_proc import (
    colocated,
    read_metrics,
    start_trainer,
    trainer_config,
    wait_for,
    write_data,
)

pytestmark = pytest.mark.slow


def live(redis_url: str, run: str) -> list[ReplicaInfo]:
    client = redis.Redis.from_url(redis_url)
    try:
        return ReplicaRegistry(client, run).live_replicas()
    finally:
        client.close()


def load_weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_a_colocated_trainer_generates_trains_and_evaluates_with_exact_books(
    tmp_path: Path, redis_url: str, live_reward: Any
) -> None:
    """One process: its replica registers like any other, generates every group and evaluation from the policy being
    trained (sampler_exact: its log-probs are the trainer's π_old), and no weight is ever sent."""
    eval_data = write_data(tmp_path / "eval.jsonl", 2, offset=100)
    config = trainer_config(tmp_path, "colo", redis_url, steps=4, checkpoint_every=2, eval_data=str(eval_data),
                            eval_every=2, sampler_exact=True, max_staleness=1,
                            colocate=colocated(live_reward.grpc_addr))  # fmt: skip
    log = tmp_path / "trainer.log"
    proc = start_trainer(config, log)
    try:  # while it runs: the replica is in the run's registry, under the trainer's own pid
        replicas = wait_for(lambda: live(redis_url, "colo"), 120, "the replica",
                            proc, log)  # fmt: skip
        assert [r.replica_id for r in replicas] == ["colo-colocated"], replicas
        assert proc.wait(timeout=150) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    out = tmp_path / "out"
    before, after = load_weights(ensure_tiny_model()), load_weights(out / "final")
    assert all(not before[name].equal(after[name]) for name in before)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    trained = [r for r in rows if "train/loss" in r]
    assert trained and all(r["train/old_logp_from_sampler"] == 1.0 for r in trained)
    # No weight transfer: the replica holds each version by sharing the module, never by a push.
    assert all(r["push/ok"] == r["push/failed"] == r["push/bytes_sent"] == 0 for r in rows[1:]), rows
    assert rows[-1]["policy_version"] > 1 + len(trained) - 1
    assert all(r["tasks/balanced"] == 1.0 for r in rows[1:])
    last = rows[-1]
    assert last["tasks/published"] == last["tasks/trained"] + sum(
        last[f"tasks/dropped/{k}"] for k in ("zero_variance", "stale", "failed", "unscored", "timeout")
    )
    assert last["tasks/dropped/stale"] == 0 and last["staleness/max"] <= 1
    evals = [r for r in rows if "eval/completed" in r]
    assert [r["step"] for r in evals] == [0, 2, 4] and all(r["eval/completed"] == 2 for r in evals)
    text = log.read_text()
    assert "colocated rollout replica colo-colocated" in text and "pushed version" not in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grpo_steps"] == 4
    assert weights_checksum(after) != weights_checksum(before)


def test_a_push_to_a_colocated_replica_is_refused(tmp_path: Path, redis_url: str, live_reward: Any) -> None:
    """Its weights are the trainer's tensors: another trainer's push must not write into them. Refused whole
    (FAILED_PRECONDITION, saying why), and the run it serves goes on."""
    from grpo.trainer.pusher import ReplicaTarget, push_to_replicas, replica_status

    config = trainer_config(tmp_path, "colo2", redis_url, steps=200, colocate=colocated(live_reward.grpc_addr),
                            when_done="serve")  # fmt: skip
    log = tmp_path / "trainer.log"
    proc = start_trainer(config, log)
    try:
        (replica,) = wait_for(lambda: live(redis_url, "colo2"), 120,
                              "the replica", proc, log)  # fmt: skip
        weights = load_weights(ensure_tiny_model())
        (result,) = push_to_replicas([ReplicaTarget(replica.replica_id, replica.address, 0)], weights, 10**6)
        assert not result.ok and "colocated with its trainer" in result.error, result
        status = replica_status(replica.address)
        assert status.weight_version < 10**6
        wait_for(lambda: any(r["step"] >= 2 for r in read_metrics(tmp_path / "out")), 120, "step 2", proc, log)
        # After an update it names its version, not a sha256 of the learner's tensors (nothing travels to check).
        now = replica_status(replica.address)
        assert now.weight_version > 0 and now.weight_checksum == f"in-process-v{now.weight_version}", now
        assert httpx.get(f"http://127.0.0.1:{json.loads(config.read_text())['http_port']}/healthz").status_code == 200
    finally:
        proc.kill()
        proc.wait(10)


def test_colocated_settings_are_checked_at_start_up(tmp_path: Path, redis_url: str) -> None:
    """What colocated mode cannot do is said before any model loads: one line, exit code 2."""
    cases = {
        "backend": ({"colocate": {"reward_addr": "127.0.0.1:1"}, "backend": "deepspeed"}, "use backend torch"),
        "reward": ({"colocate": {}}, "colocate.reward_addr is required"),
        "engine": ({"colocate": {"reward_addr": "127.0.0.1:1", "engine": "vllm"}}, "hf engine"),
        "model": ({"colocate": {"reward_addr": "127.0.0.1:1", "model": "x"}}, "model are the trainer's own"),
        "typo": ({"colocate": {"reward_addr": "127.0.0.1:1", "heartbeat_s": -1}}, "colocate.heartbeat_s"),
    }
    for name, (extra, said) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        proc = start_trainer(trainer_config(folder, "bad", redis_url, **extra), folder / "trainer.log")
        assert proc.wait(timeout=60) == 2
        text = (folder / "trainer.log").read_text()
        assert said in text and "Traceback" not in text, (name, text[-2000:])
    # The same setting from the environment, as JSON (a container's way).
    env = {**os.environ, "GRPO_TRAINER_COLOCATE": '{"heartbeat_s": 1}', "OMP_NUM_THREADS": "1"}
    config = trainer_config(tmp_path, "bad", redis_url)
    done = subprocess.run([sys.executable, "-m", "grpo.trainer", "--config", str(config)], env=env, text=True,
                          capture_output=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and "colocate.reward_addr is required" in done.stderr, done.stderr[-2000:]


def test_a_colocated_lora_run_generates_through_its_adapters(tmp_path: Path, redis_url: str, live_reward: Any) -> None:
    """With LoRA the learner's module is the peft model: the replica samples through the adapters as they train
    (exact: its log-probs are the trainer's π_old), and the final model is the merged one."""
    config = trainer_config(tmp_path, "colora", redis_url, steps=3, lora_rank=4, lora_alpha=8, lr=1e-2,
                            sampler_exact=True, colocate=colocated(live_reward.grpc_addr))  # fmt: skip
    log = tmp_path / "trainer.log"
    proc = start_trainer(config, log)
    try:
        assert proc.wait(timeout=200) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    rows = read_metrics(tmp_path / "out")
    trained = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3] and trained
    assert all(r["train/old_logp_from_sampler"] == 1.0 and r["push/bytes_sent"] == 0 for r in trained)
    # On-policy (max_staleness 0): π_θ/π_old is 1 unless the replica sampled from other weights or another mode.
    assert all(abs(r["train/ratio_max"] - 1) < 1e-4 and abs(r["train/ratio_min"] - 1) < 1e-4 for r in trained), trained
    before, after = load_weights(ensure_tiny_model()), load_weights(tmp_path / "out" / "final")
    assert set(before) == set(after)  # merged, under the base names
    assert any(not before[k].equal(after[k]) for k in before)
