"""Generate requests → checked engine inputs: sampling parameters and prompt token ids, or BadRequest naming the field.

Shared by both ways a request arrives (the gRPC servicer and the Redis queue's worker), so a task is
checked the same however it came; neither imports the other.
"""

from __future__ import annotations

import math

from grpo.rollout.engines.base import SamplingParams
from grpo.rollout.service import Limits, RolloutService
from grpo.v1 import rollout_pb2

# What a request that leaves sampling.temperature out gets: sampling, as vLLM and TRL default to (proto3's 0 would
# be greedy, and n greedy samples are n copies of one).
DEFAULT_TEMPERATURE = 1.0

# The sampler works in float32 (largest value ~3.4e38, smallest ~1.4e-45). logits / temperature overflows to inf
# (and softmax to NaN) once temperature < |logit| / 3.4e38, and a top_p under ~1e-45 is 0, which keeps no token.
# 1e-30 keeps logits up to ~3e8 finite, far above any model's, and refuses nothing that samples differently:
# a temperature that small is greedy already, as is any top_p below the top token's probability (>= 1 / vocab).
MIN_SAMPLING_VALUE = 1e-30


class BadRequest(ValueError):
    """A request the caller must fix (INVALID_ARGUMENT)."""


def sampling_params(msg: rollout_pb2.SamplingParams, limits: Limits) -> SamplingParams:
    """Checked engine parameters from the proto; raises BadRequest naming the field."""
    if msg.n < 1:
        raise BadRequest(f"sampling.n must be >= 1 (got {msg.n})")
    if msg.n > limits.max_n:
        raise BadRequest(f"sampling.n = {msg.n} is over this replica's limit of {limits.max_n}")
    temperature = msg.temperature if msg.HasField("temperature") else DEFAULT_TEMPERATURE
    if not (math.isfinite(temperature) and temperature >= 0):  # NaN passes `< 0`, and fails in sampling
        raise BadRequest(f"sampling.temperature must be a finite number >= 0 (got {temperature}); 0 means greedy")
    if 0 < temperature < MIN_SAMPLING_VALUE:
        raise BadRequest(f"sampling.temperature {temperature} is too small to sample with (float32 logits "
                         f"overflow); give 0 for greedy or at least {MIN_SAMPLING_VALUE}")  # fmt: skip
    if not 0 <= msg.top_p <= 1:
        raise BadRequest(f"sampling.top_p must be in (0, 1] (got {msg.top_p}); 0 means 1")
    if 0 < msg.top_p < MIN_SAMPLING_VALUE:
        raise BadRequest(f"sampling.top_p {msg.top_p} is too small to sample with in float32; give at least "
                         f"{MIN_SAMPLING_VALUE} (any top_p under the top token's probability keeps only that token)")  # fmt: skip
    if msg.top_k < 0:
        raise BadRequest(f"sampling.top_k must be >= 0 (got {msg.top_k}); 0 turns it off")
    if msg.max_new_tokens < 1:
        raise BadRequest(f"sampling.max_new_tokens must be >= 1 (got {msg.max_new_tokens})")
    if msg.max_new_tokens > limits.max_new_tokens_cap:
        raise BadRequest(
            f"sampling.max_new_tokens = {msg.max_new_tokens} is over the cap of {limits.max_new_tokens_cap}"
        )
    if any(not s for s in msg.stop):
        raise BadRequest("sampling.stop must not contain empty strings")
    return SamplingParams(
        n=msg.n,
        temperature=temperature,
        top_p=msg.top_p or 1.0,
        top_k=msg.top_k,
        max_new_tokens=msg.max_new_tokens,
        stop=tuple(msg.stop),
        seed=msg.seed if msg.HasField("seed") else None,
    )


def encode_prompts(service: RolloutService, prompts: list[rollout_pb2.Prompt], max_new_tokens: int) -> list[list[int]]:
    """Token ids of each prompt (and its prefix_token_ids, a begun answer to continue), checked against the
    context length."""
    if not prompts:
        raise BadRequest("prompts is empty: send at least one prompt")
    if len(prompts) > service.limits.max_prompts:
        raise BadRequest(f"{len(prompts)} prompts is over this replica's limit of {service.limits.max_prompts}")
    context = service.engine.max_context
    encoded = []
    for i, p in enumerate(prompts):
        if p.WhichOneof("kind") == "messages":
            if not p.messages.messages:
                raise BadRequest(f"prompts[{i}].messages is empty")
            prompt: str | list[dict[str, str]] = [{"role": m.role, "content": m.content} for m in p.messages.messages]
            chat = True
        else:
            if not p.text and not p.apply_chat_template:
                raise BadRequest(f"prompts[{i}] is empty: set text or messages")
            prompt, chat = p.text, p.apply_chat_template
        try:
            ids = service.encode(prompt, chat=chat)
        except Exception as exc:  # the tokenizer's refusal (no chat template, a template's own check) is the request's
            raise BadRequest(f"prompts[{i}] could not be encoded: {type(exc).__name__}: {exc}") from exc
        if not ids:
            raise BadRequest(f"prompts[{i}] has no tokens")
        prefix = list(p.prefix_token_ids)
        vocab = len(service.tokenizer)
        if any(not 0 <= t < vocab for t in prefix):
            bad = next(t for t in prefix if not 0 <= t < vocab)
            raise BadRequest(f"prompts[{i}].prefix_token_ids has {bad}, not a token id of this model (0..{vocab - 1})")
        ids = ids + prefix
        if len(ids) + max_new_tokens > context:
            raise BadRequest(
                f"prompts[{i}] has {len(ids)} tokens{' with its prefix_token_ids' if prefix else ''}; with "
                f"max_new_tokens {max_new_tokens} that exceeds "
                f"the model context of {context} tokens: shorten the prompt or lower max_new_tokens"
            )
        encoded.append(ids)
    return encoded
