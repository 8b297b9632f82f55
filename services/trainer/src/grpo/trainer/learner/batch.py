"""Trainable samples → length-sorted micro-batches with dynamic padding and completion masks (pure).

With packing, the samples of a micro-batch are laid end to end in fewer rows (pack_rows; the tensors in
grpo.trainer.learner.packing) while every per-sample quantity keeps this module's padded layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor


@dataclass(frozen=True)
class TrainableSample:
    """One scored completion, ready to train on (the orchestrator builds these from group records)."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    advantage: float
    sampler_logprobs: list[float] | None = None  # one per completion token, log_softmax(logits / T)
    token_advantages: list[float] | None = None  # one per completion token (step credit); overrides `advantage`
    truncated: bool = False  # finish_reason == "length"
    weight_version: int = 0  # the policy version that generated it
    group_id: str = ""
    # Episodes: one entry per completion token, 1 = sampled by the model (trained), 0 = written by the environment
    # (a tool result: never trained, never counted; its sampler log-prob is a placeholder). None: all the model's.
    token_mask: list[int] | None = None

    def model_tokens(self) -> int:
        """Completion tokens the model sampled (all of them, unless an episode's mask says otherwise)."""
        return len(self.completion_token_ids) if self.token_mask is None else sum(self.token_mask)


@dataclass(frozen=True)
class SftPair:
    """One cold-start example: the loss covers the response tokens only (and of those, with `response_mask`, the
    ones marked 1: a tool episode's assistant turns, not the tool results between them)."""

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_mask: list[int] | None = None


@dataclass
class MicroBatch:
    """Right-padded rows; position t of `targets` is predicted by the logits at t of `input_ids`.

    Shapes: input_ids/attention_mask [B, L]; targets/completion_mask/sampler_logp [B, L-1]
    (the shifted view: the token at t+1 predicted from the prefix up to t); advantages [B], or [B, L-1] when
    some sample has per-token advantages.

    Packed (grpo.trainer.learner.packing.collate_packed): input_ids/position_ids/targets are [R, W] / [R, W-1]
    rows holding several samples each, attention_mask is None (transformers then keeps attention inside each
    sample from the position ids), and `unpack` [B, L-1] maps the packed log-probs back onto the padded layout
    above, which completion_mask, sampler_logp and advantages keep: the loss sees one row per sample either way.
    """

    input_ids: Tensor
    attention_mask: Tensor | None
    targets: Tensor
    completion_mask: Tensor
    advantages: Tensor
    sampler_logp: Tensor | None
    weight_versions: list[int]
    n_tokens: int  # completion tokens that count in the loss
    n_sequences: int  # rows with at least one counted token
    position_ids: Tensor | None = None  # packed: restarting at 0 with each sample
    unpack: Tensor | None = None  # packed: [B, L-1] flat index into the packed [R, W-1] log-probs, -1 = none

    def to(self, device: torch.device) -> MicroBatch:
        move = {k: v.to(device) for k, v in vars(self).items() if isinstance(v, Tensor)}
        return MicroBatch(**{**vars(self), **move})


def sample_length(sample: TrainableSample | SftPair) -> int:
    tail = sample.completion_token_ids if isinstance(sample, TrainableSample) else sample.response_token_ids
    return len(sample.prompt_token_ids) + len(tail)


