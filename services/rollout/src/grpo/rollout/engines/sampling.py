"""Token sampling and stop-string helpers for engines that run their own decoding loop."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from grpo.rollout.engines.base import SamplingParams


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(next tokens [B], their log-probs [B]) from last-position logits [B, V].

    The log-prob is grpo.common.logprobs.token_logprobs (the trainer's own definition) of the sampled
    token at the sampling temperature, taken before top-k/top-p truncation; temperature 0 is greedy
    and its log-probs use temperature 1.
    """
    import torch

    from grpo.common.logprobs import token_logprobs

    logits = logits.float()
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
        return tokens, token_logprobs(logits[:, None], tokens[:, None])[:, 0]
    filtered = truncate(logits / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(filtered, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, token_logprobs(logits[:, None], tokens[:, None], params.temperature)[:, 0]


def prompt_seed(seed: int, index: int) -> int:
    """The seed of the generator of prompt `index` in a request seeded with `seed`: its samples then depend on
    neither the other prompts nor their number (as vLLM's per-request seed). Hashed so that neighbouring seeds
    and indices give unrelated streams, and any int64 seed (negative too) gives a valid torch seed."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits: within every torch generator's range


def sample_grouped(
    logits: torch.Tensor, params: SamplingParams, groups: Sequence[tuple[list[int], torch.Generator]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_tokens` for each group of batch rows (one prompt's live samples) with the group's own generator,
    so what a prompt draws does not depend on the rows around it. Rows in no group (finished, waiting for the
    batch to be compacted) get their argmax and log-prob 0: they are never read."""
    import torch

    tokens = logits.argmax(dim=-1)
    logps = torch.zeros(tokens.shape, dtype=torch.float32, device=logits.device)
    for rows, generator in groups:
        index = torch.tensor(rows, device=logits.device)
        tokens[index], logps[index] = sample_tokens(logits[index], params, generator)
    return tokens, logps


def truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits with everything outside top-k and the top-p nucleus set to -inf."""
    import torch

    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if 0 < top_p < 1:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already cover top_p (the first always stays).
        drop = (probs.cumsum(dim=-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(1, order, sorted_logits)
    return scaled


def stop_token_ids(tokenizer: Any, stops: Sequence[str]) -> set[int]:
    """Ids of the stop strings that are exactly one special token (e.g. "<|im_start|>").

    Completions are decoded with skip_special_tokens, so such a stop string never shows up in the text to be
    matched there: it is matched by its token id instead, as an EOS token is. Added tokens that decode as text
    (e.g. "</answer>") are found in the text already."""
    ids = set()
    for stop in stops:
        encoded = tokenizer.encode(stop, add_special_tokens=False)
        if len(encoded) == 1 and tokenizer.decode(encoded, skip_special_tokens=True) == "":
            ids.add(int(encoded[0]))
    return ids


def stop_window(stops: Sequence[str]) -> int:
    """How many trailing tokens to decode to see any of `stops` appear: a byte-level token holds at least one
    byte, so a stop string takes at most its UTF-8 length in tokens ("答案是" is 3 characters and 9 tokens in
    Qwen2's vocabulary); the margin covers a stop string that starts inside a token."""
    return max((len(s.encode("utf-8")) for s in stops), default=0) + 4


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """End index of the earliest stop string in `text` (text is cut there, stop included), or None."""
    best: int | None = None
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and (best is None or at + len(stop) < best):
            best = at + len(stop)
    return best
