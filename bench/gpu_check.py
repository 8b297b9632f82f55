"""GPU checks of our trainer and rollout code on one CUDA device (runs on CPU too: cuda-only parts are skipped).

Five independent checks (one failing does not stop the others), each reporting numbers:
  1. learner_precision  one GRPO update of the Learner in bf16 (autocast) and in fp32: losses, gradient norms and
                        directions, parameter updates, step time.
  2. sampler_logprobs   the hf engine samples in bf16; the trainer recomputes the same tokens' log-probs (bf16 and
                        fp32): |diff| and importance ratio − 1.
  3. deepspeed_zero     the DeepSpeed backend, ZeRO-2 and ZeRO-3 on one device (world size 1, one subprocess per
                        stage), against the plain torch backend: loss, grad norm, updated parameters, step times.
  4. engine_throughput  hf engine generation tokens/s on the device (bf16 and fp32) and on the CPU.
  5. weight_push        the trainer's weights pushed into a rollout replica on the device through the real path
                        (push_to_replicas -> gRPC UpdateWeights, stream and data port): parameters equal, greedy
                        generation equals the trainer model's, push time.
Writes <out>/gpu_check.json (every number), <out>/gpu_check.log, and <out>/deepspeed_stage{2,3}.log.

Usage, from the repo root: scripts/gpu_carry.sh builds .gpu-carry/ (the packages and model the GPU image lacks),
carried to the GPU machine, where
  export PYTHONPATH=common/src:services/trainer/src:services/rollout/src:.gpu-carry/site
  python3 bench/gpu_check.py --out "$OUT"
(results of 2026-12-04 on an H200: bench/results/gpu_check.json, docs/gpu-check.md).
Here:  .venv/bin/python bench/gpu_check.py --device cpu --out /tmp/gpucheck
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import logging
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[1]
SRC_DIRS = [REPO / "common" / "src", REPO / "services" / "trainer" / "src", REPO / "services" / "rollout" / "src"]
CARRIED_MODEL = REPO / ".gpu-carry" / "model"
# The carried model's recipe (grpo.common.tiny_model overrides): rebuilt with it when the folder is missing.
MODEL_RECIPE: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 3,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
# Adam's first step is lr·g/(|g|+eps): eps well above float noise keeps parameter comparisons about the gradient.
LEARNER_DEFAULTS: dict[str, Any] = {"lr": 1e-3, "adam_eps": 1e-4, "seed": 0}
DEEPSPEED_STAGES = (2, 3)
# A greedy step whose top-2 logits are closer than this may flip with float reordering (sdpa vs eager, KV cache).
NEAR_TIE = 1e-3

if TYPE_CHECKING:
    import torch

    from grpo.trainer.learner import Learner, TrainableSample

log = logging.getLogger("gpu_check")


@dataclass(frozen=True)
class Sizes:
    """How much work each check does: real sizes on a GPU, small ones on a CPU."""

    groups: int  # GRPO batch: groups × group_size samples
    group_size: int
    prompt_len: tuple[int, int]
    completion_len: tuple[int, int]
    micro_batch: int
    warmup: int  # untimed steps before the timed ones
    reps: int  # timed steps (median reported)
    logprob_prompts: int  # check 2: prompts × n sampled, max tokens
    logprob_n: int
    logprob_tokens: int
    gen_prompts: int  # check 4 on the device: prompts × n, max new tokens
    gen_n: int
    gen_tokens: int
    cpu_gen_prompts: int  # check 4 on the CPU (and the same size on the device, for a like-for-like ratio)
    cpu_gen_n: int
    cpu_gen_tokens: int
    greedy_prompts: int  # check 5: greedy generations compared with the trainer's model
    greedy_tokens: int
    deepspeed_timeout_s: int


GPU_SIZES = Sizes(
    groups=8,
    group_size=8,
    prompt_len=(32, 96),
    completion_len=(64, 256),
    micro_batch=16,
    warmup=2,
    reps=5,
    logprob_prompts=16,
    logprob_n=4,
    logprob_tokens=128,
    gen_prompts=16,
    gen_n=8,
    gen_tokens=128,
    cpu_gen_prompts=4,
    cpu_gen_n=4,
    cpu_gen_tokens=32,
    greedy_prompts=8,
    greedy_tokens=48,
    deepspeed_timeout_s=120,
)
CPU_SIZES = Sizes(
    groups=2,
    group_size=4,
    prompt_len=(6, 12),
    completion_len=(6, 20),
    micro_batch=4,
    warmup=1,
    reps=2,
    logprob_prompts=3,
    logprob_n=2,
    logprob_tokens=16,
    gen_prompts=2,
    gen_n=2,
    gen_tokens=16,
    cpu_gen_prompts=2,
    cpu_gen_n=2,
    cpu_gen_tokens=16,
    greedy_prompts=2,
    greedy_tokens=12,
    deepspeed_timeout_s=400,
)


@dataclass
class Ctx:
    device: torch.device
    model: str
    out: Path
    sizes: Sizes
    vocab: int

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


# ---------------------------------------------------------------------------------------------------- helpers


def sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of fn(), the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - start, result


def median_ms(times: list[float]) -> float:
    return 1000.0 * statistics.median(times) if times else float("nan")


def rel_diff(a: float, b: float) -> float:
    """|a − b| / |b| (b the reference); 0 when both are 0."""
    if a == b:
        return 0.0
    return abs(a - b) / abs(b) if b != 0 else float("inf")


def tensor_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (L2, float64)."""
    a, b = a.double(), b.double()
    denom = float(b.norm())
    return float((a - b).norm()) / denom if denom > 0 else float("inf")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    import torch

    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    import torch

    return torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    import torch

    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().flatten().cpu()
            for p in model.parameters()
        ]
    )


