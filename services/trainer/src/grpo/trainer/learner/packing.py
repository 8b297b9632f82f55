"""Packed micro-batches: several samples per row, attention kept inside each sample, the loss in padded layout.

The model sees rows of samples laid end to end, with position ids restarting at 0 for each sample and no
attention mask; transformers (masking_utils.find_packed_sequence_indices, and flash-attention's varlen path)
reads the sample boundaries from the position ids, so no token attends across them. The logits at a sample's
last token (which would "predict" the next sample's first token) are never gathered. Everything per sample —
completion mask, sampler log-probs, advantages, the sequence counts of the aggregations — stays in the padded
layout of batch.collate, and `unpack` carries the packed log-probs into it, so the loss code is the padded one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.trainer.learner.batch import MicroBatch, TrainableSample, collate, sample_length


def collate_packed(rows: list[list[TrainableSample]], pad_id: int, mask_truncated: bool) -> MicroBatch:
    """`rows` of samples as one packed micro-batch; sample j (in row order) is row j of the padded fields."""
    samples = [s for row in rows for s in row]
    padded = collate(samples, pad_id, mask_truncated)  # masks, advantages, sampler log-probs, counts per sample
    width = max(sum(sample_length(s) for s in row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    # Padding at a row's end gets its own run of positions: a segment of its own, after every real token.
    position_ids = torch.arange(width).repeat(len(rows), 1)
    unpack = torch.full(padded.completion_mask.shape, -1, dtype=torch.long)
    j = 0
    for r, row in enumerate(rows):
        offset = 0
        for s in row:
            n = sample_length(s)
            input_ids[r, offset : offset + n] = torch.tensor(s.prompt_token_ids + s.completion_token_ids)
            position_ids[r, offset : offset + n] = torch.arange(n)
            # the logits at packed t predict the token at t+1: a sample's n-1 targets start at its offset
            unpack[j, : n - 1] = r * (width - 1) + offset + torch.arange(n - 1)
            offset += n
            j += 1
        position_ids[r, offset:] = torch.arange(width - offset)
    padded.input_ids = input_ids
    padded.attention_mask = None
    padded.targets = input_ids[:, 1:].clone()
    padded.position_ids = position_ids
    padded.unpack = unpack
    return padded


def unpack_tokens(packed: Tensor, index: Tensor) -> Tensor:
    """Per-token values [R, W-1] of packed rows → [B, L-1] per sample (0 where the sample has no token)."""
    flat = packed.reshape(-1)[index.clamp(min=0)]
    return torch.where(index >= 0, flat, torch.zeros((), dtype=flat.dtype, device=flat.device))


@torch.no_grad()
def check_packed_attention(model: torch.nn.Module, device: torch.device) -> None:
    """Raise ValueError unless `model` keeps attention inside packed samples (run once, at start-up, on every rank).

    Packing relies on the model's code reading sample boundaries from the position ids (transformers' own models
    do); a model that ignores them would let samples attend to each other, silently. Two short samples packed
    in one row must give the logits of each run alone, much closer than the same row without the restart.
    """
    a, b = [5, 17, 30, 41, 9], [7, 8, 99, 3]
    ids = torch.tensor([a + b], device=device)
    restart = torch.tensor([list(range(len(a))) + list(range(len(b)))], device=device)
    alone = torch.cat([_logits(model, torch.tensor([s], device=device), None) for s in (a, b)], dim=1)
    packed = (_logits(model, ids, restart) - alone)[0, len(a) :].abs().max()
    crossed = (_logits(model, ids, None) - alone)[0, len(a) :].abs().max()
    if not packed <= 0.1 * crossed:
        raise ValueError(
            f"packing: this model lets packed samples attend to each other (a packed sample's logits differ by "
            f"{float(packed):.3g} from the sample alone, {float(crossed):.3g} without position ids); its code does "
            "not read sample boundaries from position_ids: set packing: false"
        )


def _logits(model: torch.nn.Module, ids: Tensor, position_ids: Tensor | None) -> Tensor:
    return model(input_ids=ids, position_ids=position_ids, use_cache=False).logits.float()
