"""The transformers engine on the tiny model: cancellation, last-position logits, per-prompt seeds, and stop
strings that are a special token or take more tokens than characters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.rollout.engines.base import GenerationCancelled, SamplingParams
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.engines.sampling import stop_token_ids
from grpo.rollout.engines.vllm import to_vllm_params


@pytest.fixture(scope="module")
def engine() -> Iterator[HFEngine]:
    e = HFEngine(str(ensure_tiny_model()), torch_threads=1)
    yield e
    e.close()


def _encode(engine: HFEngine, text: str) -> list[int]:
    return list(engine.tokenizer.encode(text, add_special_tokens=False))


@contextmanager
def _model_outputs(engine: HFEngine, hook: Any) -> Iterator[None]:
    """`hook(module, inputs, output)` on the real model's lm_head for the duration."""
    handle = engine.model.lm_head.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def _forcing(engine: HFEngine, forced: list[int]) -> Iterator[None]:
    """The model's k-th decoding step (counting the prefill) puts all its weight on forced[k]: a known text."""
    calls = [0]

    def hook(module: Any, inputs: Any, out: torch.Tensor) -> torch.Tensor:
        k = min(calls[0], len(forced) - 1)
        calls[0] += 1
        out = torch.full_like(out, -1e4)
        out[..., forced[k]] = 0.0
        return out

    with _model_outputs(engine, hook):
        yield


def test_a_call_whose_caller_went_away_stops_within_a_step(engine: HFEngine) -> None:
    forwards = [0]

    def count(module: Any, inputs: Any, out: torch.Tensor) -> None:
        forwards[0] += 1

    asked = [0]

    def wanted() -> bool:  # the caller goes away after the 3rd check
        asked[0] += 1
        return asked[0] <= 3

    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=200, seed=0)
    with _model_outputs(engine, count), pytest.raises(GenerationCancelled, match="went away"):
        engine.generate([_encode(engine, "Ana has 5 pens.")], params, wanted=wanted)
    assert forwards[0] <= 3, f"{forwards[0]} forward passes after the caller went away at the 3rd check"
    with pytest.raises(GenerationCancelled, match="before generation began"):
        engine.generate([_encode(engine, "Hi")], params, wanted=lambda: False)


def test_only_the_last_position_logits_are_computed_and_outputs_are_unchanged(engine: HFEngine) -> None:
    widths: list[int] = []

    def record(module: Any, inputs: Any, out: torch.Tensor) -> None:
        widths.append(out.shape[1])

    prompts = [_encode(engine, "Tom has 12 apples and gets 30 more. How many apples?"), _encode(engine, "Hi")]
    cases = [
        SamplingParams(n=2, temperature=0, max_new_tokens=8),
        SamplingParams(n=3, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=4),
    ]
    with _model_outputs(engine, record):
        kept = [engine.generate(prompts, p) for p in cases]
    assert widths and set(widths) == {1}, f"logits computed for {max(widths)} positions (prefill) instead of 1"
    saved, engine.forward_kwargs = engine.forward_kwargs, {}
    try:
        full = [engine.generate(prompts, p) for p in cases]  # every position's logits, as before
    finally:
        engine.forward_kwargs = saved
    for a, b in zip(kept, full, strict=True):
        for oa, ob in zip(a, b, strict=True):
            assert [s.token_ids for s in oa.samples] == [s.token_ids for s in ob.samples]
            for sa, sb in zip(oa.samples, ob.samples, strict=True):
                assert sa.logprobs == pytest.approx(sb.logprobs, abs=1e-5)


def test_a_prompts_seeded_samples_do_not_depend_on_the_other_prompts(engine: HFEngine) -> None:
    a = _encode(engine, "Tom has 3 apples.")
    b, c = _encode(engine, "5+7="), _encode(engine, "A much longer prompt that pads the batch on the left side.")
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=10, seed=123)

    def ids(prompts: list[list[int]], at: int) -> list[list[int]]:
        return [s.token_ids for s in engine.generate(prompts, params)[at].samples]

    alone = ids([a], 0)
    assert len({tuple(t) for t in alone}) > 1, "a prompt's samples should differ from each other"
    assert ids([a], 0) == alone
    assert ids([a, b], 0) == alone
    assert ids([a, c, b], 0) == alone
    # The seed is per (seed, index): the same prompt at another index samples other completions.
    assert ids([b, a], 1) != alone


def test_a_stop_string_that_is_one_special_token_stops_there(engine: HFEngine) -> None:
    tok = engine.tokenizer
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    forced = _encode(engine, "The answer is 7.<|im_start|>user\nmore text")
    assert im_start in forced and im_start not in engine.eos_ids
    at = forced.index(im_start)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=len(forced) + 4, stop=("<|im_start|>",), seed=0)
    with _forcing(engine, forced):
        out = engine.generate([_encode(engine, "What is 3 + 4?")], params)[0]
    for s in out.samples:
        assert (s.finish_reason, s.token_ids) == ("stop", forced[: at + 1])
        assert s.text == "The answer is 7."  # special: not in the text, as an EOS token


def test_a_stop_string_of_more_tokens_than_characters_is_found(engine: HFEngine) -> None:
    stop = "答案是"  # 3 characters, 9 byte-level tokens
    assert len(_encode(engine, stop)) > len(stop) + 4
    forced = _encode(engine, "The sum is 7. 答案是 7 and then more text after it")
    params = SamplingParams(n=1, temperature=0, max_new_tokens=len(forced), stop=(stop,))
    with _forcing(engine, forced):
        s = engine.generate([_encode(engine, "What is 3 + 4?")], params)[0].samples[0]
    assert s.finish_reason == "stop", s.text
    assert s.text == "The sum is 7. 答案是"


def test_vllm_gets_one_special_token_stop_strings_as_stop_token_ids(engine: HFEngine) -> None:
    tok = engine.tokenizer
    stops = ("<|im_start|>", "</answer>", "<|im_end|>x")
    ids = stop_token_ids(tok, stops)
    assert ids == {tok.convert_tokens_to_ids("<|im_start|>")}
    got = to_vllm_params(SamplingParams(n=2, temperature=1.0, stop=stops), ids)
    assert got["stop_token_ids"] == sorted(ids) and got["stop"] == list(stops)