def synthetic_batch(sizes: Sizes, vocab: int, seed: int = 0) -> list[TrainableSample]:
    """Random-token GRPO groups with group-normalised advantages of random 0/1 rewards (never all equal)."""
    from grpo.trainer.learner import TrainableSample

    rng = random.Random(seed)
    low, high = 5, vocab - 10
    out = []
    for g in range(sizes.groups):
        prompt = [rng.randrange(low, high) for _ in range(rng.randint(*sizes.prompt_len))]
        rewards = [float(i % 2) if i < 2 else float(rng.random() < 0.5) for i in range(sizes.group_size)]
        mean = sum(rewards) / len(rewards)
        std = statistics.pstdev(rewards) or 1.0
        for r in rewards:
            completion = [rng.randrange(low, high) for _ in range(rng.randint(*sizes.completion_len))]
            out.append(TrainableSample(prompt, completion, advantage=(r - mean) / std, group_id=str(g)))
    return out


def make_learner(ctx: Ctx, precision: str, **overrides: Any) -> Learner:
    from grpo.trainer.learner import Learner, LearnerConfig

    options = {**LEARNER_DEFAULTS, "micro_batch_size": ctx.sizes.micro_batch, **overrides}
    return Learner(LearnerConfig(model=ctx.model, device=str(ctx.device), precision=precision, **options))


@contextlib.contextmanager
def freed() -> Iterator[None]:
    """Collect garbage and empty the CUDA cache after a block (the checks run one after another in one process)."""
    try:
        yield
    finally:
        gc.collect()
        with contextlib.suppress(Exception):
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def prompt_texts(n: int, seed: int = 1) -> list[str]:
    """Questions from the tiny model's own synthetic corpus (what its tokenizer was trained on)."""
    from grpo.common.tiny_model import training_corpus

    problems = training_corpus(size=n, seed=seed)[3:]  # the first three are fixed phrases
    return [p.split(" <think>")[0] for p in problems][:n]


def encode_prompts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Chat-formatted prompts, tokenised the way the rollout service does."""
    out = []
    for text in texts:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        out.append(list(tokenizer.encode(chat, add_special_tokens=False)))
    return out


def logp_stats(trainer: torch.Tensor, sampler: torch.Tensor) -> dict[str, float]:
    """Per-token comparison of two log-prob vectors: |diff| and the importance ratio π_trainer/π_sampler − 1."""
    diff = (trainer - sampler).double()
    ratio = diff.exp()
    return {
        "tokens": int(diff.numel()),
        "mean_abs_diff": float(diff.abs().mean()),
        "max_abs_diff": float(diff.abs().max()),
        "mean_diff": float(diff.mean()),
        "mean_ratio_minus_1": float((ratio - 1).mean()),
        "mean_abs_ratio_minus_1": float((ratio - 1).abs().mean()),
        "max_abs_ratio_minus_1": float((ratio - 1).abs().max()),
    }


def trainer_logprobs(
    learner: Learner, samples: list[TrainableSample], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(trainer, sampler) log-probs of the samples' completion tokens, flattened alike: the trainer's through its
    own collation, forward and precision; the sampler's as the samples carry them."""
    import torch

    from grpo.trainer.learner.batch import collate
    from grpo.trainer.learner.policy import forward_logprobs

    mb = collate(samples, learner.pad_token_id, mask_truncated=False).to(learner.backend.device)
    with torch.no_grad(), learner.backend.autocast():
        logp, _ = forward_logprobs(learner.model, mb, temperature)
    assert mb.sampler_logp is not None
    mask = mb.completion_mask > 0
    return logp.float()[mask].cpu(), mb.sampler_logp[mask].cpu()


def batch_objective(learner: Learner, samples: list[TrainableSample]) -> tuple[float, float]:
    """(J, nll) of the whole batch at the learner's weights and precision: J = mean over samples of
    advantage × token-mean log-prob (what a GRPO step raises), nll = token-mean −log-prob of the completions."""
    import torch

    from grpo.trainer.learner.batch import collate
    from grpo.trainer.learner.policy import forward_logprobs

    mb = collate(samples, learner.pad_token_id, mask_truncated=False).to(learner.backend.device)
    with torch.no_grad(), learner.backend.autocast():
        logp, _ = forward_logprobs(learner.model, mb, 1.0)
    logp, mask = logp.double(), mb.completion_mask.double()
    per_sample = (logp * mask).sum(1) / mask.sum(1)
    objective = float((per_sample * mb.advantages.double()).mean())
    nll = float(-(logp * mask).sum() / mask.sum())
    return objective, nll


