"""Task building (pure) and publishing to a real private Redis with accounting and a stable cursor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from grpo.common.queue import RunQueue
from grpo.trainer.accounting import Accounting
from grpo.trainer.data import parse_row
from grpo.trainer.order import DataCursor
from grpo.trainer.publisher import Publisher, TaskSpec, build_task, row_of, task_id

SPEC = TaskSpec(group_size=4, temperature=0.8, top_p=1.0, top_k=0, max_new_tokens=16,
                reward_weights=(("format", 0.2), ("math", 1.0)), overlong_buffer_tokens=4)  # fmt: skip
ROWS = [parse_row({"prompt": f"{i}+1?", "gold": str(i + 1)}, f"row {i}") for i in range(5)]


def test_build_task_carries_the_recipe() -> None:
    task = build_task(ROWS[2], "run-e0-2", 7, SPEC)
    assert (task.task_id, task.policy_version, task.eval) == ("run-e0-2", 7, False)
    assert task.sampling.n == 4 and task.sampling.temperature == 0.8 and task.sampling.max_new_tokens == 16
    assert task.prompt.text == "2+1?" and task.checks.math.gold == "3"
    assert dict(task.weights) == {"format": 0.2, "math": 1.0}
    assert task.checks.overlong.max_tokens == 16 and task.checks.overlong.buffer_tokens == 4


def test_eval_task_is_single_greedy_sample() -> None:
    task = build_task(ROWS[0], "run-eval0-0", 1, SPEC, evaluation=True, eval_temperature=0.0)
    assert task.eval and task.sampling.n == 1 and task.sampling.temperature == 0.0


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def run_queue(client: redis.Redis, run: str) -> RunQueue:
    queue = RunQueue(client, run)
    queue.ensure_groups()
    return queue


def test_publish_counts_and_ids_are_stable(client: redis.Redis) -> None:
    queue = run_queue(client, "pubtest")
    acct = Accounting()
    pub = Publisher(queue, ROWS, SPEC, "pubtest", DataCursor(seed=1))
    ids = pub.publish(3, 2, 0, acct)
    assert acct.published == 3 and set(acct.in_flight) == set(ids)
    assert all(t.policy_version == 2 for t in acct.in_flight.values())
    assert queue.stats()["tasks"].length == 3
    # a resumed publisher at the same cursor issues the same ids
    again = Publisher(queue, ROWS, SPEC, "pubtest", DataCursor(seed=1)).publish(3, 2, 0, Accounting())
    assert again == ids and ids[0] == task_id("pubtest", "e0-0")


def test_republish_sends_the_same_task_again(client: redis.Redis) -> None:
    queue = run_queue(client, "republish")
    acct = Accounting()
    pub = Publisher(queue, ROWS, SPEC, "republish", DataCursor(seed=3))
    ids = pub.publish(7, 2, 0, acct)  # wraps into epoch 1 (5 rows)
    first = {t.task_id: t for t in (e.message for e in queue.read_tasks("r1", 10, 100)) if t is not None}
    cursor = pub.cursor
    for tid in ids:
        pub.republish(tid, 9, acct)
    again = [e.message for e in queue.read_tasks("r1", 10, 100)]
    assert [t.task_id for t in again if t] == ids
    for task in again:
        assert task is not None
        assert task.prompt == first[task.task_id].prompt and task.checks == first[task.task_id].checks
        assert (task.policy_version, task.attempt) == (9, 1)
    assert pub.cursor == cursor and acct.published == 7 and acct.in_flight[ids[6]].regenerations == 1


def test_row_of_inverts_the_cursor() -> None:
    from grpo.trainer.order import take

    picks, _ = take(DataCursor(seed=5), 5, 12)
    assert [row_of(task_id("run-x", key), 5, 5) for key, _ in picks] == [i for _, i in picks]
    with pytest.raises(ValueError, match="no cursor position"):
        row_of("run-eval3", 5, 5)
    with pytest.raises(ValueError, match="past the dataset"):
        row_of("run-e0-7", 5, 5)
