"""Multi-task runs: task/<type>/* from a step's settled groups, eval/<type>/* from an evaluation's groups, and the
report's per-task summary and table (pure, on hand-made groups); one step's collection with two task types against
a real Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo.trainer.consumer import task_metrics
from grpo.trainer.evaluation import eval_task_metrics
from grpo.trainer.report import per_task, read_metrics, summarize, write_report
from grpo.v1 import queue_pb2


def group(rewards: list[float | None], component: str | None = "math", *, status: str = "ok",
          scores: list[float] | None = None) -> queue_pb2.GroupRecord:  # fmt: skip
    """A group whose samples have these rewards; `component` (math, code, or None: a reward-model row) scores each
    sample (its score: `scores`, else the reward)."""
    record = queue_pb2.GroupRecord(group_id="g", task_id="g", status=status, weight_version=1, policy_version=1)
    if status != "ok":
        record.error = "rollout: reward service unavailable"
        return record
    for i, r in enumerate(rewards):
        sample = record.samples.add()
        sample.completion.token_ids.extend([5, 6])
        if r is not None:
            sample.reward = r
        if component is not None:
            score = scores[i] if scores is not None else r
            if score is not None:
                sample.components[component].score = score
        else:
            sample.components["reward_model"].score = r if r is not None else 0.0
    return record


def test_each_task_type_gets_its_groups_reward_accuracy_and_zero_variance_share() -> None:
    """math: one half-right group (trained), one all-right (zero variance, dropped), one timeout; code: a group with
    partial test scores; chat (reward model only): one group, all samples scored 0.7 (zero variance, no accuracy)."""
    settled = [
        ("math", "train", group([1.0, 0.0, 1.0, 0.0])),
        ("math", "zero_variance", group([1.0, 1.0, 1.0, 1.0])),
        ("math", "timeout", None),
        ("code", "train", group([1.0, 0.5, 0.25, 1.0])),
        ("chat", "zero_variance", group([0.7, 0.7, 0.7, 0.7], None)),
    ]
    m = task_metrics(["chat", "code", "math", "tool"], settled)
    assert m["task/math/groups"] == 3 and m["task/code/groups"] == 1 and m["task/chat/groups"] == 1
    assert m["task/math/reward_mean"] == 6 / 8 and m["task/math/accuracy"] == 6 / 8
    assert m["task/math/zero_variance_fraction"] == 1 / 2  # of its two complete groups; the timeout has none
    assert m["task/code/accuracy"] == 2 / 4  # every test passed in two samples (as rollout/accuracy)
    assert m["task/code/reward_mean"] == pytest.approx(2.75 / 4) and m["task/code/zero_variance_fraction"] == 0
    assert m["task/chat/reward_mean"] == pytest.approx(0.7) and m["task/chat/zero_variance_fraction"] == 1
    assert "task/chat/accuracy" not in m  # no correctness component: no accuracy, never a 0
    # a type the step did not see is still logged (a Prometheus gauge keeps its last value otherwise), without means
    assert m["task/tool/groups"] == 0 and m["task/tool/zero_variance_fraction"] == 0
    assert "task/tool/reward_mean" not in m and "task/tool/accuracy" not in m


def test_zero_variance_is_measured_as_triage_measures_it() -> None:
    """Equal rewards but different correctness: zero variance on `reward`, not on `accuracy`; a reward clip makes
    two rewards past it equal; a failed group or one with an unscored sample is not a complete group."""
    mixed = group([1.0, 1.0], scores=[1.0, 0.0])
    assert task_metrics(["a"], [("a", "train", mixed)])["task/a/zero_variance_fraction"] == 1
    on_accuracy = task_metrics(["a"], [("a", "train", mixed)], zero_variance_on="accuracy")
    assert on_accuracy["task/a/zero_variance_fraction"] == 0
    clipped = task_metrics(["a"], [("a", "train", group([2.0, 3.0]))], reward_clip=(-1.0, 1.0))
    assert clipped["task/a/zero_variance_fraction"] == 1
    incomplete = [("a", "failed", group([], status="failed")), ("a", "unscored", group([1.0, None]))]
    m = task_metrics(["a"], incomplete)
    assert m["task/a/groups"] == 2 and m["task/a/zero_variance_fraction"] == 0
    assert m["task/a/reward_mean"] == 1.0  # the scored sample's reward is still what the policy got


def eval_group(reward: float | None, component: str | None = "math", status: str = "ok") -> queue_pb2.GroupRecord:
    return group([reward], component, status=status)


def test_evaluation_per_task() -> None:
    """math: 2 right, 1 wrong, 1 failed, 1 missing, 1 unjudged; chat (reward model): scored 0.2 and 0.6, one failed;
    code: 1 of 2 fully passing."""
    types = ["math"] * 6 + ["chat"] * 3 + ["code"] * 2
    groups = [
        eval_group(1.0), eval_group(1.0), eval_group(0.0), eval_group(None, status="failed"), None,
        eval_group(None),  # the verifier could not judge: no score, no reward
        eval_group(0.2, None), eval_group(0.6, None), eval_group(None, None, status="failed"),
        eval_group(1.0, "code"), eval_group(0.5, "code"),
    ]  # fmt: skip
    m = eval_task_metrics(types, groups, stopped=False)
    assert m["eval/math/problems"] == 6 and m["eval/math/judged"] == 3 and m["eval/math/accuracy"] == 2 / 3
    assert "eval/math/reward_mean" not in m
    assert m["eval/chat/problems"] == 3 and m["eval/chat/judged"] == 2
    assert m["eval/chat/reward_mean"] == pytest.approx(0.4) and "eval/chat/accuracy" not in m
    assert m["eval/code/judged"] == 2 and m["eval/code/accuracy"] == 0.5
    stopped = eval_task_metrics(types, groups, stopped=True)  # counts only: no value from the problems that came first
    assert stopped["eval/math/judged"] == 3 and "eval/math/accuracy" not in stopped
    assert "eval/chat/reward_mean" not in stopped


def metrics_rows() -> list[dict[str, Any]]:
    """A two-task run's metrics.jsonl: step 0 (baseline), steps 1-4, evaluations at 0, 2, 4 and a stopped one."""

    def ev(acc: float, reward: float, judged: int = 4) -> dict[str, float]:
        return {"eval/accuracy": acc, "eval/judged": judged, "eval/unjudged": 4, "eval/failed": 0, "eval/missing": 0,
                "eval/stopped": 0, "eval/math/problems": 4, "eval/math/judged": judged, "eval/math/accuracy": acc,
                "eval/chat/problems": 4, "eval/chat/judged": 4, "eval/chat/reward_mean": reward}  # fmt: skip

    def step(n: int, groups: int, reward: float) -> dict[str, float]:
        return {"step": n, "rollout/reward_mean": reward, "task/math/groups": groups, "task/math/reward_mean": reward,
                "task/math/accuracy": reward, "task/math/zero_variance_fraction": 0.5, "task/chat/groups": 4 - groups,
                "task/chat/reward_mean": 0.5, "task/chat/zero_variance_fraction": 0.0}  # fmt: skip

    return [
        {"step": 0, **ev(0.25, 0.3)},
        step(1, 2, 0.4),
        {**step(2, 3, 0.5), **ev(0.5, 0.4, judged=2)},
        step(3, 1, 0.6),
        {**step(4, 2, 0.7), **ev(0.75, 0.6)},
        {"step": 5, "eval/stopped": 1, "eval/math/problems": 4, "eval/math/judged": 1, "eval/chat/judged": 0},
    ]