def greedy_reference(
    model: torch.nn.Module, prompt: list[int], max_new: int, eos_ids: set[int], device: torch.device
) -> tuple[list[int], list[float]]:
    """Greedy tokens of `model` (full forward each step, no cache, no padding) and each step's top-2 logit margin."""
    import torch

    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    tokens: list[int] = []
    margins: list[float] = []
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            top = torch.topk(logits, 2)
            token = int(top.indices[0])
            tokens.append(token)
            margins.append(float(top.values[0] - top.values[1]))
            if token in eos_ids:
                break
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
    return tokens, margins


def compare_greedy(got: list[list[int]], expected: list[tuple[list[int], list[float]]]) -> dict[str, Any]:
    """Rows that match exactly; for the others, where they first differ and the reference's top-2 margin there."""
    mismatches = []
    for row, (tokens, (ref, margins)) in enumerate(zip(got, expected, strict=True)):
        if tokens == ref:
            continue
        at = next((i for i, (a, b) in enumerate(zip(tokens, ref, strict=False)) if a != b), min(len(tokens), len(ref)))
        margin = margins[at] if at < len(margins) else float("nan")
        mismatches.append(
            {"row": row, "first_diff_at": at, "ref_top2_margin": margin, "len_got": len(tokens), "len_ref": len(ref)}
        )
    return {"rows": len(got), "rows_equal": len(got) - len(mismatches), "mismatches": mismatches}


def replica_max_diff(engine_weights: dict[str, torch.Tensor], pushed: dict[str, torch.Tensor]) -> dict[str, float]:
    """Largest |replica − pushed| over every tensor: as pushed (cast to the replica's dtype) and against fp32."""
    worst_cast, worst_fp32 = 0.0, 0.0
    missing = sorted(set(engine_weights) ^ set(pushed))
    if missing:
        raise AssertionError(f"replica and pushed tensors differ in names: {missing[:5]}")
    for name, live in engine_weights.items():
        sent = pushed[name].to(live.device)
        worst_cast = max(worst_cast, float((live - sent.to(live.dtype)).abs().max()))
        worst_fp32 = max(worst_fp32, float((live.float() - sent.float()).abs().max()))
    return {"max_abs_diff_vs_cast": worst_cast, "max_abs_diff_vs_fp32": worst_fp32}


# ---------------------------------------------------------------------------------------------------- check 1


def check_learner_precision(ctx: Ctx) -> dict[str, Any]:
    """One GRPO update in bf16 (autocast over fp32 master weights) and fp32, same weights and batch."""
    batch = synthetic_batch(ctx.sizes, ctx.vocab)
    runs: dict[str, dict[str, Any]] = {}
    vectors: dict[str, dict[str, torch.Tensor]] = {}
    for precision in ("fp32", "bf16"):
        learner = make_learner(ctx, precision)
        with freed():
            before = flat_params(learner.model)
            objective0, nll0 = batch_objective(learner, batch)
            metrics = learner.accumulate_gradients(batch)  # the Learner's loss + backward, no optimizer step
            grads = flat_grads(learner.model)
            grad_norm = learner.backend.optimizer_step()  # clip + AdamW + schedule: what step() does next
            delta = flat_params(learner.model) - before
            objective1, _ = batch_objective(learner, batch)
            times, step_losses = [], []
            for i in range(ctx.sizes.warmup + ctx.sizes.reps):
                seconds, m = timed(ctx.device, lambda learner=learner: learner.step(batch))
                if i >= ctx.sizes.warmup:
                    times.append(seconds)
                    step_losses.append(m["loss"])
            runs[precision] = {
                "backend_precision": learner.backend.precision,
                "autocast_dtype": str(learner.backend.autocast_dtype),
                "loss": metrics["loss"],
                "pg_loss": metrics.get("pg_loss", float("nan")),
                "entropy": metrics.get("entropy", float("nan")),
                "nll": nll0,
                "grad_norm": grad_norm,
                "update_norm": float(delta.norm()),
                "objective_before": objective0,
                "objective_after": objective1,
                "objective_gain": objective1 - objective0,
                "step_ms_median": median_ms(times),
                "step_ms_all": [1000 * t for t in times],
                "timed_step_losses": step_losses,
                "tokens_per_step": sum(len(s.prompt_token_ids) + len(s.completion_token_ids) for s in batch),
            }
            vectors[precision] = {"grads": grads, "delta": delta}
    f32, b16 = runs["fp32"], runs["bf16"]
    compare = {
        "loss_abs_diff": abs(b16["loss"] - f32["loss"]),
        "loss_rel_diff": rel_diff(b16["loss"], f32["loss"]),
        "nll_rel_diff": rel_diff(b16["nll"], f32["nll"]),
        "grad_norm_rel_diff": rel_diff(b16["grad_norm"], f32["grad_norm"]),
        "grad_rel_diff": tensor_rel_diff(vectors["bf16"]["grads"], vectors["fp32"]["grads"]),
        "grad_cosine": cosine(vectors["bf16"]["grads"], vectors["fp32"]["grads"]),
        "update_rel_diff": tensor_rel_diff(vectors["bf16"]["delta"], vectors["fp32"]["delta"]),
        "update_cosine": cosine(vectors["bf16"]["delta"], vectors["fp32"]["delta"]),
        "objective_gain_rel_diff": rel_diff(b16["objective_gain"], f32["objective_gain"]),
        "step_time_bf16_over_fp32": b16["step_ms_median"] / f32["step_ms_median"],
    }
    problems = []
    if not all(math.isfinite(r[k]) for r in runs.values() for k in ("loss", "nll", "grad_norm")):
        problems.append("non-finite loss, nll or grad norm")
    if compare["grad_cosine"] < 0.9:
        problems.append(f"bf16 gradient direction far from fp32 (cosine {compare['grad_cosine']:.3f})")
    summary = (
        f"nll rel {compare['nll_rel_diff']:.1e}, grad_norm rel {compare['grad_norm_rel_diff']:.1e}, "
        f"grad cos {compare['grad_cosine']:.5f}, update rel {compare['update_rel_diff']:.1e}, "
        f"step bf16 {b16['step_ms_median']:.1f} / fp32 {f32['step_ms_median']:.1f} ms"
    )
    return {
        "batch": {"samples": len(batch), "micro_batch_size": ctx.sizes.micro_batch, **LEARNER_DEFAULTS},
        "note": "loss is the step's GRPO loss at ratio 1 (π_old = current policy): −mean advantage, ~0 by "
        "construction with group-normalised advantages; nll and objective_gain carry the precision effect",
        "fp32": f32,
        "bf16": b16,
        "compare": compare,
        "problems": problems,
        "summary": summary,
    }


