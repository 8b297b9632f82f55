"""VinePPO's value rollouts: where to split a completion, the value tasks, their books, and the token credit.

For each sampled completion the trainer picks split points among its step boundaries (at most vine_max_splits,
spread evenly), asks the rollout service for vine_k continuations of the prefix up to each (a `value` task: the
prompt with prefix_token_ids), and takes the mean reward of a prefix's continuations as its value. The prompt's
value is the group's mean reward; the value after the last step is the completion's own reward. Each segment
between split points gets V(after) − V(before) (grpo.algo.credit.vineppo_advantages).

A value task is resolved (its value used) or dropped with a reason (failed, unscored, timeout, stopped), like every
other task; a value group that comes after its step is `late` and acked. A split point whose value is missing is left
out: the segments on either side merge into one, whose credit is still a difference of estimated values.

`ValueRollouts` does the round trip for a step's kept groups (publish the value tasks, await their groups while
other groups wait in the reader's buffer, turn the values into token credit); the rest is pure.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from grpo.algo.credit import token_advantages, vineppo_advantages
from grpo.trainer.consumer import GroupReader
from grpo.trainer.publisher import Publisher
from grpo.trainer.redis_retry import Retry
from grpo.trainer.waiting import WaitReporter
from grpo.v1 import queue_pb2

log = logging.getLogger(__name__)
VALUE_KIND = "value"
VALUE_DROP_REASONS = ("failed", "unscored", "timeout", "stopped")


def split_points(step_token_ends: Sequence[int], n_tokens: int, max_splits: int) -> list[int]:
    """Token counts at the step boundaries strictly inside the completion, at most `max_splits`, evenly spread."""
    inner = sorted({end for end in step_token_ends if 0 < end < n_tokens})
    if len(inner) <= max_splits:
        return inner
    if max_splits == 1:
        return [inner[len(inner) // 2]]
    return sorted({inner[round(i * (len(inner) - 1) / (max_splits - 1))] for i in range(max_splits)})


def value_task_id(group_id: str, sample: int, split: int, version: int) -> str:
    """Unique per policy version: a value group from other weights (a resume, an earlier step) never matches."""
    return f"{group_id}/v{sample}.{split}@{version}"


@dataclass
class ValueBooks:
    """Every value task published is used, or dropped with a reason; `late` groups are counted beside."""

    published: int = 0
    used: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    late: int = 0
    continuation_tokens: int = 0  # since the last metrics (per step)
    wait_s: float = 0.0  # since the last metrics (per step)

    def check(self, in_flight: int = 0) -> None:
        if self.published != self.used + sum(self.dropped.values()) + in_flight:
            raise AssertionError(f"value books do not balance: {self}, in flight {in_flight}")

    def metrics(self, trained_tokens: int) -> dict[str, float]:
        """Cumulative counts, and this step's cost: rollout tokens per trained token, seconds waiting for values."""
        out = {"vine/value_tasks": float(self.published), "vine/value_used": float(self.used),
               "vine/value_late": float(self.late), "time/vine_wait_s": self.wait_s,
               "vine/rollout_tokens_per_trained_token": (trained_tokens + self.continuation_tokens)
               / max(trained_tokens, 1)}  # fmt: skip
        out.update({f"vine/value_dropped/{reason}": float(self.dropped[reason]) for reason in VALUE_DROP_REASONS})
        self.continuation_tokens, self.wait_s = 0, 0.0
        return out


def sample_credit(
    splits: Sequence[int], values: dict[int, float], prompt_value: float, reward: float, n_tokens: int
) -> list[float]:
    """Per-token advantages of one completion from the values found at its split points (missing ones skipped)."""
    kept = [b for b in splits if b in values]
    advantages = vineppo_advantages([prompt_value, *(values[b] for b in kept)], reward)
    return token_advantages(advantages, [*kept, n_tokens], n_tokens)


# value task id -> (group, sample, split point) of the step's kept groups
Plan = dict[str, tuple[int, int, int]]