def test_report_gives_each_task_its_last_values_and_eval_before_and_after(tmp_path: Path) -> None:
    rows = metrics_rows()
    tasks = per_task(rows)
    assert list(tasks) == ["chat", "math"]
    math, chat = tasks["math"], tasks["chat"]
    assert math["last_reward_mean"] == 0.7 and math["last_accuracy"] == 0.7 and math["groups_total"] == 8
    assert math["eval_accuracy_before"] == 0.25 and math["eval_before_judged"] == 4
    # the last three finished evaluations after step 0 (steps 2 and 4), pooled by problems judged; the stopped one
    # at step 5 counts for nothing
    assert math["eval_accuracy_after"] == pytest.approx((0.5 * 2 + 0.75 * 4) / 6) and math["eval_after_judged"] == 6
    assert math["eval_reward_mean_after"] is None and math["eval_problems"] == 4
    assert chat["last_accuracy"] is None and chat["groups_total"] == 8
    assert chat["eval_reward_mean_before"] == pytest.approx(0.3)
    assert chat["eval_reward_mean_after"] == pytest.approx(0.5)
    assert chat["eval_accuracy_after"] is None

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = write_report(tmp_path, eval_before=None, wall_seconds=1.0)
    assert json.loads((tmp_path / "summary.json").read_text())["per_task"]["math"]["eval_accuracy_before"] == 0.25
    report = (tmp_path / "report.md").read_text()
    assert "## Per task" in report
    assert "| math | 8 | 0.700 | 70.0 % | 50.0 % | accuracy 25.0 % → 66.7 % (6 judged) |" in report
    assert "| chat | 8 | 0.500 | n/a | 0.0 % | reward 0.300 → 0.500 (8 judged) |" in report
    assert (tmp_path / "task_reward.png").exists() and (tmp_path / "task_eval.png").exists()
    assert summary["eval_accuracy_before"] == 0.25  # the overall figures are as before