# ---------------------------------------------------------------------------------------------------- check 2


def sample_completions(engine: Any, prompts: list[list[int]], n: int, max_new: int) -> list[TrainableSample]:
    from grpo.rollout.engines.base import SamplingParams
    from grpo.trainer.learner import TrainableSample

    outputs = engine.generate(prompts, SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new, seed=0))
    return [
        TrainableSample(o.prompt_token_ids, s.token_ids, advantage=0.0, sampler_logprobs=s.logprobs)
        for o in outputs
        for s in o.samples
        if s.token_ids
    ]


def check_sampler_logprobs(ctx: Ctx) -> dict[str, Any]:
    """The hf engine's per-token log-probs (bf16 sampler) against the trainer's recomputation of the same tokens."""
    from grpo.rollout.engines.hf import HFEngine

    sz = ctx.sizes
    result: dict[str, Any] = {}
    learners = {p: make_learner(ctx, p) for p in ("bf16", "fp32")}
    with freed():
        for engine_dtype in ("bfloat16", "float32"):
            engine = HFEngine(ctx.model, dtype=engine_dtype, device=str(ctx.device))
            with freed():
                prompts = encode_prompts(engine.tokenizer, prompt_texts(sz.logprob_prompts))
                samples = sample_completions(engine, prompts, sz.logprob_n, sz.logprob_tokens)
                attn = getattr(engine.model.config, "_attn_implementation", "?")
                for precision, learner in learners.items():
                    trainer, sampler = trainer_logprobs(learner, samples)
                    result[f"sampler_{engine_dtype}_vs_trainer_{precision}"] = {
                        **logp_stats(trainer, sampler),
                        "samples": len(samples),
                        "sampler_attn": attn,
                        "trainer_attn": getattr(learner.model.config, "_attn_implementation", "?"),
                    }
                engine.close()
    main = result["sampler_bfloat16_vs_trainer_bf16"]
    anchor = result["sampler_float32_vs_trainer_fp32"]
    problems = []
    # fp32 sampler vs fp32 trainer is the same function of the same weights: only float reordering may differ
    if anchor["max_abs_diff"] > 1e-3:
        problems.append(f"fp32 sampler and fp32 trainer log-probs differ by up to {anchor['max_abs_diff']:.2e}")
    if not math.isfinite(main["max_abs_diff"]):
        problems.append("non-finite bf16 log-probs")
    result["problems"] = problems
    result["summary"] = (
        f"bf16/bf16: mean|d| {main['mean_abs_diff']:.2e} max|d| {main['max_abs_diff']:.2e} "
        f"E[r-1] {main['mean_ratio_minus_1']:.1e}; fp32/fp32 max|d| {anchor['max_abs_diff']:.1e}"
    )
    return result


# ---------------------------------------------------------------------------------------------------- check 3


