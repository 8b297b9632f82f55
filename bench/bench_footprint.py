"""Memory footprint of the demo's process tree → bench/results/footprint.json (issue 40).

Starts Redis, the reward service, one rollout replica and the trainer the way `grpo demo` does (grpo.local.stack
start_services with the demo's service settings: grpo.demo.config / grpo.demo.demo.grpo_phase) on the tiny model,
then records each process's RSS and PSS (/proc/<pid>/smaps_rollup: shared pages split among their users, so the
tree's PSS sum is what the box really holds), its children included (the reward's forkserver and math workers):
once at "ready" (every service healthy), then every --interval s during a short GRPO run (--steps, evaluation on)
for the peak per process and of the whole tree (the peak of the per-sample sum, not the sum of peaks).

Also the bare import cost, each in a fresh interpreter: RSS after `import torch`, `+ transformers`, and after
each service's heavy start-up imports (what `serve` imports before it loads a model), so a process's footprint
splits into "the runtime" and "what the service itself adds". The driver (this script) holds no model: the
model folder is built in a subprocess, so the tree measured is the services' own.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from grpo.demo.config import DemoConfig
from grpo.demo.task import make_splits, prompt_rows
from grpo.local.procs import Supervisor
from grpo.local.stack import StackSpec, start_services

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench_footprint")
MB = 2**20

# What each arm of the import measurement runs in a fresh interpreter (then prints its RSS and heavy modules).
IMPORTS = {
    "python": "pass",
    "torch": "import torch",
    "torch+transformers": "import torch, transformers; from transformers import AutoModelForCausalLM",
    "reward (serve's imports)": "from grpo.reward.core import RewardCore; import grpo.reward.grpc_api, "
    "grpo.reward.http_api",
    "reward math worker (math_verify)": "import math_verify; math_verify.parse('1')",
    "rollout (serve's imports, hf engine)": "import grpo.rollout.__main__ as m; from grpo.rollout.engines.hf import "
    "HFEngine; from grpo.rollout.service import RolloutService; import grpo.rollout.grpc_api, "
    "grpo.rollout.http_api, grpo.rollout.worker_wiring",
    "trainer (serve's imports)": "import grpo.trainer.__main__, grpo.trainer.service, grpo.trainer.run",
}
HEAVY = ("torch", "transformers", "vllm", "deepspeed", "peft", "sympy", "math_verify", "accelerate", "datasets",
         "grpo.trainer", "grpo.algo", "fastapi", "uvicorn", "grpc", "redis", "numpy", "scipy", "pandas")  # fmt: skip
PROBE = (
    "import sys, psutil\n{code}\nrss = psutil.Process().memory_info().rss\n"
    "print(rss, ' '.join(m for m in {heavy!r} if m in sys.modules))"
)
# With --modules: every Python process of the stack (children inherit PYTHONPATH) writes its top-level modules
# to <dir>/<pid>.txt each second, so what a running service has imported is read after the run.
SITECUSTOMIZE = """
import os, sys, threading, time
def _dump():
    while True:
        time.sleep(1.0)
        mods = list(sys.modules)
        names = sorted({m.split('.')[0] for m in mods} | {m for m in mods if m.startswith('grpo.')})
        path = os.path.join(OUT_DIR, str(os.getpid()) + '.txt')
        with open(path + '.tmp', 'w') as f:
            f.write(' '.join(sys.orig_argv) + chr(10) + chr(10).join(names))
        os.replace(path + '.tmp', path)
threading.Thread(target=_dump, daemon=True).start()
"""


def pss_bytes(pid: int) -> int:
    """Proportional set size from smaps_rollup (0 when the process is gone or the kernel lacks the file)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def label(child_name: str, proc: psutil.Process, root: psutil.Process) -> str:
    """`reward`, `reward/forkserver`, `reward/worker-<pid>` …: a child is named by what its command line says."""
    if proc.pid == root.pid:
        return child_name
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        cmd = ""
    try:
        parent_cmd = " ".join(proc.parent().cmdline()) if proc.ppid() != root.pid else ""
    except (psutil.Error, AttributeError):
        parent_cmd = ""
    if "forkserver" in parent_cmd:  # forked by the forkserver: a math worker (its command line is the server's)
        kind = "math-worker"
    elif "forkserver" in cmd or "resource_tracker" in cmd:
        kind = "forkserver" if "forkserver" in cmd else "resource_tracker"
    else:
        kind = Path(cmd.split(" ", 1)[0]).name or "child"
    return f"{child_name}/{kind}-{proc.pid}"


