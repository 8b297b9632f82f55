"""Check 4, engine_throughput: hf engine generation tokens/s on the device (bf16 and fp32) and on the CPU."""

from __future__ import annotations

from typing import Any

from gpu_check.shared import Ctx, encode_prompts, freed, prompt_texts, timed


def engine_throughput(engine: Any, prompts: list[list[int]], n: int, max_new: int, device: Any) -> dict[str, float]:
    from grpo.rollout.engines.base import SamplingParams

    engine.generate(prompts[:1], SamplingParams(n=1, temperature=1.0, max_new_tokens=4, seed=1))  # warm-up
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new, seed=0)
    seconds, outputs = timed(device, lambda: engine.generate(prompts, params))
    tokens = sum(len(s.token_ids) for o in outputs for s in o.samples)
    return {
        "rows": len(prompts) * n,
        "max_new_tokens": max_new,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
    }


def check_engine_throughput(ctx: Ctx) -> dict[str, Any]:
    """Generation tokens/s of the hf engine on the device (bf16, fp32) and on the CPU (fp32, a small batch)."""
    import torch

    from grpo.rollout.engines.hf import HFEngine

    sz = ctx.sizes
    result: dict[str, Any] = {}
    texts = prompt_texts(max(sz.gen_prompts, sz.cpu_gen_prompts))
    if ctx.cuda:
        for dtype in ("bfloat16", "float32"):
            engine = HFEngine(ctx.model, dtype=dtype, device=str(ctx.device))
            with freed():
                prompts = encode_prompts(engine.tokenizer, texts)
                result[f"cuda_{dtype}"] = engine_throughput(
                    engine, prompts[: sz.gen_prompts], sz.gen_n, sz.gen_tokens, ctx.device
                )
                result[f"cuda_{dtype}_small"] = engine_throughput(
                    engine, prompts[: sz.cpu_gen_prompts], sz.cpu_gen_n, sz.cpu_gen_tokens, ctx.device
                )
                result["cuda_max_memory_mb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
                engine.close()
    else:
        result["cuda"] = "skipped: no CUDA device"
    cpu = torch.device("cpu")
    engine = HFEngine(ctx.model, dtype="float32", device="cpu")
    with freed():
        prompts = encode_prompts(engine.tokenizer, texts)
        result["cpu_float32_small"] = engine_throughput(
            engine, prompts[: sz.cpu_gen_prompts], sz.cpu_gen_n, sz.cpu_gen_tokens, cpu
        )
        engine.close()
    result["cpu_threads"] = torch.get_num_threads()
    cpu_rate = result["cpu_float32_small"]["tokens_per_s"]
    if ctx.cuda:
        big, small = result["cuda_bfloat16"]["tokens_per_s"], result["cuda_bfloat16_small"]["tokens_per_s"]
        result["speedup_cuda_bf16_small_over_cpu"] = small / cpu_rate
        result["summary"] = (
            f"cuda bf16 {big:.0f} tok/s ({sz.gen_prompts * sz.gen_n} rows), "
            f"fp32 {result['cuda_float32']['tokens_per_s']:.0f}; small batch cuda {small:.0f} "
            f"vs cpu {cpu_rate:.0f} tok/s"
        )
    else:
        result["summary"] = f"cpu {cpu_rate:.0f} tok/s (cuda skipped)"
    result["problems"] = []
    return result
