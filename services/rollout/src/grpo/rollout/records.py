"""The rollout worker's pure parts: score items, group records and engine batches from tasks and engine output."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grpo.common.queue import Entry
from grpo.rollout.episodes.spec import Episode
from grpo.v1 import queue_pb2, reward_pb2


@dataclass
class Generated:
    """One engine call's output, as the worker needs it."""

    prompt_token_ids: list[list[int]]
    completions: list[list[Any]]  # per prompt: objects with text, token_ids, logprobs, finish_reason; or Episodes
    weight_version: int
    weight_checksum: str
    decode: Callable[[list[int]], str] | None = None  # the engine's detokenizer, to place step ends on tokens


def token_ends(
    decode: Callable[[list[int]], str], token_ids: Sequence[int], text: str, char_ends: Sequence[int]
) -> list[int]:
    """For each character offset of the completion `text`, the fewest tokens whose decoded text reaches it.

    "Reaches" means the decoded prefix starts with text[:end]: a token holding only part of a character (byte-level
    BPE, byte fallback) decodes to U+FFFD, which does not match, so the character's last byte is counted in. (Should
    the engine's text not be a decoding of these tokens, character counts are compared instead.) Binary search on
    decoded prefixes, from the previous end on when the ends are sorted: about log2(T) decodes per end.
    """
    ids = list(token_ids)
    exact = decode(ids).startswith(text)

    def reaches(k: int, end: int) -> bool:
        decoded = decode(ids[:k])
        return decoded.startswith(text[:end]) if exact else len(decoded) >= end

    out: list[int] = []
    previous, floor = -1, 0
    for end in char_ends:
        lo, hi = (floor if end >= previous else 0), len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if reaches(mid, end):
                hi = mid
            else:
                lo = mid + 1
        out.append(lo)
        previous, floor = end, lo
    return out


def score_items(tasks: Sequence[queue_pb2.PromptTask], generated: Generated) -> list[reward_pb2.ScoreItem]:
    """One ScoreItem per completion, id "<task_id>/<i>"; overlong checks get the exact token count.

    An episode is scored on its final answer, the text of the model's last turn (a tool's output is never the
    answer, nor is a call in that turn: Episode.answer); its overlong check counts all its tokens, the
    environment's included."""
    items = []
    for task, completions in zip(tasks, generated.completions, strict=True):
        prompt = prompt_text(task)
        # A value task continues a begun answer: the whole answer (prefix + continuation, decoded together so a
        # character split across the boundary survives) is what gets scored.
        begun = list(task.prompt.prefix_token_ids)
        decode = generated.decode
        for i, c in enumerate(completions):
            if isinstance(c, Episode):
                text = c.answer
            else:
                text = decode(begun + list(c.token_ids)) if begun and decode is not None else c.text
            checks = reward_pb2.Checks()
            checks.CopyFrom(task.checks)
            if checks.HasField("overlong") and not checks.overlong.HasField("completion_tokens"):
                checks.overlong.completion_tokens = len(begun) + len(c.token_ids)
            items.append(
                reward_pb2.ScoreItem(
                    id=f"{task.task_id}/{i}",
                    prompt=prompt,
                    completion=text,
                    checks=checks,
                    weights=task.weights,
                )
            )
    return items


def prompt_text(task: queue_pb2.PromptTask) -> str:
    """The prompt as text for the reward service (language detection reads it)."""
    if task.prompt.HasField("messages"):
        return "\n".join(m.content for m in task.prompt.messages.messages)
    return task.prompt.text


def base_record(task: queue_pb2.PromptTask, replica_id: str) -> queue_pb2.GroupRecord:
    return queue_pb2.GroupRecord(
        group_id=task.task_id,
        task_id=task.task_id,
        policy_version=task.policy_version,
        replica_id=replica_id,
        eval=task.eval,
        kind=task.kind,
    )


