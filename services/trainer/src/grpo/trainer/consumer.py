"""Group records from Redis: deferred acks, and conversion to triage facts, samples and metrics (pure)."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from grpo.common.queue import Entry, RunQueue
from grpo.common.signal import correctness as correctness_of
from grpo.common.signal import no_spread
from grpo.trainer.accounting import GroupFacts
from grpo.v1 import queue_pb2

if TYPE_CHECKING:
    from grpo.algo import LossConfig
    from grpo.trainer.learner import TrainableSample

log = logging.getLogger(__name__)
# How an episode ends (EpisodeStats.end, proto/grpo/v1/queue.proto).
EPISODE_ENDS = ("answer", "max_turns", "max_tool_calls", "max_total_tokens", "length")
PEL_READ_COUNT = 1_000_000  # one read returns the whole pending list: it is bounded by checkpoint_every batches


def failure_reason(record: queue_pb2.GroupRecord, group_size: int, probe_size: int = 0) -> str:
    """Why triage called a group failed: the rollout's error, else what was wrong with the group itself."""
    if record.status != "ok":
        return record.error or f"status {record.status!r} with no error message"
    problem = mask_problem(record)
    if problem is not None:
        return problem
    if probe_size and len(record.samples) == probe_size:
        return f"a probe of {probe_size} samples whose signal varies came back without the rest of its group"
    return f"{len(record.samples)} samples where the group size is {group_size}"


def unscored_reason(record: queue_pb2.GroupRecord, steps: bool = False) -> str:
    """Why triage called a group unscored: the reward service's reason for its first sample without a reward, or
    (step credit) that a sample's steps were not all judged."""
    for i, s in enumerate(record.samples):
        if not s.HasField("reward"):
            return s.score_error or f"sample {i} has no reward and no reason (a rollout older than this trainer?)"
    for i, s in enumerate(record.samples):
        if steps and step_scores(s) is None:
            return f"sample {i}: its steps were not all judged and placed on its tokens (step credit needs them)"
    return "no samples" if not record.samples else "no reason found"


def mask_problem(record: queue_pb2.GroupRecord) -> str | None:
    """What is wrong with the group's episode token masks, None when nothing: a mask must have one entry per
    completion token, each 0 (environment) or 1 (model). Such a group is failed, never trained on a guess of which
    tokens were the model's."""
    for i, s in enumerate(record.samples):
        mask, n = s.token_mask, len(s.completion.token_ids)
        if not mask:
            continue
        if len(mask) != n:
            return f"sample {i}: a token mask of {len(mask)} entries for {n} completion tokens (a rollout bug)"
        bad = sorted(set(mask) - {0, 1})
        if bad:
            return f"sample {i}: token mask values {bad[:5]}; each must be 0 (environment) or 1 (model) (a rollout bug)"
    return None


def rewards_of(record: queue_pb2.GroupRecord, steps: bool = False) -> tuple[float | None, ...]:
    """Each sample's reward; None when it has none, or (`steps`: step credit) when a step score is missing."""
    return tuple(
        s.reward if s.HasField("reward") and (not steps or step_scores(s) is not None) else None for s in record.samples
    )


def step_scores(sample: queue_pb2.SampleRecord) -> list[float] | None:
    """The sample's step scores, None unless every step was judged (a finite score) and placed on its tokens (ends
    in order, inside the completion): such a sample is unscored, never trained on a guess."""
    ends, n_tokens = list(sample.step_token_ends), len(sample.completion.token_ids)
    if not sample.steps or len(ends) != len(sample.steps) or ends != sorted(ends) or ends[-1] > n_tokens:
        return None
    if not all(step.HasField("score") and math.isfinite(step.score) for step in sample.steps):
        return None
    return [step.score for step in sample.steps]


def facts_of(
    record: queue_pb2.GroupRecord,
    zero_variance_on: str = "reward",
    reward_clip: tuple[float, float] | None = None,
    steps: bool = False,
) -> GroupFacts:
    """Triage facts. With step credit (`steps`) a sample without judged steps is unscored, and a group whose
    rewards agree still has a signal when its step scores differ."""
    signal = zero_variance_signal(record, zero_variance_on, reward_clip)
    if steps and signal and max(signal) == min(signal):  # equal rewards: the step scores decide
        signal = tuple(score for s in record.samples for score in step_scores(s) or ()) or signal
    status = "failed" if record.status == "ok" and mask_problem(record) is not None else record.status
    return GroupFacts(
        record.group_id, status, int(record.weight_version), rewards_of(record, steps),
        int(record.policy_version), signal,
    )  # fmt: skip