def split_by_tokens(lengths: list[int], max_samples: int, max_tokens: int | None) -> list[list[int]]:
    """Indices sorted by length, cut into runs of ≤ max_samples rows and ≤ max_tokens padded tokens.

    Sorting by length keeps rows of similar size together, so dynamic padding wastes little.
    """
    if max_samples < 1:
        raise ValueError(f"micro_batch_size must be ≥ 1, got {max_samples}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    chunks: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # sorted ascending: the newcomer is the longest, so the padded size is its length × rows
        padded = lengths[i] * (len(current) + 1)
        if current and (len(current) >= max_samples or (max_tokens is not None and padded > max_tokens)):
            chunks.append(current)
            current = []
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


def pack_rows(lengths: list[int], row_len: int) -> list[list[int]]:
    """First-fit decreasing: indices of `lengths` in rows of at most `row_len` tokens (a longer sample gets a row
    of its own; no sample is ever split). Longest first, ties by index, so a permuted batch packs alike."""
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, used in enumerate(fill):
            if used + lengths[i] <= row_len:
                rows[r].append(i)
                fill[r] += lengths[i]
                break
        else:
            rows.append([i])
            fill.append(lengths[i])
    return rows


def packed_shape(longest: int, micro_batch_size: int, max_tokens: int | None) -> tuple[int, int]:
    """(row length, rows per micro-batch) of packed micro-batches: as many rows as the padded path would give
    its longest samples (micro_batch_size, fewer when max_tokens holds fewer), each row the longest sample's
    length stretched to fill max_tokens. So a forward never holds more tokens than max_tokens (or the padded
    path's micro-batch of longest samples), and rows stay about as long as the longest sample: eager attention
    holds a row's T×T weights, so one row of all the tokens would cost far more memory."""
    if max_tokens is None:
        return longest, micro_batch_size
    rows = max(1, min(micro_batch_size, max_tokens // longest))
    return max(longest, max_tokens // rows), rows


def pack_micro_batches(
    lengths: list[int], *, row_len: int, max_rows: int, max_tokens: int | None
) -> list[list[list[int]]]:
    """Micro-batches of packed rows: rows of ≤ row_len tokens (pack_rows), then ≤ max_rows rows and ≤ max_tokens
    padded tokens per micro-batch (split_by_tokens over the rows' fills). Each micro-batch: its rows' indices."""
    rows = pack_rows(lengths, row_len)
    fills = [sum(lengths[i] for i in row) for row in rows]
    return [[rows[r] for r in chunk] for chunk in split_by_tokens(fills, max_rows, max_tokens)]


# packing "auto" packs a batch when packing cuts the token positions the model computes by at least this share.
# A packed row is as long as the longest sample and eager attention computes every pair in it, so a small cut buys
# nothing (bench_packing.py: 20 % fewer positions ran 1.07×, 47 % fewer 2.01×).
AUTO_PACKING_MIN_CUT = 0.3


def packing_pays(lengths: list[int], micro_batch_size: int, max_tokens: int | None) -> bool:
    """Does packing cut the token positions of this batch's forward passes by AUTO_PACKING_MIN_CUT? Judged on the
    whole batch as one process would run it, so every rank count decides alike."""
    ordered = sorted(lengths)
    padded = sum(len(c) * max(ordered[i] for i in c) for c in split_by_tokens(ordered, micro_batch_size, max_tokens))
    row_len, max_rows = packed_shape(max(lengths), micro_batch_size, max_tokens)
    mbs = pack_micro_batches(lengths, row_len=row_len, max_rows=max_rows, max_tokens=max_tokens)
    packed = sum(len(mb) * max(sum(lengths[i] for i in row) for row in mb) for mb in mbs)
    return packed <= (1.0 - AUTO_PACKING_MIN_CUT) * padded


def check_sample(s: TrainableSample) -> None:
    """Raise ValueError for a sample no collation can represent (checked on the whole batch before sharding)."""
    if not s.prompt_token_ids:
        raise ValueError(f"sample of group {s.group_id!r} has an empty prompt: nothing predicts its first token")
    lp, c = s.sampler_logprobs, len(s.completion_token_ids)
    if lp is not None and len(lp) != c:
        raise ValueError(f"group {s.group_id!r}: {len(lp)} sampler log-probs for {c} completion tokens")
    if s.token_advantages is not None and len(s.token_advantages) != c:
        raise ValueError(f"group {s.group_id!r}: {len(s.token_advantages)} token advantages for {c} completion tokens")
    if s.token_mask is not None:
        if len(s.token_mask) != c:
            raise ValueError(f"group {s.group_id!r}: a token mask of {len(s.token_mask)} entries for {c} completion "
                             "tokens")  # fmt: skip
        if any(m not in (0, 1) for m in s.token_mask):
            raise ValueError(f"group {s.group_id!r}: token mask values must be 0 (environment) or 1 (model), got "
                             f"{sorted(set(s.token_mask) - {0, 1})}")  # fmt: skip


def collate(samples: list[TrainableSample], pad_id: int, mask_truncated: bool) -> MicroBatch:
    """Right-pad `samples` to their longest row; the mask marks completion tokens only, and of an episode's, the
    model's (its token_mask): environment tokens are neither trained nor counted (n_tokens, n_sequences).

    mask_truncated: a completion cut by the length limit contributes no token (DAPO overlong masking).
    """
    width = max(sample_length(s) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.float32)
    sampler = torch.zeros((n, width - 1), dtype=torch.float32)
    have_sampler = all(s.sampler_logprobs is not None for s in samples)
    per_token = any(s.token_advantages is not None for s in samples)
    advantages = torch.zeros((n, width - 1)) if per_token else torch.tensor([s.advantage for s in samples])
    for row, s in enumerate(samples):
        check_sample(s)
        p, c = len(s.prompt_token_ids), len(s.completion_token_ids)
        input_ids[row, : p + c] = torch.tensor(s.prompt_token_ids + s.completion_token_ids, dtype=torch.long)
        attention[row, : p + c] = 1
        if not (mask_truncated and s.truncated):
            own = [1.0] * c if s.token_mask is None else [float(m) for m in s.token_mask]
            mask[row, p - 1 : p - 1 + c] = torch.tensor(own, dtype=torch.float32)
        if have_sampler:
            sampler[row, p - 1 : p - 1 + c] = torch.tensor(s.sampler_logprobs or [], dtype=torch.float32)
        if per_token:
            own = s.token_advantages if s.token_advantages is not None else [s.advantage] * c
            advantages[row, p - 1 : p - 1 + c] = torch.tensor(own, dtype=torch.float32)
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        targets=input_ids[:, 1:].clone(),
        completion_mask=mask,
        advantages=advantages.float(),
        sampler_logp=sampler if have_sampler else None,
        weight_versions=[s.weight_version for s in samples],
        n_tokens=int(mask.sum().item()),
        n_sequences=int((mask.sum(dim=1) > 0).sum().item()),
    )


def build_micro_batches(
    samples: list[TrainableSample],
    *,
    micro_batch_size: int,
    pad_id: int,
    mask_truncated: bool = True,
    max_tokens: int | None = None,
) -> list[MicroBatch]:
    """The whole batch as length-sorted, dynamically padded micro-batches."""
    if not samples:
        raise ValueError("cannot train on an empty batch")
    chunks = split_by_tokens([sample_length(s) for s in samples], micro_batch_size, max_tokens)
    return [collate([samples[i] for i in chunk], pad_id, mask_truncated) for chunk in chunks]


def counted_tokens(sample: TrainableSample, mask_truncated: bool) -> int:
    """Completion tokens of `sample` that count in the loss (collate's mask, without building it): the model's."""
    return 0 if (mask_truncated and sample.truncated) else sample.model_tokens()


@dataclass(frozen=True)
class RankPlan:
    """One rank's share of a batch every rank holds in full (computed identically on each rank, no messages).

    chunks: this rank's micro-batches as indices into the batch (packed: in row order; `rows` then holds each
    micro-batch's rows, None when padded). steps: forward/backward passes every
    rank makes — the most any rank needs; ZeRO reduces gradients (and ZeRO-3 gathers parameters) inside
    each pass, so a rank with fewer micro-batches pads with passes that weigh nothing. total_tokens /
    total_sequences: the whole batch's normalisers, so the loss is the one-process loss on any rank count.
    """

    chunks: list[list[int]]
    steps: int
    total_tokens: int
    total_sequences: int
    rows: list[list[list[int]]] | None = None


def plan_rank(
    samples: list[TrainableSample],
    *,
    rank: int,
    world_size: int,
    micro_batch_size: int,
    max_tokens: int | None,
    mask_truncated: bool,
    packing: bool | Literal["auto"] = False,
) -> RankPlan:
    """Deal length-sorted samples round robin over ranks (similar token counts each), then micro-batch each share.

    packing: each share is packed into rows (pack_micro_batches) of the size packed_shape gives; "auto": when
    packing_pays for the batch.
    """
    if not samples:
        raise ValueError("cannot train on an empty batch")
    for s in samples:  # every rank raises, or none: one rank alone would leave the others waiting
        check_sample(s)
    lengths = [sample_length(s) for s in samples]
    if packing == "auto":
        packing = packing_pays(lengths, micro_batch_size, max_tokens)
    order = sorted(range(len(samples)), key=lambda i: (lengths[i], i))
    per_rank: list[list[list[list[int]]]] = []  # rank → micro-batch → row → sample index
    for r in range(world_size):
        share = order[r::world_size]
        share_lengths = [lengths[i] for i in share]
        if packing:
            row_len, max_rows = packed_shape(max(lengths), micro_batch_size, max_tokens)
            mbs = pack_micro_batches(share_lengths, row_len=row_len, max_rows=max_rows, max_tokens=max_tokens)
        else:
            mbs = [[[j] for j in chunk] for chunk in split_by_tokens(share_lengths, micro_batch_size, max_tokens)]
        per_rank.append([[[share[j] for j in row] for row in mb] for mb in mbs])
    counted = [counted_tokens(s, mask_truncated) for s in samples]
    mine = per_rank[rank]
    return RankPlan(
        chunks=[[i for row in mb for i in row] for mb in mine],
        steps=max(len(mbs) for mbs in per_rank),
        total_tokens=sum(counted),
        total_sequences=sum(1 for n in counted if n > 0),
        rows=mine if packing else None,
    )


def sft_to_samples(pairs: list[SftPair]) -> list[TrainableSample]:
    """SFT pairs reuse the GRPO collation: the response is the 'completion' (its mask the token mask), nothing is
    truncated."""
    return [
        TrainableSample(p.prompt_token_ids, p.response_token_ids, advantage=0.0, token_mask=p.response_mask)
        for p in pairs
    ]


def micro_batch_weight(agg: str, mb: MicroBatch, total_tokens: int, total_sequences: int) -> float:
    """Share of the full-batch loss a micro-batch's (micro-batch-normalised) loss stands for.

    Summing weight·loss over micro-batches reproduces the loss of one big batch exactly: token_mean
    normalises by tokens, the per-sequence aggregations by the number of non-empty sequences.
    """
    if agg == "token_mean":
        return mb.n_tokens / max(total_tokens, 1)
    return mb.n_sequences / max(total_sequences, 1)