def snapshot(children: dict[str, int]) -> dict[str, dict[str, int]]:
    """RSS and PSS (bytes) of every service process and its descendants, keyed by label."""
    out: dict[str, dict[str, int]] = {}
    for name, pid in children.items():
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                rss = proc.memory_info().rss
            except psutil.Error:
                continue
            out[label(name, proc, root)] = {"rss": rss, "pss": pss_bytes(proc.pid)}
    return out


def in_mb(sample: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    return {k: {m: round(v / MB, 1) for m, v in vals.items()} for k, vals in sorted(sample.items())}


def totals(sample: dict[str, dict[str, int]]) -> dict[str, float]:
    return {m: round(sum(v[m] for v in sample.values()) / MB, 1) for m in ("rss", "pss")}


def by_service(sample: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    """Each service with its children summed (the reward's pool belongs to the reward)."""
    out: dict[str, dict[str, int]] = {}
    for key, vals in sample.items():
        svc = out.setdefault(key.split("/")[0], {"rss": 0, "pss": 0})
        svc["rss"] += vals["rss"]
        svc["pss"] += vals["pss"]
    return in_mb(out)


class Sampler(threading.Thread):
    """Samples every `interval` s until stopped; keeps each label's peak and the tree's peak sums."""

    def __init__(self, children: dict[str, int], interval: float) -> None:
        super().__init__(daemon=True, name="footprint-sampler")
        self.children, self.interval = children, interval
        self.stop = threading.Event()
        self.peaks: dict[str, dict[str, int]] = {}
        self.service_peaks: dict[str, dict[str, int]] = {}
        self.tree_peak = {"rss": 0, "pss": 0}
        self.samples = 0
        self.started = time.monotonic()
        # (seconds since ready, {service: RSS MB}): shows when each peak came (a step, an evaluation, the end)
        self.timeline: list[tuple[float, dict[str, float]]] = []

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.take()

    def take(self) -> None:
        sample = snapshot(self.children)
        self.samples += 1
        for key, vals in sample.items():
            peak = self.peaks.setdefault(key, {"rss": 0, "pss": 0})
            for m in ("rss", "pss"):
                peak[m] = max(peak[m], vals[m])
        services = by_service(sample)
        self.timeline.append((round(time.monotonic() - self.started, 1), {k: v["rss"] for k, v in services.items()}))
        for svc, in_mb_vals in services.items():
            peak = self.service_peaks.setdefault(svc, {"rss": 0, "pss": 0})
            for m in ("rss", "pss"):
                peak[m] = max(peak[m], int(in_mb_vals[m] * MB))
        for m in ("rss", "pss"):
            self.tree_peak[m] = max(self.tree_peak[m], sum(v[m] for v in sample.values()))


def import_costs() -> dict[str, dict[str, Any]]:
    """RSS (MB) after each arm's imports in a fresh interpreter, and which heavy packages they pulled in."""
    out = {}
    for name, code in IMPORTS.items():
        proc = subprocess.run([sys.executable, "-c", PROBE.format(code=code, heavy=HEAVY)], capture_output=True,
                              text=True, timeout=300, check=True)  # fmt: skip
        rss, _, mods = proc.stdout.strip().splitlines()[-1].partition(" ")
        out[name] = {"rss_mb": round(int(rss) / MB, 1), "heavy_modules": mods.split()}
        log.info("import %-40s %7.1f MB  %s", name, int(rss) / MB, mods)
    return out


def build_inputs(run_dir: Path, cfg: DemoConfig) -> Path:
    """The tiny model (built in a subprocess: the driver loads no torch) and the demo's data files."""
    model = run_dir / "model" / "base"
    code = f"from grpo.demo.model import build_model_folder; build_model_folder({str(model)!r}, seed={cfg.seed})"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    splits = make_splits(n_sft=0, n_grpo=cfg.n_grpo, n_eval=cfg.eval_size, seed=cfg.seed)
    for name, rows in (("train", prompt_rows(splits.grpo, "train")), ("eval", prompt_rows(splits.eval, "eval"))):
        path = run_dir / "data" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model


def run_stack(
    cfg: DemoConfig, run_dir: Path, interval: float, trainer_set: dict[str, Any], colocate: bool = False
) -> dict[str, Any]:
    """Start the demo's stack (colocated: the trainer hosts the replica), measure ready and peak, wait for the
    trainer to finish; with its step times from metrics.jsonl."""
    model = build_inputs(run_dir, cfg)
    run_id = "footprint"
    spec = StackSpec(
        run_id=run_id, run_dir=run_dir, redis_url=None, replicas=0 if colocate else cfg.replicas, colocate=colocate,
        rollout={"model": str(model), "worker_batch_tasks": cfg.worker_batch_tasks, "max_new_tokens_cap": 256},
        trainer=cfg.trainer_settings(
            model=str(model), train_data=str(run_dir / "data" / "train.jsonl"),
            eval_data=str(run_dir / "data" / "eval.jsonl"), redis_url="", run_id=run_id,
            output_dir=str(run_dir), grpc_port=0, http_port=0) | trainer_set,
        start_timeout_s=cfg.start_timeout_s,
    )  # fmt: skip
    with Supervisor(run_dir / "logs") as sup:
        started = time.monotonic()
        start_services(sup, spec)
        ready_s = time.monotonic() - started
        children = {c.name: c.pid for c in sup.children}
        ready = snapshot(children)
        sampler = Sampler(children, interval)
        sampler.take()
        sampler.start()
        trainer = next(c for c in sup.children if c.name == "trainer")
        while trainer.alive():
            sup.check([c.name for c in sup.children if c.name != "trainer"])
            if time.monotonic() - started > 900:
                raise TimeoutError("the trainer did not finish in 900 s")
            time.sleep(0.5)
        sampler.stop.set()
        sampler.join()
        if trainer.proc.returncode != 0:
            raise RuntimeError(f"the trainer exited with {trainer.proc.returncode}; logs in {run_dir / 'logs'}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["time/step_s"] for r in rows if "time/step_s" in r]
    return {
        "step_s_mean": round(sum(steps) / len(steps), 3),
        "step_s_median": round(sorted(steps)[len(steps) // 2], 3),
        "ready_s": round(ready_s, 1),
        "run_s": round(time.monotonic() - started - ready_s, 1),
        "samples": sampler.samples,
        "ready": {"processes": in_mb(ready), "services": by_service(ready), "tree": totals(ready)},
        "peak": {"processes": in_mb(sampler.peaks), "services": in_mb(sampler.service_peaks),
                 "tree": {m: round(v / MB, 1) for m, v in sampler.tree_peak.items()}},
        "timeline_rss_mb": sampler.timeline,
    }  # fmt: skip


def list_modules(out: Path) -> None:
    """Every Python child started after this writes its modules under `out` (via a sitecustomize on PYTHONPATH)."""
    out.mkdir(parents=True, exist_ok=True)
    site = out / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(f"OUT_DIR = {str(out)!r}" + SITECUSTOMIZE)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-size", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    parser.add_argument("--label", default="current", help="the key this run is stored under in the results")
    parser.add_argument("--skip-imports", action="store_true")
    parser.add_argument(
        "--trainer-set",
        action="append",
        default=[],
        metavar="KEY=YAML",
        help="override one of the demo's trainer settings (a lever to measure), e.g. micro_batch_size=16",
    )
    parser.add_argument("--colocate", action="store_true", help="the trainer hosts the replica (colocated mode)")
    parser.add_argument("--modules", type=Path, help="write each process's imported modules here (a diagnosis)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "footprint.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = DemoConfig.model_validate(
        {"steps": args.steps, "eval_every": args.eval_every, "eval_size": args.eval_size, "n_grpo": 1024}
    )
    trainer_set = {k: yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in args.trainer_set)}
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.setdefault("runs", {})
    results["setup"] = {"cpus": psutil.cpu_count(), "python": sys.version.split()[0], "model": "tiny (demo)",
                        "steps": args.steps, "eval_every": args.eval_every, "eval_size": args.eval_size,
                        "prompts_per_step": cfg.prompts_per_step, "group_size": cfg.group_size,
                        "interval_s": args.interval}  # fmt: skip
    if args.modules:
        list_modules(args.modules)
    with tempfile.TemporaryDirectory(prefix="bench-footprint-") as tmp:
        run = run_stack(cfg, Path(tmp), args.interval, trainer_set, args.colocate)
    if not args.skip_imports:
        run["imports_mb"] = import_costs()
    run["trainer_set"] = trainer_set
    run["colocate"] = args.colocate
    results["runs"][args.label] = run
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    log.info("ready tree %s MB, peak tree %s MB → %s", run["ready"]["tree"], run["peak"]["tree"], args.out)
    for svc, vals in run["peak"]["services"].items():
        log.info("  %-10s ready %s  peak %s", svc, run["ready"]["services"].get(svc), vals)


if __name__ == "__main__":
    main()