def zero_variance_signal(
    record: queue_pb2.GroupRecord, on: str, reward_clip: tuple[float, float] | None
) -> tuple[float, ...]:
    """The values whose equality makes a group zero-variance: correctness scores (`accuracy`, when every sample
    has one), else the rewards clipped as `group_advantages` clips them (two rewards past the clip are equal)."""
    if on == "accuracy":
        scores = [correctness(s) for s in record.samples]
        if scores and all(c is not None for c in scores):
            return tuple(c for c in scores if c is not None)
    rewards = [s.reward for s in record.samples if s.HasField("reward")]
    if reward_clip is not None:
        lo, hi = reward_clip
        rewards = [min(max(r, lo), hi) for r in rewards]
    return tuple(rewards)


def correctness(sample: queue_pb2.SampleRecord) -> float | None:
    """The sample's correctness component score (math or code), None when there is none."""
    return correctness_of(sample.components)


def process_credit(record: queue_pb2.GroupRecord, outcome: Sequence[float], algo: LossConfig) -> list[list[float]]:
    """Per-token advantages of a group from its step scores (process supervision, grpo.algo.credit), mixed with
    the outcome advantages by algo.process_weight."""
    from grpo.algo import credit

    scores = [step_scores(s) for s in record.samples]
    if any(sc is None for sc in scores):
        raise ValueError(f"group {record.group_id}: a sample has no judged steps (triage keeps such groups out)")
    by_step = [sc for sc in scores if sc is not None]
    if algo.process_advantage not in credit.PROCESS_ADVANTAGES:
        raise ValueError(
            f"unknown process_advantage {algo.process_advantage!r}; one of {sorted(credit.PROCESS_ADVANTAGES)}"
        )
    advantages = credit.PROCESS_ADVANTAGES[algo.process_advantage]
    process = advantages(by_step, eps=algo.advantage_eps, std_unbiased=algo.std_unbiased)
    return [
        credit.token_advantages(
            credit.mix_advantages(out, steps, algo.process_weight), list(s.step_token_ends), len(s.completion.token_ids)
        )
        for s, out, steps in zip(record.samples, outcome, process, strict=True)
    ]


def step_metrics(records: Sequence[queue_pb2.GroupRecord]) -> dict[str, float]:
    """Mean step score and steps per completion over the trained groups (step credit only)."""
    scores = [step_scores(s) or [] for r in records for s in r.samples]
    flat = [x for sc in scores for x in sc]
    if not flat:
        return {}
    return {"step_score_mean": sum(flat) / len(flat), "steps_per_completion": len(flat) / len(scores)}


def to_samples(
    record: queue_pb2.GroupRecord,
    advantages: Sequence[float],
    token_advantages: Sequence[list[float]] | None = None,
) -> list[TrainableSample]:
    """One TrainableSample per completion of a kept group, with its advantage (and per-token ones, if given)."""
    from grpo.trainer.learner import TrainableSample

    prompt = list(record.prompt_token_ids)
    out = []
    per_token: Sequence[list[float] | None] = token_advantages or [None] * len(record.samples)
    for s, adv, tokens in zip(record.samples, advantages, per_token, strict=True):
        c = s.completion
        out.append(
            TrainableSample(
                prompt_token_ids=prompt,
                completion_token_ids=list(c.token_ids),
                advantage=float(adv),
                token_advantages=tokens,
                sampler_logprobs=list(c.logprobs) if len(c.logprobs) == len(c.token_ids) else None,
                truncated=c.finish_reason == "length",
                weight_version=int(record.weight_version),
                group_id=record.group_id,
                token_mask=list(s.token_mask) or None,  # empty: every token is the model's
            )
        )
    return out


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def model_tokens(sample: queue_pb2.SampleRecord) -> int:
    """The completion tokens the model sampled: an episode's mask says which; without one, all of them."""
    return sum(sample.token_mask) if sample.token_mask else len(sample.completion.token_ids)


def spend_metrics(settled: Sequence[Settled], probe_size: int = 0) -> dict[str, float]:
    """What a step's rollouts cost: `rollout/samples` and `rollout/tokens` (the model's tokens) over every group that
    settled its task (trained or dropped; duplicates and groups of discarded weights, rare, are not counted), and
    `groups/zero_variance_samples` / `_tokens` over those dropped as zero-variance, the rollouts spent for no
    gradient. Samples a group's rollout generated and threw away (`discarded_samples`: a probe whose weights changed
    before its rest, or whose rest could not be scored) count too. With adaptive group size, `groups/probe_flat`
    counts the zero-variance groups the rollout cut at the probe (probe_size samples)."""
    came = [(verdict, r) for _, verdict, r in settled if r is not None]
    flat = [r for verdict, r in came if verdict == "zero_variance"]

    def tokens(records: Sequence[queue_pb2.GroupRecord]) -> float:
        return float(
            sum(model_tokens(s) for r in records for s in r.samples) + sum(r.discarded_tokens for r in records)
        )

    out = {
        "rollout/samples": float(sum(len(r.samples) + r.discarded_samples for _, r in came)),
        "rollout/tokens": tokens([r for _, r in came]),
        "groups/zero_variance_samples": float(sum(len(r.samples) + r.discarded_samples for r in flat)),
        "groups/zero_variance_tokens": tokens(flat),
    }
    if probe_size:
        out["groups/probe_flat"] = float(sum(len(r.samples) == probe_size for r in flat))
    return out