def check_deepspeed(ctx: Ctx) -> dict[str, Any]:
    """ZeRO-2 and ZeRO-3 on one device, each in its own process (DeepSpeed keeps process-wide state)."""
    from grpo.common.net import free_port

    try:
        ds_version = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return {"status": "skipped", "summary": "deepspeed is not installed", "problems": []}
    result: dict[str, Any] = {"deepspeed_version": ds_version}
    problems: list[str] = []
    summary = []
    for stage in DEEPSPEED_STAGES:
        work = Path(tempfile.mkdtemp(prefix=f"gpu_check_ds{stage}_"))
        ext_dir = work / "torch_extensions"
        env = {
            **os.environ,
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "TORCH_EXTENSIONS_DIR": str(ext_dir),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
        if not ctx.cuda:
            env["CUDA_VISIBLE_DEVICES"] = ""  # the DeepSpeed backend takes the GPU whenever it sees one
        out_json = work / "result.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--deepspeed-worker",
            str(stage),
            "--device",
            ctx.device.type,
            "--model",
            ctx.model,
            "--worker-json",
            str(out_json),
        ]
        log_file = ctx.out / f"deepspeed_stage{stage}.log"
        log.info("deepspeed ZeRO-%d worker: %s (log %s)", stage, " ".join(cmd), log_file)
        start = time.perf_counter()
        with log_file.open("w") as sink:
            try:
                proc = subprocess.run(
                    cmd,
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    timeout=ctx.sizes.deepspeed_timeout_s,
                    check=False,
                )
                rc: int | str = proc.returncode
            except subprocess.TimeoutExpired:
                rc = f"timeout after {ctx.sizes.deepspeed_timeout_s}s"
        wall = time.perf_counter() - start
        text = log_file.read_text(errors="replace")
        jit = sorted(p.name for p in ext_dir.glob("*/*")) if ext_dir.exists() else []
        jit_lines = [
            line
            for line in text.splitlines()
            if any(k in line for k in ("Building extension", "Loading extension", "ninja", "nvcc", "JIT", "op_builder"))
        ][:20]
        entry: dict[str, Any] = {"returncode": rc, "wall_s": wall, "jit_built": jit, "jit_log_lines": jit_lines}
        if out_json.exists():
            entry.update(json.loads(out_json.read_text()))
        else:
            entry["log_tail"] = text.splitlines()[-30:]
        result[f"zero{stage}"] = entry
        if rc != 0 or not out_json.exists():
            problems.append(f"ZeRO-{stage} worker failed ({rc}); see deepspeed_stage{stage}.log")
            summary.append(f"Z{stage} FAILED")
            continue
        problems += [f"ZeRO-{stage}: {p}" for p in entry.get("problems", [])]
        parts = []
        for precision, r in entry.get("runs", {}).items():
            # fp32: max |Δθ| against torch relative to the update; bf16 (weights held in bf16): share rounded apart
            params = (
                f"Δθ/upd {r['param_rel_diff']:.0e}"
                if precision == "fp32"
                else f"θ≠ {r['param_fraction_differing']:.0%}"
            )
            parts.append(
                f"{precision} gn rel {r['grad_norm_rel_diff']:.0e} {params} "
                f"step {r['deepspeed_step_ms']:.0f}/{r['torch_step_ms']:.0f}ms"
            )
        summary.append(f"Z{stage}: " + ", ".join(parts) + (f", JIT {jit}" if jit else ""))
    result["problems"] = problems
    result["summary"] = "; ".join(summary)
    return result


def deepspeed_worker(args: argparse.Namespace) -> None:
    """One ZeRO stage on one device (world size 1), fp32 and bf16, each against the torch backend."""
    import torch

    from grpo.trainer.learner import Learner, LearnerConfig

    stage = args.deepspeed_worker
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    sizes = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    vocab = model_vocab(args.model)
    batch = synthetic_batch(sizes, vocab)
    runs: dict[str, Any] = {}
    problems: list[str] = []
    keep: list[Any] = []  # engines stay alive until the end: closing one ends the process group for all

    def config(backend: str, precision: str) -> LearnerConfig:
        return LearnerConfig(
            model=args.model,
            backend=backend,
            zero_stage=stage,
            precision=precision,
            device=str(device),
            micro_batch_size=sizes.micro_batch,
            **LEARNER_DEFAULTS,
        )

    def state(learner: Learner) -> dict[str, torch.Tensor]:
        return {k: v.detach().float().cpu().clone() for k, v in learner.state_dict_for_push().items()}

    def train(learner: Learner) -> dict[str, Any]:
        initial = state(learner)
        first_s, first = timed(device, lambda: learner.step(batch))
        after = state(learner)
        times = [timed(device, lambda: learner.step(batch))[0] for _ in range(sizes.reps)]
        return {"initial": initial, "after": after, "first": first, "first_s": first_s, "times": times}

    for precision in ("fp32", "bf16"):
        log.info("ZeRO-%d %s: deepspeed backend", stage, precision)
        init_s, ds = timed(device, lambda precision=precision: Learner(config("deepspeed", precision)))
        keep.append(ds)
        d = train(ds)
        log.info("ZeRO-%d %s: torch backend", stage, precision)
        plain = Learner(config("torch", precision))
        t = train(plain)
        # DeepSpeed's bf16 mode holds bf16 weights (fp32 only in its optimizer): compare with torch's, cast alike
        dtype = next(ds.model.module.parameters()).dtype
        update = max(float((t["after"][k] - t["initial"][k]).abs().max()) for k in t["after"])
        diffs = {k: (d["after"][k] - t["after"][k].to(dtype).float()).abs() for k in t["after"]}
        param_diff = max(float(v.max()) for v in diffs.values())
        differing = sum(int((v > 0).sum()) for v in diffs.values()) / sum(v.numel() for v in diffs.values())
        start_diff = max(float((d["initial"][k] - t["initial"][k]).abs().max()) for k in t["initial"])
        dm, tm = d["first"], t["first"]
        runs[precision] = {
            "deepspeed_precision": ds.backend.precision,
            "deepspeed_param_dtype": str(dtype),
            "deepspeed_init_s": init_s,
            "deepspeed_first_step_s": d["first_s"],
            "deepspeed_step_ms": median_ms(d["times"]),
            "torch_first_step_s": t["first_s"],
            "torch_step_ms": median_ms(t["times"]),
            "loss_deepspeed": dm["loss"],
            "loss_torch": tm["loss"],
            "loss_abs_diff": abs(dm["loss"] - tm["loss"]),
            "grad_norm_deepspeed": dm["grad_norm"],
            "grad_norm_torch": tm["grad_norm"],
            "grad_norm_rel_diff": rel_diff(dm["grad_norm"], tm["grad_norm"]),
            "start_param_max_abs_diff": start_diff,
            "param_max_abs_diff": param_diff,  # after one step, against torch's weights cast to DeepSpeed's dtype
            "param_rel_diff": param_diff / update if update > 0 else float("inf"),  # of the largest update
            "param_fraction_differing": differing,
            "max_update": update,
        }
        if not math.isfinite(dm["loss"]) or not math.isfinite(dm["grad_norm"]):
            problems.append(f"{precision}: non-finite loss or grad norm on DeepSpeed")
        # fp32: the same computation in another order (rank_equivalence measures ≤ 1.2e-4 of the update)
        if precision == "fp32" and runs[precision]["param_rel_diff"] > 1e-2:
            problems.append(
                f"fp32 parameters differ from the torch backend by {param_diff:.2e} "
                f"({runs[precision]['param_rel_diff']:.1e} of the update)"
            )
        del plain
        gc.collect()
    result = {
        "stage": stage,
        "device": str(device),
        "world_size": keep[0].backend.world_size,
        "runs": runs,
        "problems": problems,
        "imported_modules": loaded_third_party(),
    }
    Path(args.worker_json).write_text(json.dumps(clean(result), indent=1))
    last = keep.pop()
    keep.clear()
    gc.collect()  # an engine left alive past destroy_process_group can abort the interpreter at exit
    last.close()


