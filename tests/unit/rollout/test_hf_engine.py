"""The transformers engine on the tiny model: samples, seeds, stops, finish reasons, exact log-probs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.rollout.engines.base import PromptOutput, SamplingParams
from grpo.rollout.engines.hf import HFEngine

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def engine() -> Iterator[HFEngine]:
    e = HFEngine(str(ensure_tiny_model()), torch_threads=1)
    yield e
    e.close()


@pytest.fixture(scope="module")
def prompts(engine: HFEngine) -> list[list[int]]:
    texts = ["What is 3 + 4?", "Tom has 12 apples and gets 30 more. How many apples are there now?", "Hi"]
    out = []
    for t in texts:
        chat = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
        )
        out.append(engine.tokenizer.encode(chat, add_special_tokens=False))
    return out


def _tokens(out: list[PromptOutput]) -> list[list[int]]:
    return [s.token_ids for o in out for s in o.samples]


def test_n_samples_per_prompt_in_prompt_order(engine: HFEngine, prompts: list[list[int]]) -> None:
    out = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=0))
    assert [o.prompt_token_ids for o in out] == prompts
    assert all(len(o.samples) == 4 for o in out)
    for s in (s for o in out for s in o.samples):
        assert 1 <= len(s.token_ids) <= 6 and len(s.logprobs) == len(s.token_ids)
        assert all(lp <= 0 for lp in s.logprobs)
        assert s.finish_reason in ("stop", "length")
    assert len({tuple(t) for t in _tokens(out)}) > 1, "samples of a prompt should differ at temperature 1"


def test_seed_reproduces_and_changes(engine: HFEngine, prompts: list[list[int]]) -> None:
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=12, seed=7)
    first, again = engine.generate(prompts, params), engine.generate(prompts, params)
    assert _tokens(first) == _tokens(again)
    other = engine.generate(prompts, SamplingParams(**{**params.__dict__, "seed": 8}))
    assert _tokens(first) != _tokens(other)


def test_greedy_is_deterministic_and_equals_top_k_1(engine: HFEngine, prompts: list[list[int]]) -> None:
    greedy = engine.generate(prompts, SamplingParams(n=2, temperature=0, max_new_tokens=10))
    assert _tokens(greedy) == _tokens(engine.generate(prompts, SamplingParams(n=2, temperature=0, max_new_tokens=10)))
    for o in greedy:
        assert o.samples[0].token_ids == o.samples[1].token_ids
    top1 = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, top_k=1, max_new_tokens=10, seed=3))
    assert _tokens(top1) == _tokens(greedy)


def test_length_finish_and_max_new_tokens(engine: HFEngine, prompts: list[list[int]]) -> None:
    out = engine.generate(prompts, SamplingParams(n=1, temperature=0, max_new_tokens=5))
    for s in (s for o in out for s in o.samples):
        if s.token_ids[-1] not in engine.eos_ids:
            assert (len(s.token_ids), s.finish_reason) == (5, "length")


def test_eos_stops_and_is_kept_in_tokens_not_text(engine: HFEngine, prompts: list[list[int]]) -> None:
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=8, seed=6)  # seeded: the same path twice
    base = engine.generate(prompts[:1], params)[0].samples[0]
    # The first token that was not generated before it: the greedy path now hits "EOS" there.
    k = next(i for i, t in enumerate(base.token_ids) if i > 0 and t not in base.token_ids[:i])
    saved = engine.eos_ids
    engine.eos_ids = {*saved, base.token_ids[k]}
    try:
        s = engine.generate(prompts[:1], params)[0].samples[0]
    finally:
        engine.eos_ids = saved
    assert s.finish_reason == "stop"
    assert s.token_ids == base.token_ids[: k + 1] and s.logprobs == pytest.approx(base.logprobs[: k + 1], abs=1e-5)
    assert s.text == engine.tokenizer.decode(base.token_ids[:k], skip_special_tokens=True)


def test_stop_string_cuts_the_text_after_the_stop(engine: HFEngine, prompts: list[list[int]]) -> None:
    params = SamplingParams(n=1, temperature=0, max_new_tokens=40)
    full = engine.generate(prompts[1:2], params)[0].samples[0]
    assert len(full.text) > 12, full.text
    stop = full.text[8:11]
    first = full.text.find(stop)
    s = engine.generate(prompts[1:2], SamplingParams(**{**params.__dict__, "stop": (stop, "\x00never")}))[0].samples[0]
    assert s.finish_reason == "stop"
    assert s.text == full.text[: first + len(stop)]
    assert s.token_ids == full.token_ids[: len(s.token_ids)] and len(s.token_ids) < len(full.token_ids)


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 0.8, 20), (0.0, 1.0, 0), (1.3, 0.5, 0)]
)
def test_logprobs_match_a_fresh_forward_pass(
    engine: HFEngine, prompts: list[list[int]], temperature: float, top_p: float, top_k: int
) -> None:
    # A stop string ends some rows early, so the batch is compacted mid-generation too.
    params = SamplingParams(
        n=6, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=24, stop=("e",), seed=1
    )
    out = engine.generate(prompts, params)
    lengths = {len(s.token_ids) for o in out for s in o.samples}
    t = temperature or 1.0
    worst = 0.0
    with torch.no_grad():
        for o in out:
            for s in o.samples:
                ids = torch.tensor([o.prompt_token_ids + s.token_ids])
                logits = engine.model(ids).logits[0, len(o.prompt_token_ids) - 1 : -1].float()
                ref = torch.log_softmax(logits / t, dim=-1).gather(1, torch.tensor(s.token_ids)[:, None]).squeeze(1)
                worst = max(worst, (ref - torch.tensor(s.logprobs)).abs().max().item())
    log.info("sampler vs forward log-prob max abs diff (T=%s): %.2e; lengths %s", temperature, worst, sorted(lengths))
    assert worst < 1e-3
    if temperature > 0:
        assert len(lengths) > 1, "expected rows of different lengths"


def test_load_weights_changes_outputs_and_specs(engine: HFEngine, prompts: list[list[int]]) -> None:
    specs = engine.weight_specs()
    assert "model.embed_tokens.weight" in specs and "lm_head.weight" not in specs  # tied: listed once
    assert specs["model.embed_tokens.weight"] == ("F32", (len(engine.tokenizer), 128))
    params = SamplingParams(n=1, temperature=0, max_new_tokens=10)
    before, checksum = _tokens(engine.generate(prompts, params)), engine.weights_checksum()
    original = {k: v.clone() for k, v in engine.weights().items()}
    g = torch.Generator().manual_seed(0)
    try:
        engine.load_weights({k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()})
        assert _tokens(engine.generate(prompts, params)) != before
        assert engine.weights_checksum() != checksum
    finally:
        engine.load_weights(original)
    assert _tokens(engine.generate(prompts, params)) == before and engine.weights_checksum() == checksum


def test_decoding_never_uses_cudnn_attention(engine: HFEngine, prompts: list[list[int]]) -> None:
    """cuDNN's attention builds a graph for each new shape, and a decode step's keys grow by one each step: bf16
    decode on an H200 ran 14x slower with it (bench/gpu_check/). Every forward pass of a generation runs with it
    switched off, and the switch is back as it was afterwards."""
    seen: list[bool] = []
    hook = engine.model.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    try:
        engine.generate(prompts[:2], SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=0))
    finally:
        hook.remove()
    assert len(seen) >= 6 and not any(seen), seen  # the prefill and each decode step
    assert torch.backends.cuda.cudnn_sdp_enabled()
