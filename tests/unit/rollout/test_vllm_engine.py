"""The vllm engine's pure parts: parameter mapping, checkpoint specs, output mapping and the worker-side hooks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from grpo.rollout.engines.base import SamplingParams
from grpo.rollout.engines.vllm import read_safetensors_specs, resolve_in_process, to_sample, to_vllm_params
from grpo.rollout.engines.vllm_ext import PreTruncationLogprobs, refresh_tied_modules


def test_sampling_params_map_to_vllm() -> None:
    params = SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=32, stop=("</answer>",), seed=5)
    got = to_vllm_params(params)
    assert got["n"] == 4 and got["top_k"] == 0 and got["max_tokens"] == 32 and got["seed"] == 5
    assert got["stop"] == ["</answer>"] and got["include_stop_str_in_output"] and got["logprobs"] == 0


def test_greedy_asks_vllm_for_one_sample() -> None:
    # vLLM refuses greedy with n > 1; the engine copies the one sample.
    assert to_vllm_params(SamplingParams(n=3, temperature=0.0))["n"] == 1


@pytest.mark.parametrize(
    ("setting", "on_cpu", "env", "expected"),
    [(True, False, "1", True), (False, True, None, False), (None, True, None, True), (None, False, None, False),
     (None, True, "1", False), (None, False, "0", True)],
)  # fmt: skip
def test_in_process_follows_setting_then_env_then_platform(
    setting: bool | None, on_cpu: bool, env: str | None, expected: bool
) -> None:
    assert resolve_in_process(setting, on_cpu, env) is expected


def test_specs_come_from_the_safetensors_headers(tmp_path: Path) -> None:
    save_file(
        {"a.weight": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.bfloat16)}, tmp_path / "model.safetensors"
    )
    save_file({"c": torch.zeros(1, dtype=torch.int64)}, tmp_path / "model-2.safetensors")
    assert read_safetensors_specs(tmp_path) == {"a.weight": ("F32", (2, 3)), "b": ("BF16", (4,)), "c": ("I64", (1,))}


def test_specs_need_a_safetensors_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        read_safetensors_specs(tmp_path)


def _completion(finish: str) -> SimpleNamespace:
    # The fields of vLLM's CompletionOutput that the engine reads.
    lp = [{7: SimpleNamespace(logprob=-0.5)}, {9: SimpleNamespace(logprob=-1.25)}]
    return SimpleNamespace(index=0, token_ids=[7, 9], logprobs=lp, text="ab", finish_reason=finish)


def test_completion_maps_to_sample() -> None:
    sample = to_sample(_completion("length"))
    assert (sample.token_ids, sample.logprobs, sample.text, sample.finish_reason) == (
        [7, 9],
        [-0.5, -1.25],
        "ab",
        "length",
    )


def test_unknown_finish_reason_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="abort"):
        to_sample(_completion("abort"))


class _TopK(torch.nn.Module):
    """Masks all but the top-2 logits in place, as vLLM's top-k sampler does, and samples the argmax."""

    logprobs_mode = "processed_logprobs"

    def forward(self, logits: torch.Tensor, generators: dict, k: object, p: object) -> tuple[torch.Tensor, None]:
        cutoff = logits.topk(2, dim=-1).values[:, -1:]
        logits.masked_fill_(logits < cutoff, float("-inf"))
        return logits.argmax(-1), None


def test_logprobs_are_taken_before_truncation() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.1, 0.2, 3.0, 0.0]])
    expected = logits.log_softmax(-1)
    inner = _TopK()
    sampled, logprobs = PreTruncationLogprobs(inner)(logits.clone(), {}, None, None)
    assert inner.logprobs_mode == "raw_logprobs"  # the inner sampler no longer computes its own
    assert sampled.tolist() == [0, 2]
    torch.testing.assert_close(logprobs, expected)


class _Repack:
    def __init__(self) -> None:
        self.calls: list[torch.nn.Module] = []

    def process_weights_after_loading(self, module: torch.nn.Module) -> None:
        self.calls.append(module)


def test_tied_modules_are_reprocessed_after_a_reload() -> None:
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(5, 3)
    model.head = torch.nn.Linear(3, 5, bias=False)
    model.other = torch.nn.Linear(3, 3)
    model.head.weight = model.embed.weight  # tied, as vLLM ties lm_head to embed_tokens
    repack = _Repack()
    for module in (model.embed, model.head, model.other):
        module.quant_method = repack
    assert refresh_tied_modules(model) == 1
    assert repack.calls == [model.head]
