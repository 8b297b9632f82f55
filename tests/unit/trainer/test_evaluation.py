"""evaluate() against a real Redis: eval groups written into the run's groups stream as a replica writes them."""

from __future__ import annotations

import redis

from grpo.common.queue import RunQueue
from grpo.trainer.consumer import GroupReader
from grpo.trainer.data import PromptRow
from grpo.trainer.evaluation import evaluate
from grpo.trainer.publisher import TaskSpec
from grpo.v1 import queue_pb2

ROWS = [PromptRow(f"q{i}", f"What is {i} + 1?", "math", {"math": {"gold": str(i + 1)}}) for i in range(10)]
SPEC = TaskSpec(group_size=8, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
VERSION = 3


def _queue(redis_url: str) -> RunQueue:
    queue = RunQueue(redis.Redis.from_url(redis_url), "ev")
    queue.ensure_groups()
    return queue


def _answer(queue: RunQueue, row: int, status: str = "ok", correct: bool | None = True) -> None:
    """The eval group of `row` (one sample, as eval tasks ask): judged right/wrong, or unjudged (None: the
    verifier gave no score, so no reward either), or a failed group."""
    tid = f"ev-eval1-{row}"
    record = queue_pb2.GroupRecord(group_id=tid, task_id=tid, status=status, weight_version=VERSION,
                                   policy_version=VERSION, eval=True)  # fmt: skip
    if status == "ok":
        sample = record.samples.add()
        sample.completion.token_ids.extend([5, 6])
        if correct is not None:
            sample.reward = float(correct)
            sample.components["math"].score = float(correct)
    else:
        record.error = "reward service unavailable"
    queue.client.xadd(queue.groups_key, {"data": record.SerializeToString()})


def _evaluate(queue: RunQueue, **kw: object) -> dict[str, float]:
    return evaluate(GroupReader(queue, "trainer"), ROWS, SPEC, run_id="ev", round_id="1", policy_version=VERSION,
                    temperature=0.0, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_accuracy_is_over_the_judged_problems_and_every_excluded_one_is_counted(redis_url: str) -> None:
    """4 right, 1 wrong, 2 failed, 2 the verifier could not judge, 1 never came (the deadline passed)."""
    queue = _queue(redis_url)
    for row in range(4):
        _answer(queue, row)
    _answer(queue, 4, correct=False)
    _answer(queue, 5, status="failed")
    _answer(queue, 6, status="failed")
    _answer(queue, 7, correct=None)
    _answer(queue, 8, correct=None)
    m = _evaluate(queue, timeout_s=1.5)
    assert m["eval/accuracy"] == 4 / 5  # infrastructure faults are not wrong answers...
    # ...but nobody reads 80 % without seeing it is 5 problems of 10
    assert (m["eval/judged"], m["eval/unjudged"], m["eval/failed"], m["eval/missing"]) == (5, 2, 2, 1)
    assert m["eval/completed"] == 7 and m["eval/stopped"] == 0


def test_an_evaluation_cut_short_by_a_stop_keeps_its_counts_and_reports_no_accuracy(redis_url: str) -> None:
    """SIGTERM / Stop after 3 groups: 3 of 10 problems is not the model's accuracy (it read 100 % here)."""
    queue = _queue(redis_url)
    for row in range(10):
        _answer(queue, row, correct=row < 3)
    checks = [0]

    def stop_after_three() -> bool:  # the loop asks before each group it reads
        checks[0] += 1
        return checks[0] > 3

    m = _evaluate(queue, timeout_s=30.0, should_stop=stop_after_three)
    assert "eval/accuracy" not in m and "eval/reward_mean" not in m
    assert m["eval/stopped"] == 1 and m["eval/completed"] == 3 and m["eval/judged"] == 3 and m["eval/missing"] == 7
