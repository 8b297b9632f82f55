"""Rejection sampling (R1's stage 3) through the real services: a private Redis, the reward service, a rollout replica
(hf engine) and the trainer as a process.

The sampled model answers easy sums, sometimes wrongly (tests/support/answer_model.py). The replica starts on the
untrained tiny model: only the weights the trainer pushes can make its answers right, so right answers in the data
also show that the stage's model reached the replica.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from grpo.common.reward_client import RewardClient
from grpo.common.tiny_model import cache_root
from grpo.trainer.checkpoint import checkpoint_step, latest_checkpoint
from grpo.trainer.data import load_rows
from grpo.trainer.ledger import read_ledger
from grpo.trainer.order import DataCursor, take
from grpo.trainer.pusher import replica_status
from tests.support.answer_model import answer_model_path, rows
from tests.support.trainer_proc import read_metrics, run_trainer, start_trainer, trainer_config, write_rows

pytestmark = pytest.mark.slow

PROMPTS, PER_STEP, SAMPLES, KEEP = 7, 2, 4, 2  # 7 of the 8 rows: 4 steps, the last one publishes 1 prompt


@pytest.fixture(scope="module")
def answer_model() -> Path:
    return answer_model_path(cache_root() / "test-models")


def rs_config(
    tmp: Path, run: str, redis_url: str, model: Path, per_step: int = PER_STEP, checkpoint_every: int = 2
) -> Path:
    data = write_rows(tmp / "prompts.jsonl", rows())
    return trainer_config(
        tmp, run, redis_url, mode="rejection_sampling", model=str(model), train_data=str(data), rs_prompts=PROMPTS,
        rs_samples=SAMPLES, rs_keep_per_prompt=KEEP, rs_shortest_first=True, rs_filters=["truncated"],
        prompts_per_step=per_step, max_new_tokens=24, stop=[], overlong_soft_penalty=False,
        reward_weights={"math": 1.0}, checkpoint_every=checkpoint_every,
    )  # fmt: skip


def rows_past_checkpoint(out: Path) -> int | None:
    """The step of the latest checkpoint while data.jsonl holds rows written after it (else None)."""
    checkpoint = latest_checkpoint(out / "checkpoints")
    if checkpoint is None:
        return None
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())["learner"]["rejection_sampling"]
    except (OSError, ValueError, KeyError):
        return None  # pruned or being replaced right now
    return checkpoint_step(checkpoint) if (out / "data.jsonl").stat().st_size > state["data_bytes"] else None


def data_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]


def assert_stage_output(out: Path, run: str, model: Path, reward_addr: str) -> list[dict[str, Any]]:
    """What every finished stage must show: rows verified by the reward service, their provenance, the summary equal
    to the file, and the task books balanced with every prompt sampled once."""
    written = data_rows(out)
    assert written, "no row kept"
    # Every answer kept is right, as the reward service judges it again now.
    with RewardClient(reward_addr) as client:
        results = client.score([{"id": r["id"], "prompt": r["prompt"], "completion": r["response"],
                                 "checks": r["checks"]} for r in written])  # fmt: skip
    assert [res.components["math"].score for res in results] == [1.0] * len(written), written
    by_id = {r["id"]: r for r in rows()}
    for r in written:
        p = r["provenance"]
        assert r["id"] == f"{p['prompt_id']}#{p['sample_index']}" and 0 <= p["sample_index"] < SAMPLES
        assert r["prompt"] == by_id[p["prompt_id"]]["prompt"] and r["task_type"] == "math"
        assert r["checks"] == {"math": {"gold": by_id[p["prompt_id"]]["gold"]}}
        assert p["task_id"].startswith(f"{run}-e0-") and p["model"] == str(model) and p["stage"] == 0
        assert p["reward"] == 1.0 and p["components"] == {"math": 1.0} and 0 < p["tokens"] <= 24
    assert len({(r["provenance"]["prompt_id"], r["provenance"]["sample_index"]) for r in written}) == len(written)
    per_prompt = Counter(r["provenance"]["prompt_id"] for r in written)
    assert max(per_prompt.values()) <= KEEP
    for prompt_id in per_prompt:  # de-duplicated, shortest first
        answers = [r for r in written if r["provenance"]["prompt_id"] == prompt_id]
        assert len({" ".join(r["response"].split()) for r in answers}) == len(answers), answers
        assert [r["provenance"]["tokens"] for r in answers] == sorted(r["provenance"]["tokens"] for r in answers)
    # The summary is the file's.
    summary = json.loads((out / "rs_summary.json").read_text())
    assert summary["prompts"] == PROMPTS and summary["sampled"] == PROMPTS * SAMPLES
    assert summary["kept"] == len(written)
    assert summary["sampled"] == summary["kept"] + sum(summary["rejected"].values())
    histogram = Counter(per_prompt.values())
    histogram[0] = PROMPTS - len(per_prompt)
    assert summary["kept_per_prompt"] == {str(k): v for k, v in sorted(histogram.items()) if v}
    assert summary["prompts_with_none"] == histogram[0] == len(summary["prompts_with_none_ids"])
    assert set(summary["rejected"]) <= {"failed component math", "duplicate", "over quota", "filter truncated"}
    # The books: every task once, used or dropped, none in flight; the ledger names each of the 7 draws once.
    state = json.loads((latest_checkpoint(out / "checkpoints") / "trainer_state.json").read_text())["inflight"]
    assert state["in_flight"] == [] and state["published"] == state["trained"] + sum(state["dropped"].values())
    assert state["published"] == PROMPTS == state["trained"]
    expected, _ = take(DataCursor(seed=0), len(rows()), PROMPTS)
    ledger = read_ledger(out / "ledger")
    assert sorted(e["task_id"] for e in ledger) == sorted(f"{run}-{key}" for key, _ in expected)
    assert read_metrics(out)[-1]["tasks/balanced"] == 1.0
    # An SFT stage reads the file as it is.
    assert len(load_rows(out / "data.jsonl", need_response=True)) == len(written)
    return written


def test_rejection_sampling_keeps_verified_answers_with_provenance(
    tmp_path: Path, redis_url: str, rollout_for: Any, live_reward: Any, answer_model: Path
) -> None:
    rollout = rollout_for("rs")
    config = rs_config(tmp_path, "rs", redis_url, answer_model)
    run_trainer(config, tmp_path / "trainer.log")
    out = tmp_path / "out"
    written = assert_stage_output(out, "rs", answer_model, live_reward.grpc_addr)
    # The replica sampled with the stage's model, pushed under a version newer than the one it started with.
    assert (
        {r["provenance"]["model_version"] for r in written} == {replica_status(rollout.address).weight_version} == {1}
    )
    assert not (out / "final").exists()  # the stage's product is its data, not a model
    # The run's summary names the stage's outcome (a run of one stage).
    (stage,) = json.loads((out / "summary.json").read_text())["stages"]
    summary = json.loads((out / "rs_summary.json").read_text())
    assert stage["mode"] == "rejection_sampling" and stage["kept"] == len(written)
    assert stage["outcome"] == (f"kept {len(written)} of {PROMPTS * SAMPLES} samples "
                                f"({summary['prompts_with_none']} of {PROMPTS} prompts with none)")  # fmt: skip
    # Started again, the finished stage does nothing and keeps its data.
    before = (out / "data.jsonl").read_bytes()
    run_trainer(config, tmp_path / "again.log")
    assert "has finished rejection sampling" in (tmp_path / "again.log").read_text()
    assert (out / "data.jsonl").read_bytes() == before


@pytest.mark.parametrize("after", [0, 3])
def test_rejection_sampling_killed_mid_stage_resumes_with_each_answer_once(
    tmp_path: Path, redis_url: str, rollout_for: Any, live_reward: Any, answer_model: Path, after: int
) -> None:
    """SIGKILL once data.jsonl holds rows written after the checkpoint of step `after` (one prompt a step, a checkpoint
    every 3 steps; step 0's is the one written right after the model was pushed): the restart cuts those rows and
    selects them again from the groups Redis still holds for it, made by the first push of the same model."""
    run = f"rsk{after}"
    rollout_for(run)
    config = rs_config(tmp_path, run, redis_url, answer_model, per_step=1, checkpoint_every=3)
    out, log = tmp_path / "out", tmp_path / "trainer.log"
    proc = start_trainer(config, log)
    try:
        deadline = time.monotonic() + 120  # a step takes ~0.1 s here: poll fast
        while (killed_after := rows_past_checkpoint(out)) is None or killed_after < after:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert killed_after == after and not (out / "rs_summary.json").exists()
        proc = start_trainer(config, log)
        assert proc.wait(timeout=120) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert f"resumed at step {after}" in text and "data.jsonl cut back from" in text
    written = assert_stage_output(out, run, answer_model, live_reward.grpc_addr)
    # The restart pushed the model again under a new version; the groups sampled before it are used as they were,
    # none dropped as stale (assert_stage_output: every task used).
    assert {r["provenance"]["model_version"] for r in written} == {1, 2}
    assert [r["step"] for r in read_metrics(out) if r["step"] > 0] == list(range(1, PROMPTS + 1))  # each step once


@pytest.mark.deepspeed
def test_on_two_ranks_rank0_samples_alone_and_the_follower_waits_for_it(
    tmp_path: Path, redis_url: str, rollout_for: Any, answer_model: Path
) -> None:
    """torchrun with 2 ranks, a rejection-sampling stage, then SFT on its data with ZeRO-2: the follower skips the
    sampling (no collective while rank 0 samples) and takes part in the SFT stage."""

    rollout_for("rsds")
    data = write_rows(tmp_path / "prompts.jsonl", rows())
    stages = [
        {"mode": "rejection_sampling", "model": str(answer_model), "rs_samples": SAMPLES, "rs_keep_per_prompt": KEEP},
        {"mode": "sft", "model": "base", "train_data": "previous", "steps": 2, "prompts_per_step": 4},
    ]
    config = trainer_config(tmp_path, "rsds", redis_url, train_data=str(data), stages=stages, stop=[],
                            overlong_soft_penalty=False, reward_weights={"math": 1.0}, max_new_tokens=24,
                            backend="deepspeed", zero_stage=2, prompts_per_step=PER_STEP)  # fmt: skip
    log = tmp_path / "trainer.log"
    run_trainer(config, log, 400, ranks=2)
    out = tmp_path / "out"
    kept = len(data_rows(out / "stage-1-rejection_sampling"))
    assert kept > 0
    summary = json.loads((out / "summary.json").read_text())
    assert [s["mode"] for s in summary["stages"]] == ["rejection_sampling", "sft"]
    assert summary["stages"][0]["kept"] == kept
    assert (out / "stage-2-sft" / "final" / "model.safetensors").is_file()
    text = log.read_text()
    assert "rank 0 runs rejection-sampling stage 1 alone; waiting for it" in text and "rank 1 following rank 0" in text
