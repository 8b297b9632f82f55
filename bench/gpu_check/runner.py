"""The driver: flags, the checks one after another (one failing does not stop the others), gpu_check.json after
each, the summary table; --deepspeed-worker runs one ZeRO stage instead (deepspeed_zero.py)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gpu_check
from gpu_check.deepspeed_zero import check_deepspeed, deepspeed_worker
from gpu_check.engine_throughput import check_engine_throughput
from gpu_check.environment import environment, loaded_third_party
from gpu_check.learner_precision import check_learner_precision
from gpu_check.sampler_logprobs import check_sampler_logprobs
from gpu_check.shared import (
    CARRIED_MODEL,
    CPU_SIZES,
    GPU_SIZES,
    MODEL_RECIPE,
    REPO,
    SEARCH_PATH,
    Ctx,
    clean,
    model_vocab,
)
from gpu_check.weight_push import check_weight_push

log = logging.getLogger(__name__)

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
    """The repo's packages (and tests.support) importable without PYTHONPATH (appended: an explicit PYTHONPATH wins)."""
    for src in SEARCH_PATH:
        if str(src) not in sys.path:
            sys.path.append(str(src))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=gpu_check.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
