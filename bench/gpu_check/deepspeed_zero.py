"""Check 3, deepspeed_zero: the DeepSpeed backend, ZeRO-2 and ZeRO-3 on one device (world size 1, one subprocess
per stage: DeepSpeed keeps process-wide state), against the plain torch backend: loss, grad norm, updated
parameters, step times. The subprocess is this command again with --deepspeed-worker."""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_check.environment import loaded_third_party
from gpu_check.shared import (
    CPU_SIZES,
    GPU_SIZES,
    LEARNER_DEFAULTS,
    Ctx,
    clean,
    median_ms,
    model_vocab,
    rel_diff,
    synthetic_batch,
    timed,
)

if TYPE_CHECKING:
    import torch

    from grpo.trainer.learner import Learner

log = logging.getLogger(__name__)
DEEPSPEED_STAGES = (2, 3)

# The command that runs a worker: this package, run as a folder (its __main__.py).
PACKAGE_DIR = Path(__file__).resolve().parent


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
            str(PACKAGE_DIR),
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