# ---------------------------------------------------------------------------------------------------- check 4


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


# ---------------------------------------------------------------------------------------------------- check 5


def check_weight_push(ctx: Ctx) -> dict[str, Any]:
    """Trainer weights -> a replica on the device through push_to_replicas (gRPC stream, then the data port)."""
    from grpo.common.grpc_server import GrpcServer
    from grpo.common.weight_data_port import WeightDataPort
    from grpo.common.weights import nbytes, specs_of
    from grpo.rollout.engines.base import SamplingParams
    from grpo.rollout.engines.hf import HFEngine
    from grpo.rollout.grpc_api import SERVICE_NAME, register
    from grpo.rollout.service import RolloutService
    from grpo.trainer.pusher import ReplicaTarget, push_to_replicas

    sz = ctx.sizes
    result: dict[str, Any] = {}
    problems: list[str] = []
    trainer = make_learner(ctx, "auto")  # bf16 autocast on a GPU, fp32 on a CPU: the trainer's default
    batch = synthetic_batch(sz, ctx.vocab, seed=1)
    for _ in range(2):
        trainer.step(batch)  # the weights move away from the checkpoint the replicas load
    result["trainer_precision"] = trainer.backend.precision
    servers: list[Any] = []
    services: list[Any] = []

    def replica(dtype: str) -> tuple[Any, str, int]:
        service = RolloutService(HFEngine(ctx.model, dtype=dtype, device=str(ctx.device)), ctx.model, f"gpu-{dtype}")
        server = GrpcServer(register(service), [SERVICE_NAME], "127.0.0.1", 0, workers=4)
        server.start()
        service.grpc_port = server.port
        service.data_port = WeightDataPort("127.0.0.1", 0)
        servers.append(server)
        services.append(service)
        return service, f"127.0.0.1:{server.port}", service.data_port.port

    def push(service: Any, address: str, data_port: int, version: int) -> dict[str, Any]:
        gather_s, tensors = timed(ctx.device, trainer.state_dict_for_push)
        pushed = {k: v.detach().clone() for k, v in tensors.items()}  # views of live parameters: keep a copy
        size = sum(nbytes(*spec) for spec in specs_of(tensors).values())
        seconds, results = timed(
            ctx.device,
            lambda: push_to_replicas(
                [ReplicaTarget(service.replica_id, address, data_port)], tensors, version, timeout_s=60, retries=0
            ),
        )
        r = results[0]
        entry = {
            "via": "data port" if data_port else "grpc stream",
            "ok": r.ok,
            "error": r.error,
            "version": r.version,
            "replica_version": service.version,
            "bytes": size,
            "gather_s": gather_s,
            "push_s": seconds,
            "push_result_s": r.seconds,
            "mb_per_s": size / 2**20 / seconds,
            **replica_max_diff(service.engine.weights(), pushed),
        }
        if not r.ok or service.version != version:
            problems.append(f"push of v{version} via {entry['via']} to {service.replica_id} failed: {r.error}")
        return entry

    try:
        # fp32 replica: it must hold exactly the trainer's fp32 weights and generate what the trainer's model does
        service, address, data_port = replica("float32")
        engine = service.engine
        prompts = encode_prompts(engine.tokenizer, prompt_texts(sz.greedy_prompts, seed=2))
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=sz.greedy_tokens)

        def replica_greedy() -> list[list[int]]:
            return [o.samples[0].token_ids for o in service.generate(prompts, greedy)[0]]

        before = replica_greedy()
        entry = push(service, address, 0, 1)
        if entry["max_abs_diff_vs_cast"] != 0.0:
            problems.append(f"fp32 replica differs from the pushed weights by {entry['max_abs_diff_vs_cast']:.2e}")
        after = replica_greedy()
        expected = [greedy_reference(trainer.model, p, sz.greedy_tokens, engine.eos_ids, ctx.device) for p in prompts]
        match = compare_greedy(after, expected)
        entry["greedy_vs_trainer_model"] = match
        entry["greedy_rows_changed_by_push"] = sum(a != b for a, b in zip(after, before, strict=True))
        if [m for m in match["mismatches"] if not m["ref_top2_margin"] < NEAR_TIE]:
            problems.append(
                f"fp32 replica's greedy output differs from the trainer model's in "
                f"{len(match['mismatches'])}/{match['rows']} rows: {match['mismatches'][:2]}"
            )
        result["fp32_replica_stream"] = entry
        trainer.step(batch)
        entry = push(service, address, data_port, 2)
        if entry["max_abs_diff_vs_cast"] != 0.0:
            problems.append(f"fp32 replica (data port) differs by {entry['max_abs_diff_vs_cast']:.2e}")
        result["fp32_replica_data_port"] = entry
        # the copy alone, device to device, as a floor for the push time
        tensors = trainer.state_dict_for_push()
        result["engine_load_weights_s"], _ = timed(ctx.device, lambda: engine.load_weights(tensors))

        # bf16 replica (what a GPU rollout serves): the fp32 weights cast on the way in
        service16, address16, data_port16 = replica("bfloat16")
        entry = push(service16, address16, data_port16, 1)
        if entry["max_abs_diff_vs_cast"] != 0.0:
            problems.append(f"bf16 replica differs from the cast pushed weights by {entry['max_abs_diff_vs_cast']:.2e}")
        expected = [greedy_reference(trainer.model, p, sz.greedy_tokens, engine.eos_ids, ctx.device) for p in prompts]
        got = [o.samples[0].token_ids for o in service16.generate(prompts, greedy)[0]]
        entry["greedy_vs_fp32_trainer_model_info"] = compare_greedy(got, expected)  # bf16 rounding: informational
        result["bf16_replica_data_port"] = entry
    finally:
        for server in servers:
            server.stop(0)
        for service in services:
            service.close()
        gc.collect()
    s, d = result["fp32_replica_stream"], result["fp32_replica_data_port"]
    g = s["greedy_vs_trainer_model"]
    result["problems"] = problems
    result["summary"] = (
        f"fp32 max|Δ| {s['max_abs_diff_vs_cast']:.1e}/{d['max_abs_diff_vs_cast']:.1e}, greedy "
        f"{g['rows_equal']}/{g['rows']} rows equal, push {1000 * s['push_s']:.0f} ms stream / "
        f"{1000 * d['push_s']:.0f} ms data port ({s['bytes'] / 2**20:.1f} MiB); bf16 max|Δ| "
        f"{result['bf16_replica_data_port']['max_abs_diff_vs_cast']:.1e}"
    )
    return result