def group_metrics(records: Sequence[queue_pb2.GroupRecord], prefix: str = "rollout") -> dict[str, float]:
    """Reward mean/std (total and per component), accuracy, lengths and truncation over `records`, and for episodes
    their turns, tool calls and ends (episode_metrics). A group with a malformed mask is failed: not described."""
    records = [r for r in records if mask_problem(r) is None]
    samples = [s for r in records for s in r.samples]
    if not samples:
        return {}
    out: dict[str, float] = {}
    rewards = [s.reward for s in samples if s.HasField("reward")]
    out[f"{prefix}/reward_mean"], out[f"{prefix}/reward_std"] = _mean_std(rewards)
    names = sorted({n for s in samples for n in s.components})
    for name in names:
        scores = [
            s.components[name].score for s in samples if name in s.components and s.components[name].HasField("score")
        ]
        out[f"{prefix}/reward/{name}_mean"], out[f"{prefix}/reward/{name}_std"] = _mean_std(scores)
    correct = [c for c in (correctness(s) for s in samples) if c is not None]
    if correct:
        out[f"{prefix}/accuracy"] = sum(1.0 for c in correct if c >= 1.0 - 1e-9) / len(correct)
    # The model's tokens only: an episode's tool output is not its response (episode_len_mean counts every token).
    lengths = [model_tokens(s) for s in samples]
    out[f"{prefix}/response_len_mean"] = sum(lengths) / len(lengths)
    out[f"{prefix}/response_len_max"] = float(max(lengths))
    out[f"{prefix}/truncation_rate"] = sum(s.completion.finish_reason == "length" for s in samples) / len(samples)
    out[f"{prefix}/generate_s_mean"] = sum(r.generate_s for r in records) / len(records)
    out.update(episode_metrics([s for s in samples if s.HasField("episode")], prefix))
    return out


def group_spread(records: Sequence[queue_pb2.GroupRecord], probe_size: int = 0) -> dict[str, float]:
    """How the reward spreads across the step's groups (grpo doctor's direct evidence of unbalanced prompts):
    `groups/all_solved_fraction` and `groups/none_solved_fraction`, the shares of groups with a correctness score on
    every sample whose samples are all right or all wrong; `groups/reward_mean_std`, the std of the groups' mean
    rewards (two groups at least, every sample rewarded). A key is absent when no group measures it. Groups cut at
    their probe (probe_size samples) are left out: 4 samples agree far more often than G, and the doctor compares
    these shares with what groups of G would give."""
    records = [r for r in records if r.samples and mask_problem(r) is None and len(r.samples) != probe_size]
    out: dict[str, float] = {}
    scored = [[correctness(s) for s in r.samples] for r in records]
    judged = [[c >= 1.0 - 1e-9 for c in cs if c is not None] for cs in scored if all(c is not None for c in cs)]
    if judged:
        out["groups/all_solved_fraction"] = sum(all(g) for g in judged) / len(judged)
        out["groups/none_solved_fraction"] = sum(not any(g) for g in judged) / len(judged)
    means = [sum(s.reward for s in r.samples) / len(r.samples) for r in records
             if all(s.HasField("reward") for s in r.samples)]  # fmt: skip
    if len(means) >= 2:
        out["groups/reward_mean_std"] = _mean_std(means)[1]
    return out


# (task type, triage verdict, the group; None when no group came: a timeout) of each task a step settled.
Settled = tuple[str, str, queue_pb2.GroupRecord | None]