def test_a_single_task_run_has_no_per_task_section(tmp_path: Path) -> None:
    rows = [{"step": 1, "rollout/reward_mean": 0.5}, {"step": 2, "eval/accuracy": 0.5, "eval/stopped": 0}]
    assert "per_task" not in summarize(rows, eval_before=None, wall_seconds=1.0)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report(tmp_path, eval_before=None, wall_seconds=1.0)
    assert "Per task" not in (tmp_path / "report.md").read_text()
    assert read_metrics(tmp_path / "metrics.jsonl") == rows


# ---- one step's collection with two task types (real Redis, the tiny model) -------------------------------------


@pytest.fixture
def run(tmp_path: Path, redis_url: str) -> Iterator[Any]:
    from grpo.common.tiny_model import ensure_tiny_model
    from grpo.trainer.config import TrainerSettings
    from grpo.trainer.control import RunControl
    from grpo.trainer.run import GrpoRun

    torch.set_num_threads(1)
    data = tmp_path / "train.jsonl"
    rows = [{"id": f"m{i}", "prompt": f"{i} + 1?", "gold": str(i + 1), "task_type": "math"} for i in range(4)]
    rows += [{"id": f"c{i}", "prompt": f"Say {i}.", "task_type": "chat", "checks": {"format": {}}} for i in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = TrainerSettings(
        run_id="tasks", redis_url=redis_url, model=str(ensure_tiny_model()), train_data=data,
        output_dir=tmp_path / "out", group_size=4, prompts_per_step=8, skip_zero_variance=True, max_staleness=0,
        beta=0.0,
    )  # fmt: skip
    grpo = GrpoRun(settings, RunControl("tasks", settings.steps))
    try:
        yield grpo
    finally:
        grpo.close()


def _write_group(run: Any, tid: str, rewards: list[float], component: str) -> None:
    record = queue_pb2.GroupRecord(group_id=tid, task_id=tid, status="ok", weight_version=run.version,
                                   policy_version=run.version, replica_id="r1")  # fmt: skip
    record.prompt_token_ids.extend([5, 6, 7])
    for r in rewards:
        sample = record.samples.add(reward=r)
        sample.components[component].score = r
        sample.completion.token_ids.extend([8, 9, 10])
    run.queue.client.xadd(run.queue.groups_key, {"data": record.SerializeToString()})


def test_a_step_of_a_two_task_run_logs_each_types_numbers(run: Any) -> None:
    """Every row once in the step (8 prompts, 8 rows): each group's type is its row's, found from its task id."""
    ids = run.publisher.publish(8, run.version, 0, run.acct)
    run.acct.batches_published = 1
    expected: dict[str, list[list[float]]] = {"math": [], "chat": []}
    for n, tid in enumerate(ids):
        task_type = run.publisher.row(tid).task_type
        rewards = [1.0, 1.0, 1.0, 1.0] if n % 3 == 0 else [1.0, 0.0, 0.5, 0.0]
        expected[task_type].append(rewards)
        _write_group(run, tid, rewards, "math" if task_type == "math" else "format")
    kept, m = run._collect()
    assert kept is not None and run.task_types == ("chat", "math")
    for task_type, groups in expected.items():
        flat = [r for g in groups for r in g]
        assert m[f"task/{task_type}/groups"] == len(groups) == 4
        assert m[f"task/{task_type}/reward_mean"] == pytest.approx(sum(flat) / len(flat))
        zero = sum(len(set(g)) == 1 for g in groups) / len(groups)
        assert m[f"task/{task_type}/zero_variance_fraction"] == pytest.approx(zero)
    math = [r for g in expected["math"] for r in g]
    assert m["task/math/accuracy"] == pytest.approx(sum(r == 1.0 for r in math) / len(math))
    assert "task/chat/accuracy" not in m  # format is not a correctness component
    assert m["groups/zero_variance"] == sum(m[f"task/{t}/zero_variance_fraction"] * 4 for t in expected)
