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
from grpo.trainer.data import PromptRow
from grpo.trainer.difficulty import DifficultyTracker
from grpo.trainer.order import DataCursor, Mixture, draw_order, take_eligible
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
    task_reward_weights: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()  # by task_type, over the above
    apply_chat_template: bool = True
    overlong_buffer_tokens: int = 0
    steps_json: str = ""  # the step check (reward.StepsCheck as JSON) for rows without one: step credit
    episode: queue_pb2.EpisodeSpec | None = None  # set: every task (training and evaluation) is a multi-turn episode
    probe: queue_pb2.ProbeSpec | None = None  # set: training groups are sampled adaptively (probe_size)

    def weights_for(self, task_type: str) -> tuple[tuple[str, float], ...]:
        """The component weights a row of `task_type` is scored with: its type's own, else reward_weights."""
        return dict(self.task_reward_weights).get(task_type, self.reward_weights)

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


def task_id(run_id: str, position_key: str, stage: int = 0) -> str:
    """Unique per run and the same after a resume (the position comes from the data cursor). A staged run's stage i
    names its tasks `<run_id>-s<i>-…`: its stages share the run's Redis streams, and a late group of one stage must
    never be taken for a task of another."""
    return f"{run_id}-s{stage}-{position_key}" if stage else f"{run_id}-{position_key}"


def position_of(tid: str) -> tuple[int, int]:
    """(epoch, index): the cursor position a task id was made at."""
    m = _POSITION.search(tid)
    if m is None:
        raise ValueError(f"task id {tid!r} has no cursor position (…-e<epoch>-<index>)")
    return int(m.group(1)), int(m.group(2))


def row_of(tid: str, n_rows: int, seed: int, mixture: Mixture | None = None) -> int:
    """The dataset row a task id was made from (the inverse of `take` + `task_id`; `mixture`: the run's, if it mixes
    its data)."""
    epoch, index = position_of(tid)
    if index >= n_rows:
        raise ValueError(f"task id {tid!r}: position {index} is past the dataset's {n_rows} rows")
    return draw_order(n_rows, seed, epoch, mixture)[index]


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
        weights=dict(spec.weights_for(row.task_type)),
        sampling=sampling,
        task_type=row.task_type,
        attempt=0,
        eval=evaluation,
        episode=spec.episode,
        probe=None if evaluation else spec.probe,
    )


class Publisher:
    """Takes rows at the cursor, publishes them as tasks, records them in the accounting."""

    def __init__(
        self,
        queue: RunQueue,
        rows: Sequence[PromptRow],
        spec: TaskSpec,
        run_id: str,
        cursor: DataCursor,
        *,
        mixture: Mixture | None = None,
        stage: int = 0,
        difficulty: DifficultyTracker | None = None,
    ) -> None:
        self.queue = queue
        self.rows = rows
        self.spec = spec
        self.run_id = run_id
        self.cursor = cursor
        self.mixture = mixture  # how the rows are drawn (None: a plain shuffle per epoch)
        self.stage = stage  # a staged run's stage index, in the task ids (0: not staged)
        self.difficulty = difficulty  # difficulty buckets: rows it sets aside are passed over (None: none are)
        self.skipped = 0  # draws passed over since the last `take_skipped`
        self.probed = 0  # tasks published with a probe since the last `take_probed`
        self._exhausted_epoch = -1  # the last epoch "every row is set aside" was logged for

    def row_index(self, tid: str) -> int:
        """The index (in the run's rows) of the row a training task id (or a group id) was made from."""
        return row_of(tid, len(self.rows), self.cursor.seed, self.mixture)

    def take_skipped(self) -> int:
        """Draws passed over since the last call (buckets/skipped of a step)."""
        skipped, self.skipped = self.skipped, 0
        return skipped

    def take_probed(self) -> int:
        """Tasks published with a probe since the last call (tasks/probed of a step)."""
        probed, self.probed = self.probed, 0
        return probed

    def row(self, tid: str) -> PromptRow:
        """The row a training task id (or a group id) of this run was made from."""
        return self.rows[self.row_index(tid)]

    def publish(self, k: int, policy_version: int, batch: int, acct: Accounting) -> list[str]:
        """Publish the next `k` rows under `policy_version`; returns their task ids.

        The accounting is updated only after Redis accepted the whole batch, and the cursor
        advances with it: a failed XADD publishes nothing and loses nothing.
        """
        tracker = self.difficulty
        skip = tracker.skips if tracker is not None and tracker.rules.active else None
        taken = take_eligible(self.cursor, len(self.rows), k, self.mixture, skip)
        tasks = [self._task(i, task_id(self.run_id, key, self.stage), policy_version) for key, i in taken.picks]
        self.queue.publish_tasks(tasks)
        self.probed += sum(task.HasField("probe") for task in tasks)
        now = time.monotonic()
        for task in tasks:
            acct.publish(task.task_id, policy_version, batch, now)
        self.cursor, self.skipped = taken.cursor, self.skipped + taken.skipped
        if taken.exhausted and taken.cursor.epoch != self._exhausted_epoch:
            self._exhausted_epoch = taken.cursor.epoch
            log.warning("a whole epoch's worth of draws (%d) came up passed over: every row is set aside as easy, "
                        "hard or likely flat (difficulty buckets: skip_solved_after, set_aside_after, skip_flat_above, "
                        "bucket_weights), so they are drawn anyway; lower revisit_after_epochs, raise the streak "
                        "settings or skip_flat_above, or add rows", len(self.rows))  # fmt: skip
        log.debug("published %d task(s) under version %d (batch %d)", len(tasks), policy_version, batch)
        return [t.task_id for t in tasks]

    def _task(self, row: int, tid: str, policy_version: int) -> queue_pb2.PromptTask:
        """A training task of `row`; with adaptive group size it keeps its probe only where the row's record says
        the probe pays (DifficultyTracker.probes)."""
        task = build_task(self.rows[row], tid, policy_version, self.spec)
        if task.HasField("probe") and (self.difficulty is None or not self.difficulty.probes(row, task.sampling.n)):
            task.ClearField("probe")
        return task

    def value_task(
        self, group_id: str, tid: str, prefix: Sequence[int], policy_version: int, n: int
    ) -> queue_pb2.PromptTask:
        """A VinePPO value task: `n` continuations of the group's prompt followed by `prefix` (completion tokens),
        scored as the group's task is (without its steps). The continuation gets the task's whole max_new_tokens,
        not what the prefix left of it: identical sampling settings let the rollout batch every value task of a
        step into one engine call (per-prompt budgets in the engines would make it exact)."""
        task = build_task(self.row(group_id), tid, policy_version, self.spec)
        task.kind = "value"
        task.prompt.prefix_token_ids.extend(prefix)
        task.checks.ClearField("steps")
        task.ClearField("probe")  # a value estimate needs all n continuations, agreeing or not
        task.sampling.n = n
        return task

    def republish(self, tid: str, policy_version: int, acct: Accounting) -> None:
        """Publish an in-flight task again under the same id (its group came from discarded weights)."""
        task = self._task(self.row_index(tid), tid, policy_version)
        task.attempt = acct.in_flight[tid].regenerations + 1
        self.queue.publish_tasks([task])
        self.probed += task.HasField("probe")
        acct.republish(tid, policy_version, time.monotonic())
        log.info("task %s published again under version %d (its group came from discarded weights)", tid,
                 policy_version)  # fmt: skip
