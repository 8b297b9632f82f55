"""One whole step of the GRPO loop (GrpoRun.run) on parts from build_run: with a credit assignment of the test's own
swapped in, as a new one would plug in, and with the registry's process credit. Real Redis, the tiny model on CPU;
the test plays the rollout replica through the run's queue (it takes each task and writes its group), so no rollout
or reward service runs."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.build import build_run
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.credit import CREDITS, Credit, TokenCredit
from grpo.trainer.report import read_metrics
from grpo.trainer.run import GrpoRun
from grpo.v1 import queue_pb2

GROUP_SIZE = 4
CORRECT = [1, 0, 1, 0]  # each group's rewards: a signal in every group


class LastTokenCredit(Credit):
    """A per-step credit in miniature: the whole outcome advantage on each completion's last token."""

    def __init__(self) -> None:  # nothing from the loss config or the run's parts
        self.outcomes: list[list[float]] = []

    def token_advantages(
        self, records: Sequence[queue_pb2.GroupRecord], outcome: Sequence[Sequence[float]], version: int, step: int
    ) -> TokenCredit:
        self.outcomes += [list(o) for o in outcome]
        return [
            [[0.0] * (len(s.completion.token_ids) - 1) + [a] for s, a in zip(r.samples, out, strict=True)]
            for r, out in zip(records, outcome, strict=True)
        ]

    def train_metrics(self, records: Sequence[queue_pb2.GroupRecord]) -> dict[str, float]:
        return {"credited_groups": float(len(records))}

    def metrics(self, records: Sequence[queue_pb2.GroupRecord]) -> dict[str, float]:
        return {"credit/last_token_groups": float(len(records))}


def _play_replica(run: GrpoRun, done: threading.Event, steps: bool) -> None:
    """Take every task from the run's queue and write its group, made by the weights the task names (`steps`: each
    completion in two judged steps, the first right in the right answers, and one group without judged steps)."""
    while not done.is_set():
        for entry in run.queue.read_tasks("r1", 16, block_ms=200):
            task = entry.message
            assert task is not None
            record = queue_pb2.GroupRecord(group_id=task.task_id, task_id=task.task_id, status="ok",
                                           weight_version=task.policy_version, policy_version=task.policy_version,
                                           replica_id="r1")  # fmt: skip
            record.prompt_token_ids.extend([5, 6, 7])
            judged = steps and not task.task_id.endswith("-0")  # the run's first task: its group has no steps
            for c in CORRECT:
                sample = record.samples.add(reward=float(c))
                sample.components["math"].score = float(c)
                sample.completion.token_ids.extend([8, 9, 10])
                sample.completion.finish_reason = "stop"
                if judged:
                    sample.steps.add(start=0, end=1, status="ok", score=float(c))
                    sample.steps.add(start=1, end=2, status="ok", score=1.0)
                    sample.step_token_ends.extend([1, 3])
            run.queue.append_group("r1", entry.entry_id, record)


def _one_step(tmp_path: Path, redis_url: str, credit: Credit | None = None, **settings: Any) -> dict[str, Any]:
    """Run a one-step GRPO run on build_run's parts (its credit swapped for `credit`); the step's metrics row."""
    torch.set_num_threads(1)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i} + 1?", "gold": str(i + 1)}) + "\n"
                            for i in range(8)))  # fmt: skip
    s = TrainerSettings(
        run_id="loop", redis_url=redis_url, model=str(ensure_tiny_model()), train_data=data,
        output_dir=tmp_path / "out", group_size=GROUP_SIZE, prompts_per_step=2, max_staleness=0, steps=1,
        min_replicas=0, checkpoint_every=1, reward_weights={"math": 1.0}, beta=0.0, **settings,
    )  # fmt: skip
    control = RunControl("loop", s.steps)
    parts = build_run(s, control)
    if credit is not None:
        parts.credit = credit
    run = GrpoRun(s, control, parts=parts)
    done = threading.Event()
    replica = threading.Thread(target=_play_replica, args=(run, done, run.credit.steps), name="replica", daemon=True)
    replica.start()
    try:
        run.run()
    finally:
        done.set()
        replica.join(timeout=10)
        run.close()
    assert control.status().phase == "done" and run.step == 1
    assert (s.output_dir / "checkpoints" / "step-00000001").is_dir() and (s.output_dir / "final").is_dir()
    [row] = read_metrics(s.output_dir / "metrics.jsonl")
    assert row["step"] == 1 and "train/loss" in row
    assert row["push/ok"] == 0  # no replica registered: nothing to push to
    return row


def test_a_step_of_the_loop_trains_on_the_credit_its_parts_name(tmp_path: Path, redis_url: str) -> None:
    credit = LastTokenCredit()
    row = _one_step(tmp_path, redis_url, credit)
    assert len(credit.outcomes) == 2  # both groups of the step went through the credit
    assert all(o == credit.outcomes[0] and o[0] > 0 > o[1] for o in credit.outcomes)  # the outcome advantages
    assert row["train/credited_groups"] == 2 and row["credit/last_token_groups"] == 2
    assert row["groups/train"] == 2 and row["tasks/trained"] == 2 and row["tasks/in_flight"] == 0


def test_a_step_with_process_credit_needs_judged_steps_and_logs_them(tmp_path: Path, redis_url: str) -> None:
    """The prm preset (process credit, from the registry): a group without judged steps is unscored (triage asks
    the credit), the others train, and their step metrics are logged with the learner's."""
    row = _one_step(tmp_path, redis_url, preset="prm", step_check={"source": "rule", "rule": "column_addition"})
    assert row["groups/unscored"] == 1 and row["groups/train"] == 1 and row["tasks/dropped/unscored"] == 1
    assert row["train/steps_per_completion"] == 2 and row["train/step_score_mean"] == 0.75  # {1, 1 | 0, 1} × 2
    assert "vine/value_tasks" not in row


def test_every_credit_the_settings_offer_has_a_registry_entry() -> None:
    """A `credit` choice without an entry would fail only when a run starts; one entry per choice, no more."""
    choices = {a for arg in get_args(TrainerSettings.model_fields["credit"].annotation) for a in get_args(arg)}
    assert set(CREDITS) == choices == {"outcome", "process", "vineppo"}
    assert [CREDITS[name].__name__ for name in ("outcome", "process", "vineppo")] == [
        "Credit", "ProcessCredit", "VineCredit"]  # fmt: skip
    assert [CREDITS[name].steps for name in ("outcome", "process", "vineppo")] == [False, True, False]