# ---------------------------------------------------------------------------------------------------- driver

CHECKS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "learner_precision": check_learner_precision,
    "sampler_logprobs": check_sampler_logprobs,
    "deepspeed_zero": check_deepspeed,
    "engine_throughput": check_engine_throughput,
    "weight_push": check_weight_push,
}


def run_check(name: str, fn: Callable[[Ctx], dict[str, Any]], ctx: Ctx) -> dict[str, Any]:
    log.info("=== %s", name)
    start = time.perf_counter()
    try:
        result = fn(ctx)
        status = result.pop("status", None) or ("FAILED" if result.get("problems") else "ok")
    except Exception as exc:
        log.exception("%s failed", name)
        result = {
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc().splitlines()[-25:],
            "summary": f"{type(exc).__name__}: {str(exc)[:150]}",
        }
        status = "FAILED"
    result = {"status": status, "seconds": time.perf_counter() - start, **result}
    log.info("%s: %s (%.1fs) %s", name, status, result["seconds"], result.get("summary", ""))
    for problem in result.get("problems", []):
        log.warning("%s: %s", name, problem)
    return result


def clean(value: Any) -> Any:
    """JSON-safe: non-finite floats as strings, tuples as lists, other objects as str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def package_versions() -> dict[str, str]:
    out = {}
    for name in (
        "torch",
        "transformers",
        "tokenizers",
        "safetensors",
        "deepspeed",
        "grpcio",
        "grpcio-health-checking",
        "grpcio-reflection",
        "protobuf",
        "pydantic",
        "pydantic_core",
        "typing_extensions",
        "accelerate",
        "peft",
        "numpy",
        "prometheus-client",
    ):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def loaded_third_party() -> dict[str, str]:
    """Top-level non-stdlib modules this process imported, with where each came from (the import closure)."""
    out = {}
    for name, module in sorted(sys.modules.items()):
        if "." in name or name.startswith("_") or name in sys.stdlib_module_names or module is None:
            continue
        where = getattr(module, "__file__", None) or str(list(getattr(module, "__path__", []) or []))
        if where and "python3." in where and "site-packages" not in where and "dist-packages" not in where:
            continue  # the interpreter's own lib folder
        out[name] = where or "?"
    return out


def import_status(names: tuple[str, ...]) -> dict[str, str]:
    """Where each module loads from, or why it does not (a wrong carried or installed version shows here first)."""
    import importlib

    out = {}
    for name in names:
        try:
            module = importlib.import_module(name)
            out[name] = f"{getattr(module, '__version__', '?')} {getattr(module, '__file__', '')}"
        except Exception as exc:
            out[name] = f"FAILED {type(exc).__name__}: {exc}"
    return out


def environment(ctx: Ctx) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "device": str(ctx.device),
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_threads": torch.get_num_threads(),
        "model": ctx.model,
        "model_params": None,
        "versions": package_versions(),
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "imports": import_status(("google.protobuf", "grpc", "grpc_health", "grpc_reflection", "peft", "transformers")),
    }
    if ctx.cuda:
        env["gpu"] = torch.cuda.get_device_name(ctx.device)
        env["gpu_capability"] = list(torch.cuda.get_device_capability(ctx.device))
        env["bf16_supported"] = torch.cuda.is_bf16_supported()
    with contextlib.suppress(Exception):
        from safetensors import safe_open

        with safe_open(str(Path(ctx.model) / "model.safetensors"), "pt") as f:
            env["model_params"] = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    return env


def model_vocab(model: str) -> int:
    return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])


def resolve_model_path(arg: str | None) -> str:
    """--model, else the carried model, else the same recipe built now with the repo's tiny-model code."""
    if arg:
        return str(Path(arg).resolve())
    if (CARRIED_MODEL / "config.json").is_file():
        return str(CARRIED_MODEL)
    from grpo.common.tiny_model import ensure_tiny_model

    log.warning("%s missing: building the tiny model (%s) with grpo.common.tiny_model", CARRIED_MODEL, MODEL_RECIPE)
    return str(ensure_tiny_model(**MODEL_RECIPE))


