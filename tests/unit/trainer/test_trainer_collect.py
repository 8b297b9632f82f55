"""One step's collection (GrpoRun._collect) against a real Redis and the tiny model: groups written into the run's
groups stream as a replica writes them; what the step logs and what the status reports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.run import GrpoRun
from grpo.v1 import queue_pb2


@pytest.fixture
def run(tmp_path: Path, redis_url: str) -> Iterator[GrpoRun]:
    torch.set_num_threads(1)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i} + 1?", "gold": str(i + 1)}) + "\n"
                            for i in range(8)))  # fmt: skip
    settings = TrainerSettings(
        run_id="collect", redis_url=redis_url, model=str(ensure_tiny_model()), train_data=data,
        output_dir=tmp_path / "out", group_size=4, prompts_per_step=4, skip_zero_variance=True, max_staleness=0,
        reward_weights={"math": 1.0}, beta=0.0,
    )  # fmt: skip
    grpo = GrpoRun(settings, RunControl("collect", settings.steps))
    try:
        yield grpo
    finally:
        grpo.close()


def _write_group(run: GrpoRun, tid: str, correct: list[int]) -> None:
    record = queue_pb2.GroupRecord(group_id=tid, task_id=tid, status="ok", weight_version=run.version,
                                   policy_version=run.version, replica_id="r1")  # fmt: skip
    record.prompt_token_ids.extend([5, 6, 7])
    for c in correct:
        sample = record.samples.add(reward=float(c))
        sample.components["math"].score = float(c)
        sample.completion.token_ids.extend([8, 9, 10])
    run.queue.client.xadd(run.queue.groups_key, {"data": record.SerializeToString()})


def test_a_steps_rollout_metrics_cover_every_group_it_sampled_and_every_count_is_logged(run: GrpoRun) -> None:
    """Three all-correct groups (dropped: zero variance), a twin of one of them, and one half-right group (kept).
    The step's samples are 14 of 16 correct: rollout/accuracy said 0.5, the kept group's alone."""
    ids = run.publisher.publish(4, run.version, 0, run.acct)
    run.acct.batches_published = 1
    _write_group(run, ids[0], [1, 1, 1, 1])
    _write_group(run, ids[0], [1, 1, 1, 1])  # a twin (a rollout retry): settles nothing, samples nothing new
    _write_group(run, ids[1], [1, 1, 1, 1])
    _write_group(run, ids[2], [1, 1, 1, 1])
    _write_group(run, ids[3], [1, 1, 0, 0])
    kept, metrics = run._collect()
    assert kept is not None and [r.group_id for _, r in kept] == [ids[3]]
    assert metrics["rollout/accuracy"] == 14 / 16 and metrics["rollout/reward_mean"] == 14 / 16
    assert metrics["groups/zero_variance"] == 3 and metrics["groups/train"] == 1 and metrics["groups/duplicate"] == 1
    # A count of 0 is logged, not left out: the Prometheus gauge of groups/failed must not keep an earlier step's 3.
    assert metrics["groups/failed"] == 0 and metrics["groups/timeout"] == 0 and metrics["groups/stale"] == 0

    run._publish_status(metrics)
    status = run.control.status()
    # dropped holds tasks, so the books add up; the duplicate group is reported beside them
    assert status.dropped == {"zero_variance": 3} and status.duplicates == 1 and status.superseded == 0
    assert status.tasks_published == status.groups_trained + sum(status.dropped.values()) + status.in_flight
    assert status.to_json()["duplicates"] == 1