@dataclass
class ValueRollouts:
    """A step's value rollouts: its value tasks published through `publisher`'s queue, their groups read from
    `reader` for up to `timeout_s` (or until `should_stop`), every one counted in `books`."""

    publisher: Publisher
    reader: GroupReader
    waiting: WaitReporter
    retry: Retry
    books: ValueBooks
    should_stop: Callable[[], bool]
    timeout_s: float
    k: int  # continuations per split point (vine_k)
    max_splits: int  # split points per completion at most (vine_max_splits)

    def credit(self, records: Sequence[queue_pb2.GroupRecord], version: int, step: int) -> list[list[list[float]]]:
        """Value tasks at each completion's split points, their groups awaited (others held back for later steps),
        then per-token advantages for every sample of every group."""
        plan: Plan = {}
        tasks = []
        splits: list[list[list[int]]] = []
        for gi, record in enumerate(records):
            splits.append([])
            for si, sample in enumerate(record.samples):
                ids = list(sample.completion.token_ids)
                points = split_points(list(sample.step_token_ends), len(ids), self.max_splits)
                splits[-1].append(points)
                for b in points:
                    tid = value_task_id(record.group_id, si, b, version)
                    plan[tid] = (gi, si, b)
                    tasks.append(self.publisher.value_task(record.group_id, tid, ids[:b], version, self.k))
        if tasks:
            self.retry(lambda: self.publisher.queue.publish_tasks(tasks), "publishing value tasks")
            self.books.published += len(tasks)
        values = self.await_values(plan, step)
        out = []
        for gi, record in enumerate(records):
            rewards = [s.reward for s in record.samples]
            prompt_value = sum(rewards) / len(rewards)  # the group is the prompt's Monte Carlo sample
            out.append([
                sample_credit(splits[gi][si], values.get((gi, si), {}), prompt_value, s.reward,
                              len(s.completion.token_ids))
                for si, s in enumerate(record.samples)
            ])  # fmt: skip
        return out

    def await_values(self, plan: Plan, step: int) -> dict[tuple[int, int], dict[int, float]]:
        """Read groups until every planned value group came or timeout_s passed; other groups wait in the reader's
        buffer, in order, for the steps they belong to. (group, sample) -> split point -> value."""
        books = self.books
        values: dict[tuple[int, int], dict[int, float]] = {}
        pending, held = set(plan), []
        started = time.monotonic()
        try:
            while pending and time.monotonic() < started + self.timeout_s and not self.should_stop():
                entry = self.retry(lambda: self.reader.next(block_ms=500), "reading value groups")
                if entry is None:
                    self.waiting.tick(f"step {step}: waiting for value groups, {len(pending)} of "
                                      f"{len(plan)} missing")  # fmt: skip
                    continue
                self.waiting.done()
                record = entry.message
                if record is None or record.kind != VALUE_KIND:
                    held.append(entry)  # a group for a later step (or an evaluation)
                    continue
                self.reader.ack_now(entry.entry_id)
                if record.group_id not in pending:
                    books.late += 1
                    continue
                pending.discard(record.group_id)
                books.continuation_tokens += sum(len(s.completion.token_ids) for s in record.samples)
                rewards = [s.reward for s in record.samples if s.HasField("reward")]
                if record.status != "ok" or not record.samples:
                    books.dropped["failed"] += 1
                elif len(rewards) != len(record.samples):
                    books.dropped["unscored"] += 1
                else:
                    gi, si, b = plan[record.group_id]
                    values.setdefault((gi, si), {})[b] = sum(rewards) / len(rewards)
                    books.used += 1
        finally:
            self.reader.buffer.extendleft(reversed(held))
        if pending:
            reason = "stopped" if self.should_stop() else "timeout"
            log.warning("%d value group(s) missing (%s); their split points are left out", len(pending), reason)
            books.dropped[reason] += len(pending)
        books.wait_s += time.monotonic() - started
        books.check()
        return values