def summary_table(results: dict[str, dict[str, Any]]) -> str:
    width = max(len(n) for n in results)
    lines = [f"{'check':<{width}}  {'status':<7} {'time':>6}  key numbers", "-" * 120]
    for name, r in results.items():
        lines.append(f"{name:<{width}}  {r['status']:<7} {r['seconds']:>5.1f}s  {r.get('summary', '')}")
    table = "\n".join(lines)
    log.info("summary\n%s", table)
    return table


def setup_logs(out: Path | None, level: int = logging.INFO) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if out is not None:
        handlers.append(logging.FileHandler(out / "gpu_check.log", mode="w"))
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers, force=True
    )


def ensure_src_on_path() -> None:
    """The repo's packages importable without PYTHONPATH (appended: an explicit PYTHONPATH wins)."""
    for src in SRC_DIRS:
        if str(src) not in sys.path:
            sys.path.append(str(src))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="folder for gpu_check.json and logs")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when available")
    ap.add_argument("--model", default=None, help=f"model folder (default {CARRIED_MODEL.relative_to(REPO)})")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(CHECKS)}")
    ap.add_argument("--deepspeed-worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-json", default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_src_on_path()
    if args.deepspeed_worker is not None:
        setup_logs(None)
        deepspeed_worker(args)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    setup_logs(args.out)
    import torch

    name = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if name == "cuda" and not torch.cuda.is_available():
        log.error("--device cuda, but torch sees no CUDA device")
        return 2
    device = torch.device("cuda:0" if name == "cuda" else "cpu")
    model = resolve_model_path(args.model)
    ctx = Ctx(device, model, args.out, GPU_SIZES if name == "cuda" else CPU_SIZES, model_vocab(model))
    selected = [c.strip() for c in args.only.split(",") if c.strip()] or list(CHECKS)
    unknown = set(selected) - set(CHECKS)
    if unknown:
        log.error("unknown checks %s; known: %s", sorted(unknown), list(CHECKS))
        return 2
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "sizes": asdict(ctx.sizes)}
    report["environment"] = environment(ctx)
    log.info("device %s, model %s, versions %s", device, model, report["environment"]["versions"])
    start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    json_path = args.out / "gpu_check.json"
    for check in selected:
        results[check] = run_check(check, CHECKS[check], ctx)
        report["checks"] = results
        json_path.write_text(json.dumps(clean(report), indent=1))  # after each check: a crash keeps the rest
    report["total_s"] = time.perf_counter() - start
    report["imported_modules"] = loaded_third_party()
    table = summary_table(results)
    report["summary_table"] = table.splitlines()
    json_path.write_text(json.dumps(clean(report), indent=1))
    log.info("wrote %s (%.1fs)", json_path, report["total_s"])
    return 0 if all(r["status"] != "FAILED" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
