"""Difficulty buckets in the run's loop (GrpoRun._collect and the publisher) against a real Redis and the tiny model:
groups written into the run's groups stream as a replica writes them; the buckets they put their rows in, the draws
the next publications pass over, the step's buckets/* metrics, and the books staying balanced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.publisher import position_of
from grpo.trainer.run import GrpoRun
from grpo.v1 import queue_pb2

N_ROWS = 6


@pytest.fixture
def run(tmp_path: Path, redis_url: str) -> Iterator[GrpoRun]:
    torch.set_num_threads(1)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i} + 1?", "gold": str(i + 1)}) + "\n"
                            for i in range(N_ROWS)))  # fmt: skip
    settings = TrainerSettings(
        run_id="buckets", redis_url=redis_url, model=str(ensure_tiny_model()), train_data=data,
        output_dir=tmp_path / "out", group_size=4, prompts_per_step=N_ROWS, skip_zero_variance=True, max_staleness=0,
        reward_weights={"math": 1.0}, beta=0.0, skip_solved_after=1, set_aside_after=1, revisit_after_epochs=1,
    )  # fmt: skip
    grpo = GrpoRun(settings, RunControl("buckets", settings.steps))
    try:
        yield grpo
    finally:
        grpo.close()


def _write_group(run: GrpoRun, tid: str, correct: list[float | None]) -> None:
    record = queue_pb2.GroupRecord(group_id=tid, task_id=tid, status="ok", weight_version=run.version,
                                   policy_version=run.version, replica_id="r1")  # fmt: skip
    record.prompt_token_ids.extend([5, 6, 7])
    for c in correct:
        sample = record.samples.add(reward=float(c or 0.0))
        if c is not None:
            sample.components["math"].score = c
        sample.completion.token_ids.extend([8, 9, 10])
    run.queue.client.xadd(run.queue.groups_key, {"data": record.SerializeToString()})


def test_solved_and_unsolved_rows_are_passed_over_the_next_epoch_and_the_metrics_say_so(run: GrpoRun) -> None:
    """Epoch 0: rows solved by every sample (easy) and by none (hard) after one group each, the rest half solved.
    Epoch 1 publishes only the half-solved rows, and passes the others over; epoch 2 draws every row again."""
    ids = run.publisher.publish(N_ROWS, run.version, 0, run.acct)
    run.acct.batches_published = 1
    rows = {tid: run.publisher.row_index(tid) for tid in ids}
    outcome = {0: [1.0] * 4, 1: [1.0] * 4, 2: [0.0] * 4, 3: [1.0, 0.0, 1.0, 0.0], 4: [0.0, 1.0, 0.0, 0.0],
               5: [1.0, 0.0, 0.0, 0.0]}  # fmt: skip
    for tid in ids:
        _write_group(run, tid, outcome[rows[tid]])
    kept, metrics = run._collect()
    assert kept is not None and sorted(rows[r.group_id] for _, r in kept) == [3, 4, 5]
    assert {k: metrics[f"buckets/{k}"] for k in ("easy", "medium", "hard", "unseen", "skipped")} == {
        "easy": 2, "medium": 3, "hard": 1, "unseen": 0, "skipped": 0,
    }  # fmt: skip
    assert metrics["buckets/unseen/accuracy"] == pytest.approx((4 + 4 + 0 + 2 + 1 + 1) / 24)  # drawn while unseen
    for _, record in kept:  # _train settles the kept groups' tasks; no update is needed here
        run.acct.resolve(record.group_id, "trained")

    # epoch 1: three rows are set aside, so six publications take epoch 1's three others and epoch 2's first three
    later = run.publisher.publish(N_ROWS, run.version, 1, run.acct)
    epoch1 = [run.publisher.row_index(t) for t in later if position_of(t)[0] == 1]
    assert sorted(epoch1) == [3, 4, 5]
    assert len([t for t in later if position_of(t)[0] == 2]) == 3  # set aside in epoch 0: back in epoch 2
    assert run.publisher.take_skipped() == 3 and run.publisher.take_skipped() == 0
    assert run.acct.published == 2 * N_ROWS and run.acct.balanced()  # skipped draws made no task
    state = run.publisher.difficulty.to_state() if run.publisher.difficulty else {}
    assert state["records"][str(2)]["unsolved_streak"] == 1 and state["records"][str(0)]["aside_epoch"] == 0
