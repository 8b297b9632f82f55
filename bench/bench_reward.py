"""/v1/score math throughput on distinct inputs vs single-threaded in-process math-verify, same run.

Also the scoring rate per worker as the rollout sees it (`per_worker`): gRPC Score calls through the
rollout's RewardClient, worker_batch_tasks × G = 32 items per call (math + format checks), 4 callers, at 1
and 2 reward workers, on the mixed shapes below and on the demo's integer answers; with the service's CPU
ms per item (its whole process tree), the figure that carries to other machines when the cores are shared.
Writes bench/results/reward.json. Target: ratio >= 1.5 on 2 cores (service with 2 workers).
Run: .venv/bin/python bench/bench_reward.py [--n 2000] [--workers 2] [--batch 50] [--concurrency 4]
     .venv/bin/python bench/bench_reward.py --per-worker   # only that section, merged into reward.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

from grpo.common.reward_client import RewardClient
from grpo.local.services import start_reward
from grpo.v1 import reward_pb2

RESULTS = Path(__file__).parent / "results" / "reward.json"


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, str, bool]]:
    """n distinct (completion, gold, expected_correct) pairs in several shapes, about half correct."""
    rng = random.Random(seed)
    pairs: list[tuple[str, str, bool]] = []
    seen: set[tuple[str, str]] = set()
    while len(pairs) < n:
        a, b, k = rng.randint(1, 999), rng.randint(2, 999), rng.randint(2, 9)
        right = rng.random() < 0.5
        shape = rng.randrange(4)
        if shape == 0:  # equivalent fractions
            gold = f"\\frac{{{a}}}{{{b}}}"
            answer = f"\\frac{{{a * k}}}{{{b * k}}}" if right else f"\\frac{{{a * k + 1}}}{{{b * k}}}"
        elif shape == 1:  # integer sums
            gold = str(a + b)
            answer = f"{a + b}" if right else f"{a + b + 1}"
        elif shape == 2:  # surds
            gold = f"{a}\\sqrt{{{k}}}"
            answer = f"\\sqrt{{{a * a * k}}}" if right else f"\\sqrt{{{a * a * k + 1}}}"
        else:  # decimals against fractions
            gold = f"\\frac{{{a}}}{{{4 * k}}}"
            answer = f"{a / (4 * k):.6f}" if right else f"{a / (4 * k) + 0.5:.6f}"
        completion = f"<think>working it out</think><answer>\\boxed{{{answer}}}</answer>"
        if (completion, gold) not in seen:
            seen.add((completion, gold))
            pairs.append((completion, gold, right))
    return pairs


def integer_pairs(n: int, seed: int = 0) -> list[tuple[str, str, bool]]:
    """The demo's answers: three-digit sums as plain integers in the answer tag, about half right."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        total = 110 + i  # distinct golds
        right = rng.random() < 0.5
        answer = total if right else total + rng.randint(1, 9)
        pairs.append(
            (f"<think>{rng.randint(10, 99)} {total % 100:02d}</think><answer>{answer}</answer>", str(total), right)
        )
    return pairs


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants (the service and its workers)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(sum(p.cpu_times()[:2]) for p in procs if p.is_running())


def grpc_rate(workers: int, pairs: list[tuple[str, str, bool]], batch: int, concurrency: int) -> dict[str, Any]:
    """Score calls of `batch` items over gRPC from `concurrency` callers (as rollout replicas send them)."""
    items = [
        reward_pb2.ScoreItem(id=str(i), completion=c, checks=reward_pb2.Checks(
            math=reward_pb2.MathCheck(gold=g), format=reward_pb2.FormatCheck()))
        for i, (c, g, _) in enumerate(pairs)
    ]  # fmt: skip
    chunks = [items[i : i + batch] for i in range(0, len(items), batch)]
    service = start_reward("--log-level", "WARNING", workers=workers)
    try:
        with RewardClient(service.grpc_addr, timeout_s=600.0) as client:
            client.score(items[:batch])  # warm-up: the workers import sympy's paths
            cpu0, started = tree_cpu_s(service.proc.pid), time.perf_counter()
            with ThreadPoolExecutor(concurrency) as ex:
                results = [r for chunk in ex.map(client.score, chunks) for r in chunk]
            elapsed, cpu = time.perf_counter() - started, tree_cpu_s(service.proc.pid) - cpu0
    finally:
        service.stop()
        service.log_path.unlink(missing_ok=True)
    return {
        "workers": workers, "items": len(items), "seconds": round(elapsed, 3),
        "scored": sum(r.status == "ok" and r.HasField("reward") for r in results),
        "items_per_s": round(len(items) / elapsed, 1), "items_per_s_per_worker": round(len(items) / elapsed / workers, 1),
        "service_cpu_ms_per_item": round(1000 * cpu / len(items), 3),
        "items_per_cpu_s": round(len(items) / cpu, 1) if cpu else None,
    }  # fmt: skip


