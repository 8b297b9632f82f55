"""A short multi-task GRPO run through the real services: math rows scored by the rule, chat rows by a reward
classifier trained here (the hybrid reward), a private Redis, a reward service loading the classifier through
reward_model_path, an hf rollout replica and the trainer as a process; task/<type>/* and eval/<type>/* are checked
against what the run's ledger and overall metrics say."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grpo.trainer.ledger import read_ledger
from grpo.trainer.publisher import row_of
from grpo.trainer.report import write_report
from tests.support.reward_classifier import MAX_LENGTH, train_reward_classifier
from tests.support.reward_proc import RewardService
from tests.support.rollout_proc import start_rollout_service
from tests.support.trainer_proc import ROLLOUT_ENV, read_metrics, run_trainer, trainer_config, write_rows

pytestmark = pytest.mark.slow
RUN = "multi"
TYPES = ("chat", "math")
GROUP_SIZE = 4


def rows(n: int, offset: int = 0) -> list[dict[str, Any]]:
    """n math rows (the rule) then n chat rows (the reward model, its logit through a sigmoid)."""
    maths = [{"id": f"m{i}", "prompt": f"What is {i} + {i + 1}?", "gold": str(2 * i + 1), "task_type": "math"}
             for i in range(offset, offset + n)]  # fmt: skip
    chats = [{"id": f"c{i}", "prompt": f"Say something about {i}.", "task_type": "chat",
              "checks": {"reward_model": {"normalize": "sigmoid"}}} for i in range(offset, offset + n)]  # fmt: skip
    return maths + chats


def test_a_multi_task_run_logs_each_task_types_metrics_and_evaluation(
    tmp_path: Path, redis_url: str, start_reward: Callable[..., RewardService]
) -> None:
    classifier = train_reward_classifier(tmp_path / "classifier")
    reward = start_reward("--reward-model-path", str(classifier), "--reward-model-max-length", str(MAX_LENGTH),
                          env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    args = ("--redis-url", redis_url, "--reward-addr", reward.grpc_addr, "--replica-id", f"{RUN}-r1",
            "--advertise-host", "127.0.0.1")  # fmt: skip
    rollout = start_rollout_service(*args, log_dir=tmp_path, env={**ROLLOUT_ENV, "GRPO_ROLLOUT_RUN": RUN})
    train = rows(4)
    try:
        config = trainer_config(
            tmp_path, RUN, redis_url, train_data=str(write_rows(tmp_path / "mixed.jsonl", train)),
            eval_data=str(write_rows(tmp_path / "eval.jsonl", rows(2, offset=100))), eval_size=4, eval_every=3,
            steps=3, checkpoint_every=1, group_size=GROUP_SIZE, prompts_per_step=4, overlong_soft_penalty=False,
            reward_weights={},
        )  # fmt: skip
        run_trainer(config, tmp_path / "trainer.log", timeout=400)
    finally:
        rollout.stop()
    out = tmp_path / "out"
    metrics = read_metrics(out)
    assert [r["step"] for r in metrics] == [0, 1, 2, 3]

    # each step: every type's settled groups, as the ledger of that step has them (checkpoint_every = 1)
    ledger = read_ledger(out / "ledger")
    for row in metrics[1:]:
        outcomes = [e for e in ledger if e["step"] == row["step"]]
        typed = [(train[row_of(str(e["task_id"]), len(train), 0)]["task_type"], e["outcome"]) for e in outcomes]
        for t in TYPES:
            assert row[f"task/{t}/groups"] == sum(tt == t for tt, _ in typed), (row, typed)
        assert sum(row[f"task/{t}/groups"] for t in TYPES) == len(outcomes) == 4
        # the types' reward means pool to the step's, each weighted by its samples (every group came whole)
        complete = {t: sum(tt == t and o not in ("timeout", "failed") for tt, o in typed) for t in TYPES}
        if all(o not in ("timeout", "failed", "unscored") for _, o in typed):
            pooled = sum(row[f"task/{t}/reward_mean"] * complete[t] for t in TYPES if complete[t]) / sum(
                complete.values()
            )
            assert pooled == pytest.approx(row["rollout/reward_mean"], abs=1e-9)
        if complete["math"]:
            # the untrained tiny model never solves a sum: accuracy 0, reward 0, every math group flat
            assert row["task/math/accuracy"] == 0.0 and row["task/math/reward_mean"] == 0.0
            assert row["task/math/zero_variance_fraction"] == 1.0
        if complete["chat"]:
            # sigmoid of the classifier's logit: strictly inside (0, 1), never the raw logit; no accuracy component
            assert 0.0 < row["task/chat/reward_mean"] < 1.0 and "task/chat/accuracy" not in row
            assert 0.0 <= row["task/chat/zero_variance_fraction"] <= 1.0
    assert sum(r["groups/train"] for r in metrics[1:]) >= 1  # the chat groups' varying scores gave a signal

    # each evaluation (the baseline and step 3): per type, and the overall accuracy over the math rows alone
    for row in (metrics[0], metrics[3]):
        assert row["eval/math/problems"] == 2 and row["eval/chat/problems"] == 2
        assert row["eval/math/judged"] == 2 and row["eval/chat/judged"] == 2
        assert row["eval/math/accuracy"] == row["eval/accuracy"] == 0.0
        assert 0.0 < row["eval/chat/reward_mean"] < 1.0 and "eval/math/reward_mean" not in row
        assert row["eval/unjudged"] == 2  # the chat rows have no correctness component: not in eval/accuracy

    summary = write_report(out, eval_before=None, wall_seconds=1.0)
    chat = summary["per_task"]["chat"]
    assert chat["eval_reward_mean_before"] == pytest.approx(metrics[0]["eval/chat/reward_mean"])
    assert chat["eval_reward_mean_after"] == pytest.approx(metrics[3]["eval/chat/reward_mean"])
    assert summary["per_task"]["math"]["groups_total"] + chat["groups_total"] == 12
    assert "| chat | " in (out / "report.md").read_text()
    assert all(math.isfinite(v) for r in metrics for k, v in r.items() if k.startswith("task/"))
