"""Adaptive group size (a task's ProbeSpec): sample a few answers of a group first, the rest only where they disagree.

A group whose samples all agree has zero advantages: the trainer drops it, and every sample spent on it is lost.
A probe whose signal is flat is written as a group of probe.size samples (the trainer drops it as zero-variance, and
with refill replaces it); only a probe that varies is widened to G. With G = 8 and a probe of 4, a flat group then
costs 4 samples, not 8, but 4 samples agree by chance far more often than 8, so this pays only where flatness is
settled; the trainer sends a probe only with the tasks where it expects it to (difficulty.probe_pays). The cost is the
groups whose 4 agree by chance but whose 8 would not: for a prompt solved with chance p, p^4 - p^8 + (1-p)^4 - (1-p)^8,
up to a quarter of its groups (where p^4 = 1/2, p = 0.84).

"Flat" is the trainer's test (grpo.common.signal) on its zero_variance_on values, before reward_clip: clipping only
makes values equal, so a probe that varies here may still be dropped after widening, and one that is flat here is
flat there too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from grpo.common.signal import correctness, no_spread
from grpo.rollout.episodes.spec import Episode
from grpo.rollout.records import Generated
from grpo.v1 import queue_pb2, reward_pb2


def probing(tasks: Sequence[queue_pb2.PromptTask]) -> bool:
    """Whether this batch samples a probe first (its tasks share sampling and probe settings: records.batches)."""
    return bool(tasks) and tasks[0].HasField("probe") and 0 < tasks[0].probe.size < tasks[0].sampling.n


def probe_tasks(tasks: Sequence[queue_pb2.PromptTask]) -> list[queue_pb2.PromptTask]:
    """The tasks as their probes: probe.size samples each."""
    return [_with_n(task, task.probe.size, seed_offset=0) for task in tasks]


def rest_tasks(tasks: Sequence[queue_pb2.PromptTask]) -> list[queue_pb2.PromptTask]:
    """The rest of each group (sampling.n - probe.size samples). A seeded task samples them under seed + 1: under its
    own seed the engine would repeat the probe's answers."""
    return [_with_n(task, task.sampling.n - task.probe.size, seed_offset=1) for task in tasks]


def whole_tasks(tasks: Sequence[queue_pb2.PromptTask]) -> list[queue_pb2.PromptTask]:
    """The tasks as plain groups of sampling.n, without a probe."""
    out = []
    for task in tasks:
        whole = queue_pb2.PromptTask()
        whole.CopyFrom(task)
        whole.ClearField("probe")
        out.append(whole)
    return out


def _with_n(task: queue_pb2.PromptTask, n: int, seed_offset: int) -> queue_pb2.PromptTask:
    part = queue_pb2.PromptTask()
    part.CopyFrom(task)
    part.sampling.n = n
    if seed_offset and part.sampling.HasField("seed"):
        part.sampling.seed = part.sampling.seed + seed_offset
    return part


def results_of(task: queue_pb2.PromptTask, results: Sequence[reward_pb2.ScoreResult]) -> list[reward_pb2.ScoreResult]:
    """The task's results, in sample order (ids are "<task_id>/<i>", as records.score_items makes them)."""
    prefix = f"{task.task_id}/"
    mine = [r for r in results if r.id.startswith(prefix) and r.id[len(prefix) :].isdigit()]
    return sorted(mine, key=lambda r: int(r.id[len(prefix) :]))


def varies(results: Sequence[reward_pb2.ScoreResult], on: str) -> bool:
    """Whether a probe's samples disagree on the values the trainer's zero-variance filter compares: correctness
    scores (`accuracy`, when every sample has one) or rewards. A probe with an unscored sample is not widened: the
    trainer drops its group as unscored however many samples it has."""
    if on == "accuracy":
        scores = [correctness(r.components) for r in results]
        if scores and all(s is not None for s in scores):
            return not no_spread([s for s in scores if s is not None])
    if any(not r.HasField("reward") for r in results):
        return False
    return not no_spread([r.reward for r in results])


def model_tokens(completions: Sequence[Any]) -> int:
    """The tokens the model sampled in these completions (an episode's mask says which; else all)."""
    return sum(sum(c.token_mask) if isinstance(c, Episode) else len(c.token_ids) for c in completions)


def pick(generated: Generated, indices: Sequence[int]) -> Generated:
    """The prompts `indices` of an engine call's output."""
    return replace(
        generated,
        prompt_token_ids=[generated.prompt_token_ids[i] for i in indices],
        completions=[generated.completions[i] for i in indices],
    )


def joined(probe: Generated, rest: Generated) -> Generated:
    """Each prompt's probe samples followed by the rest of its group (both made by the same weights)."""
    if (probe.weight_version, probe.weight_checksum) != (rest.weight_version, rest.weight_checksum):
        raise ValueError(f"a group's probe (weights v{probe.weight_version}) and rest (v{rest.weight_version}) "
                         "come from different weights")  # fmt: skip
    completions = [list(a) + list(b) for a, b in zip(probe.completions, rest.completions, strict=True)]
    return replace(probe, completions=completions)


def renumbered(
    tasks: Sequence[queue_pb2.PromptTask], results: Sequence[reward_pb2.ScoreResult], first: int
) -> list[reward_pb2.ScoreResult]:
    """The rest's results with ids moved past the probe's ("<task_id>/<first + i>"), as in the joined group."""
    out = []
    for task in tasks:
        for i, result in enumerate(results_of(task, results)):
            moved = reward_pb2.ScoreResult()
            moved.CopyFrom(result)
            moved.id = f"{task.task_id}/{first + i}"
            out.append(moved)
    return out


def discarding(records: list[queue_pb2.GroupRecord], *thrown: Sampled) -> list[queue_pb2.GroupRecord]:
    """`records` (one per prompt of `thrown`) with the samples of `thrown` that were generated for them and are not
    in them counted as discarded: the rollouts' cost includes them."""
    for i, record in enumerate(records):
        for sampled in thrown:
            completions = sampled.generated.completions[i]
            record.discarded_samples += len(completions)
            record.discarded_tokens += model_tokens(completions)
    return records


@dataclass(frozen=True)
class Sampled:
    """One engine call and its scores: results None when the reward service failed (reward_error says how)."""

    generated: Generated
    results: list[reward_pb2.ScoreResult] | None
    reward_error: str
    generate_s: float
    score_s: float

    def subset(self, indices: Sequence[int]) -> Sampled:
        """The prompts `indices` (results are looked up by task id, so all of them may stay)."""
        return replace(self, generated=pick(self.generated, indices))

    def widened(self, rest: Sampled, tasks: Sequence[queue_pb2.PromptTask], probe_size: int) -> Sampled:
        """These probes of `tasks` joined with the rest of their groups (scored: rest.results is set)."""
        assert self.results is not None and rest.results is not None
        return Sampled(
            joined(self.generated, rest.generated),
            self.results + renumbered(tasks, rest.results, probe_size),
            "",
            self.generate_s + rest.generate_s,
            self.score_s + rest.score_s,
        )
