"""Prompt tasks: built from dataset rows (pure), published to the run's task stream with accounting."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf import json_format

from grpo.common.queue import RunQueue
from grpo.trainer.accounting import Accounting
from grpo.trainer.data import DataCursor, PromptRow, epoch_order, take
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task carries besides its prompt: sampling and scoring recipe."""

    group_size: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    reward_weights: tuple[tuple[str, float], ...] = ()
    apply_chat_template: bool = True
    overlong_buffer_tokens: int = 0
    steps_json: str = ""  # the step check (reward.StepsCheck as JSON) for rows without one: step credit
    episode: queue_pb2.EpisodeSpec | None = None  # set: every task (training and evaluation) is a multi-turn episode

    @property
    def length_budget(self) -> int:
        """Tokens after the prompt one sample may take: an episode's total, else max_new_tokens."""
        return self.episode.max_total_tokens if self.episode is not None else self.max_new_tokens

    def sampling(self, n: int | None = None, temperature: float | None = None) -> rollout_pb2.SamplingParams:
        return rollout_pb2.SamplingParams(
            n=self.group_size if n is None else n,
            temperature=self.temperature if temperature is None else temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            stop=list(self.stop),
        )


_POSITION = re.compile(r"-e(\d+)-(\d+)$")


def task_id(run_id: str, position_key: str) -> str:
    """Unique per run and the same after a resume (the position comes from the data cursor)."""
    return f"{run_id}-{position_key}"


def row_of(tid: str, n_rows: int, seed: int) -> int:
    """The dataset row a task id was made from (the inverse of `take` + `task_id`)."""
    m = _POSITION.search(tid)
    if m is None:
        raise ValueError(f"task id {tid!r} has no cursor position (…-e<epoch>-<index>)")
    epoch, index = int(m.group(1)), int(m.group(2))
    if index >= n_rows:
        raise ValueError(f"task id {tid!r}: position {index} is past the dataset's {n_rows} rows")
    return epoch_order(n_rows, seed, epoch)[index]


def build_task(
    row: PromptRow,
    tid: str,
    policy_version: int,
    spec: TaskSpec,
    *,
    evaluation: bool = False,
    eval_temperature: float = 0.0,
) -> queue_pb2.PromptTask:
    """One PromptTask; evaluation tasks ask for a single sample at the evaluation temperature."""
    checks = row.checks_proto()
    if spec.overlong_buffer_tokens > 0 and not checks.HasField("overlong"):
        checks.overlong.CopyFrom(
            reward_pb2.OverlongCheck(max_tokens=spec.length_budget, buffer_tokens=spec.overlong_buffer_tokens)
        )
    if spec.steps_json and not evaluation and not checks.HasField("steps"):
        json_format.Parse(spec.steps_json, checks.steps)
    sampling = spec.sampling(n=1, temperature=eval_temperature) if evaluation else spec.sampling()
    return queue_pb2.PromptTask(
        task_id=tid,
        policy_version=policy_version,
        prompt=row.prompt_proto(spec.apply_chat_template),
        checks=checks,
        weights=dict(spec.reward_weights),
        sampling=sampling,
        task_type=row.task_type,
        attempt=0,
        eval=evaluation,
        episode=spec.episode,
    )


class Publisher:
    """Takes rows at the cursor, publishes them as tasks, records them in the accounting."""

    def __init__(
        self, queue: RunQueue, rows: Sequence[PromptRow], spec: TaskSpec, run_id: str, cursor: DataCursor
    ) -> None:
        self.queue = queue
        self.rows = rows
        self.spec = spec
        self.run_id = run_id
        self.cursor = cursor

    def publish(self, k: int, policy_version: int, batch: int, acct: Accounting) -> list[str]:
        """Publish the next `k` rows under `policy_version`; returns their task ids.

        The accounting is updated only after Redis accepted the whole batch, and the cursor
        advances with it: a failed XADD publishes nothing and loses nothing.
        """
        picks, next_cursor = take(self.cursor, len(self.rows), k)
        tasks = [build_task(self.rows[i], task_id(self.run_id, key), policy_version, self.spec) for key, i in picks]
        self.queue.publish_tasks(tasks)
        now = time.monotonic()
        for task in tasks:
            acct.publish(task.task_id, policy_version, batch, now)
        self.cursor = next_cursor
        log.debug("published %d task(s) under version %d (batch %d)", len(tasks), policy_version, batch)
        return [t.task_id for t in tasks]

    def value_task(
        self, group_id: str, tid: str, prefix: Sequence[int], policy_version: int, n: int
    ) -> queue_pb2.PromptTask:
        """A VinePPO value task: `n` continuations of the group's prompt followed by `prefix` (completion tokens),
        scored as the group's task is (without its steps). The continuation gets the task's whole max_new_tokens,
        not what the prefix left of it: identical sampling settings let the rollout batch every value task of a
        step into one engine call (per-prompt budgets in the engines would make it exact)."""
        task = build_task(self.rows[row_of(group_id, len(self.rows), self.cursor.seed)], tid, policy_version, self.spec)
        task.kind = "value"
        task.prompt.prefix_token_ids.extend(prefix)
        task.checks.ClearField("steps")
        task.sampling.n = n
        return task

    def republish(self, tid: str, policy_version: int, acct: Accounting) -> None:
        """Publish an in-flight task again under the same id (its group came from discarded weights)."""
        task = build_task(self.rows[row_of(tid, len(self.rows), self.cursor.seed)], tid, policy_version, self.spec)
        task.attempt = acct.in_flight[tid].regenerations + 1
        self.queue.publish_tasks([task])
        acct.republish(tid, policy_version, time.monotonic())
        log.info("task %s published again under version %d (its group came from discarded weights)", tid,
                 policy_version)  # fmt: skip