def failed_record(task: queue_pb2.PromptTask, replica_id: str, error: str) -> queue_pb2.GroupRecord:
    record = base_record(task, replica_id)
    record.status, record.error = "failed", error
    return record


def group_records(
    tasks: Sequence[queue_pb2.PromptTask],
    generated: Generated,
    results: Sequence[reward_pb2.ScoreResult] | None,
    *,
    replica_id: str,
    generate_s: float,
    score_s: float,
    reward_error: str = "",
) -> list[queue_pb2.GroupRecord]:
    """One group per task; without `results` (the reward service failed) every group is failed, unscored."""
    by_id = {r.id: r for r in results or ()}
    records = []
    for t, task in enumerate(tasks):
        record = base_record(task, replica_id)
        record.weight_version, record.weight_checksum = generated.weight_version, generated.weight_checksum
        record.prompt_token_ids.extend(generated.prompt_token_ids[t])
        record.generate_s, record.score_s = generate_s, score_s
        record.status, record.error = ("ok", "") if results is not None else ("failed", reward_error)
        for i, c in enumerate(generated.completions[t]):
            sample = record.samples.add()
            sample.completion.text, sample.completion.finish_reason = c.text, c.finish_reason
            sample.completion.token_ids.extend(c.token_ids)
            sample.completion.logprobs.extend(c.logprobs)
            if isinstance(c, Episode):
                sample.token_mask.extend(c.token_mask)
                sample.episode.CopyFrom(c.stats)
            result = by_id.get(f"{task.task_id}/{i}")
            if result is None:
                continue
            if result.HasField("reward"):
                sample.reward = result.reward
            else:  # the trainer drops the group as unscored: it says why, with the service's own words
                sample.score_error = result.error or f"no reward (status {result.status!r}, no error message)"
            for name, component in result.components.items():
                sample.components[name].CopyFrom(component)
            if result.steps:
                sample.steps.extend(result.steps)
                if generated.decode is not None:
                    sample.step_token_ends.extend(_step_token_ends(generated.decode, c, result.steps))
        if results is not None and any(f"{task.task_id}/{i}" not in by_id for i in range(len(record.samples))):
            record.status, record.error = "failed", "reward service returned no result for some samples"
        records.append(record)
    return records


def _step_token_ends(decode: Callable[[list[int]], str], c: Any, steps: Sequence[reward_pb2.StepScore]) -> list[int]:
    """Step ends on the completion's tokens; an episode's steps lie in its final answer, whose tokens begin at
    answer_start."""
    ends = [step.end for step in steps]
    if isinstance(c, Episode):
        answer = c.token_ids[c.answer_start :]
        return [c.answer_start + k for k in token_ends(decode, answer, c.answer, ends)]
    return token_ends(decode, c.token_ids, c.text, ends)


def batches(
    entries: Sequence[Entry[queue_pb2.PromptTask]], size: int, eval_size: int | None = None
) -> list[list[Entry[queue_pb2.PromptTask]]]:
    """Tasks with identical sampling params (and episode and probe rules), in arrival order, at most `size` per
    engine call (evaluation tasks: `eval_size`, by default `size`)."""
    by_params: dict[tuple[bytes, bytes | None, bytes | None], list[list[Entry[queue_pb2.PromptTask]]]] = {}
    for entry in entries:
        assert entry.message is not None
        task = entry.message
        # Episodes never share an engine call with single-turn tasks, nor with other rules.
        episode = task.episode.SerializeToString(deterministic=True) if task.HasField("episode") else None
        probe = task.probe.SerializeToString(deterministic=True) if task.HasField("probe") else None
        key = (task.sampling.SerializeToString(deterministic=True), episode, probe)
        groups = by_params.setdefault(key, [[]])
        if len(groups[-1]) == (eval_size or size if task.eval else size):
            groups.append([])
        groups[-1].append(entry)
    return [b for groups in by_params.values() for b in groups]