def task_metrics(
    task_types: Sequence[str],
    settled: Sequence[Settled],
    *,
    zero_variance_on: str = "reward",
    reward_clip: tuple[float, float] | None = None,
    steps: bool = False,
) -> dict[str, float]:
    """task/<type>/* of one step, for a run whose data hold several task types (the rows' `task_type`).

    Each type gets, every step: `groups`, the tasks of that type the step settled (trained or dropped, as the
    groups/* counts; 0 when none); `zero_variance_fraction`, the share of its complete groups (status ok, every
    sample scored) whose signal has no spread, measured as triage measures it (zero_variance_on, reward_clip, step
    scores) whether or not the preset drops such groups (0 when it had none). When its groups came with samples:
    `reward_mean` over their samples' rewards, and `accuracy` (as rollout/accuracy: the share of samples whose
    correctness component, math or code, is 1) when they have such a component. A group with a malformed episode
    mask is counted, not described (as group_metrics)."""
    out: dict[str, float] = {}
    for task_type in task_types:
        mine = [(verdict, record) for t, verdict, record in settled if t == task_type]
        ok = [r for _, r in mine if r is not None and r.status == "ok" and mask_problem(r) is None]
        complete = [r for r in ok if r.samples and all(x is not None for x in rewards_of(r, steps))]
        flat = [r for r in complete if no_spread(facts_of(r, zero_variance_on, reward_clip, steps).signal)]
        prefix = f"task/{task_type}"
        out[f"{prefix}/groups"] = float(len(mine))
        out[f"{prefix}/zero_variance_fraction"] = len(flat) / len(complete) if complete else 0.0
        samples = [s for r in ok for s in r.samples]
        rewards = [s.reward for s in samples if s.HasField("reward")]
        if rewards:
            out[f"{prefix}/reward_mean"] = sum(rewards) / len(rewards)
        correct = [c for c in (correctness(s) for s in samples) if c is not None]
        if correct:
            out[f"{prefix}/accuracy"] = sum(1.0 for c in correct if c >= 1.0 - 1e-9) / len(correct)
    return out


def episode_metrics(episodes: Sequence[queue_pb2.SampleRecord], prefix: str) -> dict[str, float]:
    """Turns and tool calls per episode, the calls' success rate (the rollout counts every failed call in
    tool_errors, a timeout and a malformed call included), the step's timeouts and malformed calls, the share of each
    way an episode ended, the share of environment tokens, and the episodes' whole length (model and environment)."""
    if not episodes:
        return {}
    n = len(episodes)
    stats = [e.episode for e in episodes]
    calls = sum(st.tool_calls for st in stats)
    failed = sum(max(st.tool_errors, st.tool_timeouts) for st in stats)  # a timeout is an error too
    tokens = sum(len(e.completion.token_ids) for e in episodes)
    out = {
        f"{prefix}/turns_mean": sum(st.turns for st in stats) / n,
        f"{prefix}/tool_calls_mean": calls / n,
        f"{prefix}/tool_timeouts": float(sum(st.tool_timeouts for st in stats)),
        f"{prefix}/malformed_calls": float(sum(st.malformed_calls for st in stats)),
        f"{prefix}/episode_len_mean": tokens / n,
        f"{prefix}/env_token_share": (tokens - sum(model_tokens(e) for e in episodes)) / max(tokens, 1),
    }
    if calls:  # no calls: no rate (0 would read as every call failing)
        out[f"{prefix}/tool_success_rate"] = max(calls - failed, 0) / calls
    # Every known end every time (0 when none): a Prometheus gauge keeps its last value otherwise.
    for end in sorted(set(EPISODE_ENDS) | {st.end or "unknown" for st in stats}):
        out[f"{prefix}/episode_end/{end}"] = sum((st.end or "unknown") == end for st in stats) / n
    return out


class GroupReader:
    """Reads the trainer's groups: its own pending list first (after a restart), then new entries.

    Acks are deferred: `defer_ack` keeps an entry id until `ack_deferred`, which the run calls
    right after a checkpoint that records the entry's outcome (see accounting.py).
    """

    def __init__(self, queue: RunQueue, consumer: str) -> None:
        self.queue = queue
        self.consumer = consumer
        self.buffer: deque[Entry[queue_pb2.GroupRecord]] = deque()
        self.deferred: list[str] = []

    def recover_pending(self) -> int:
        """Queue the groups delivered to this consumer before a restart and never acked."""
        entries = self.queue.read_groups(self.consumer, PEL_READ_COUNT, own_pending=True)
        self.buffer.extend(entries)
        if entries:
            log.info("re-collected %d unacked group(s) from before the restart", len(entries))
        return len(entries)

    def next(self, block_ms: int) -> Entry[queue_pb2.GroupRecord] | None:
        """The next entry, waiting at most `block_ms`; None when nothing arrived."""
        if not self.buffer:
            self.buffer.extend(self.queue.read_groups(self.consumer, 64, block_ms=block_ms))
        return self.buffer.popleft() if self.buffer else None

    def ack_now(self, entry_id: str) -> None:
        self.queue.ack_groups([entry_id])

    def defer_ack(self, entry_id: str) -> None:
        self.deferred.append(entry_id)

    def ack_deferred(self) -> int:
        """Ack the deferred ids. They stay deferred until an ack goes through (XACK is idempotent): one lost
        would stay pending for the trainer's life and hold the groups stream's trim floor."""
        if not self.deferred:
            return 0
        acked = self.queue.ack_groups(self.deferred)
        self.deferred = []
        return acked
