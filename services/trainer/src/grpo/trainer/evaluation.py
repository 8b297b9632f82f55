"""Periodic evaluation: held-out prompts as `eval` tasks through the queue (scored by the same path), accuracy out.

Going through the queue rather than direct Generate + Score calls means evaluation uses exactly the
rollout and reward code that training uses, needs no extra addresses, and survives a replica dying
(its tasks are reclaimed). Eval tasks are never trained on and are not part of the task accounting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from grpo.common.queue import Entry
from grpo.trainer.consumer import GroupReader, group_metrics
from grpo.trainer.data import PromptRow
from grpo.trainer.publisher import TaskSpec, build_task
from grpo.v1 import queue_pb2

log = logging.getLogger(__name__)


def eval_rows(rows: Sequence[PromptRow], size: int) -> list[PromptRow]:
    """The first `size` held-out rows: the same prompts every time, so evaluations are comparable."""
    return list(rows[: min(size, len(rows))])


def evaluate(
    reader: GroupReader,
    rows: Sequence[PromptRow],
    spec: TaskSpec,
    *,
    run_id: str,
    round_id: str,
    policy_version: int,
    temperature: float,
    timeout_s: float,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[str, float]:
    """Publish one eval task per row, wait (≤ timeout_s) for their groups, return eval/* metrics.

    Training groups that arrive meanwhile are handed back to the reader untouched.
    """
    ids = [f"{run_id}-eval{round_id}-{i}" for i in range(len(rows))]
    tasks = [
        build_task(row, tid, policy_version, spec, evaluation=True, eval_temperature=temperature)
        for row, tid in zip(rows, ids, strict=True)
    ]
    reader.queue.publish_tasks(tasks)
    wanted = set(ids)
    got: dict[str, queue_pb2.GroupRecord] = {}
    others: list[Entry[queue_pb2.GroupRecord]] = []
    start = time.monotonic()
    deadline = start + timeout_s
    while wanted - set(got) and time.monotonic() < deadline and not should_stop():
        entry = reader.next(block_ms=500)
        if entry is None:
            continue
        record = entry.message
        if record is not None and record.eval:
            if record.group_id in wanted:
                got[record.group_id] = record
            reader.ack_now(entry.entry_id)  # eval groups carry no training state
        else:
            others.append(entry)
    reader.buffer.extendleft(reversed(others))
    ok = [r for r in got.values() if r.status == "ok"]
    metrics = group_metrics(ok, prefix="eval")
    metrics["eval/completed"] = float(len(ok))
    metrics["eval/missing"] = float(len(ids) - len(got))
    metrics["eval/failed"] = float(len(got) - len(ok))
    metrics["eval/wall_s"] = time.monotonic() - start
    log.info(
        "eval round %s: accuracy %.3f reward %.3f (%d/%d groups)",
        round_id,
        metrics.get("eval/accuracy", float("nan")),
        metrics.get("eval/reward_mean", float("nan")),
        len(ok),
        len(ids),
    )
    return metrics