def per_worker(n: int, batch: int = 32, concurrency: int = 4) -> dict[str, Any]:
    """The per-worker scoring rate at 1 and 2 workers, on the mixed shapes and on integer answers."""
    out: dict[str, Any] = {"batch": batch, "concurrency": concurrency, "checks": "math + format", "load_avg_1m": []}
    for name, pairs in (("mixed", make_pairs(n, seed=7)), ("integer", integer_pairs(n, seed=7))):
        out[name] = [grpc_rate(w, pairs, batch, concurrency) for w in (1, 2)]
        out["load_avg_1m"].append(round(os.getloadavg()[0], 2))
    return out


def reference_math_verify(pairs: list[tuple[str, str, bool]]) -> tuple[float, int]:
    """Plain math-verify in this process, one thread: parse gold, parse answer, verify."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    started, correct = time.perf_counter(), 0
    for completion, gold, _ in pairs:
        correct += bool(verify(parse(f"${gold}$", config), parse(completion, config)))
    return time.perf_counter() - started, correct


def reference_ours_inline(pairs: list[tuple[str, str, bool]]) -> tuple[float, int]:
    """Our verifier (with the exactness guard) in this process, one thread: the per-item work the service does."""
    from grpo.reward.verifiers.math import verify_math

    started, correct = time.perf_counter(), 0
    for completion, gold, _ in pairs:
        correct += bool(verify_math(completion, gold).correct)
    return time.perf_counter() - started, correct


def via_service(url: str, pairs: list[tuple[str, str, bool]], batch: int, concurrency: int) -> tuple[float, int, int]:
    """Send the pairs as /v1/score batches, `concurrency` requests in flight; returns (seconds, correct, errors)."""
    chunks = [pairs[i : i + batch] for i in range(0, len(pairs), batch)]
    # One pooled client: the load generator shares the 2 cores with the service, keep it cheap.
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=concurrency))

    def send(chunk_index: int) -> list[dict[str, Any]]:
        items = [
            {"id": f"{chunk_index}-{j}", "completion": c, "checks": {"math": {"gold": g}}}
            for j, (c, g, _) in enumerate(chunks[chunk_index])
        ]
        r = client.post(f"{url}/v1/score", json={"items": items})
        r.raise_for_status()
        return r.json()["results"]  # type: ignore[no-any-return]

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        results = [r for chunk in ex.map(send, range(len(chunks))) for r in chunk]
    elapsed = time.perf_counter() - started
    client.close()
    correct = sum(r["reward"] == 1.0 for r in results)
    errors = sum(r["status"] != "ok" or r["reward"] is None for r in results)
    return elapsed, correct, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--math-batch", type=int, default=16)
    parser.add_argument("--per-worker", action="store_true", help="only the per-worker section, merged into the file")
    parser.add_argument("--per-worker-n", type=int, default=1000, help="items per per-worker measurement")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if args.per_worker:
        report = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        report["per_worker"] = per_worker(args.per_worker_n)
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report["per_worker"], indent=2))
        return 0

    pairs = make_pairs(args.n)
    expected = sum(right for _, _, right in pairs)
    service = start_reward("--log-level", "WARNING", "--math-batch", str(args.math_batch), workers=args.workers)
    url = service.http_url
    try:
        via_service(url, make_pairs(40, seed=99), args.batch, 1)  # warm-up: workers import sympy paths
        service_s, service_correct, service_errors = via_service(url, pairs, args.batch, args.concurrency)
    finally:
        service.stop()
        service.log_path.unlink(missing_ok=True)
    ref_s, ref_correct = reference_math_verify(pairs)
    ours_s, ours_correct = reference_ours_inline(pairs)

    report = {
        "benchmark": "reward /v1/score math throughput, distinct inputs",
        "n": args.n,
        "expected_correct": expected,
        "service": {
            "workers": args.workers,
            "batch": args.batch,
            "concurrency": args.concurrency,
            "math_batch": args.math_batch,
            "seconds": round(service_s, 3),
            "items_per_s": round(args.n / service_s, 1),
            "correct": service_correct,
            "errors": service_errors,
        },
        "reference_math_verify_inline": {
            "seconds": round(ref_s, 3),
            "items_per_s": round(args.n / ref_s, 1),
            "correct": ref_correct,
        },
        "ours_inline_single_thread": {
            "seconds": round(ours_s, 3),
            "items_per_s": round(args.n / ours_s, 1),
            "correct": ours_correct,
        },
        "ratio_service_vs_math_verify": round(ref_s / service_s, 3),
        "ratio_service_vs_ours_inline": round(ours_s / service_s, 3),
        "target_ratio": 1.5,
        "per_worker": per_worker(args.per_worker_n),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
