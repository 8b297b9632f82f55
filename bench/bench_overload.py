"""Overload of the reward service with its default admission: 8 → 64 → 8 concurrent clients of a math/code/score mix.

A 2-worker service (`max_queue` at its default, 4,096 items; every request's deadline 10 s: `--default-timeout-s
10`, score's `timeout_s` 10) is driven closed-loop, each client sending its next request when the last is answered,
over three phases. A math worker is SIGKILLed 40 % into the 64-client phase and a sandbox zygote 60 % in. Per phase:
answers per second, latency p50/p95/p99 (200s and 429s apart), status counts, answers later than their deadline + 1 s,
verdicts that differ from the idle verdict of the same item (taken first, one request at a time), and the RSS of
the reward process tree. Targets: 0 × 5xx, 0 late answers, 0 verdicts changed (besides the items the kills hit,
counted apart), RSS flat across phases (phase 3's peak within 50 MiB of phase 1's).

Loopback only; stops by itself (~3 × --phase-s plus start-up). `--baseline-src DIR` runs the service from another
checkout's `services/reward/src` (e.g. `git archive HEAD services/reward/src | tar -x -C /tmp/before`) for a
before/after comparison on the same machine. Writes bench/results/overload.json (overload_baseline.json).
Run: .venv/bin/python bench/bench_overload.py [--phase-s 25] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from grpo.local.services import start_reward

RESULTS = Path(__file__).parent / "results"
DEADLINE_S = 10.0
PHASES = (8, 64, 8)
log = logging.getLogger("bench_overload")

# (key, answer, gold): right and wrong answers, lists, a few expansions of tens of ms.
MATH = [
    ("half", "<answer>\\boxed{\\frac{1}{2}}</answer>", "0.5"),
    ("wrong", "<answer>\\boxed{3}</answer>", "4"),
    ("set", "\\boxed{1, -2}", "-2, 1"),
    ("partial", "\\boxed{1}", "-2, 1"),
    ("interval", "\\boxed{[0, 1)}", "[0,1)"),
    ("gsm8k", "The answer is 72.", "#### 72"),
    ("sqrt", "\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("pi", "\\boxed{\\pi/2}", "\\frac{\\pi}{2}"),
    *[(f"pow{k}", f"\\boxed{{(x+{k})^{{12}}}}", f"x^{{12}}+{k}") for k in range(3)],
    ("square", "\\boxed{(x+1)^2}", "x^2+2x+1"),
]
# A sympy blow-up; each request gives it a new gold, so its gold is checked under load too (not cached).
TOWER = "<think>big</think><answer>\\boxed{10^{10^{10}}}</answer>"
TOWER_SHARE = 0.02  # of math requests

SUM = "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))"
SLOW_SUM = "import sys\nn = sum(int(x) for x in sys.stdin.read().split())\nx = 0\nfor i in range(300_000):\n    x += i\nprint(n)"
CODE = {
    "sum": (SUM, [("1 2", "3"), ("5 5", "10"), ("0", "0"), ("7 8 9", "24")]),
    "slow": (SLOW_SUM, [("1 2", "3"), ("5 5", "10"), ("2 2", "4"), ("3", "3")]),
    "wrong": ("print(0)", [("1 2", "3"), ("0", "0"), ("4", "4"), ("5", "5")]),
}


def code_tests(key: str) -> list[dict[str, Any]]:
    return [{"stdin": i, "expected_stdout": o} for i, o in CODE[key][1]]


@dataclass
class Request:
    kind: str
    path: str
    body: dict[str, Any]
    keys: list[str] = field(default_factory=list)  # what its verdicts are compared under


def make_request(kind: str, rng: random.Random, serial: int) -> Request:
    if kind == "math":
        if rng.random() < TOWER_SHARE:
            return Request(kind, "/v1/verify/math", {"answer": TOWER, "gold": str(100_000 + serial)}, ["math:tower"])
        key, answer, gold = rng.choice(MATH)
        return Request(kind, "/v1/verify/math", {"answer": answer, "gold": gold}, [f"math:{key}"])
    if kind == "code":
        key = rng.choice(sorted(CODE))
        body = {"code": CODE[key][0], "tests": code_tests(key), "timeout_s": 2}
        return Request(kind, "/v1/verify/code", body, [f"code:{key}"])
    items, keys = [], []
    for key, answer, gold in rng.sample(MATH, 6):
        items.append({"id": f"m-{key}", "completion": answer, "checks": {"math": {"gold": gold}, "format": {}}})
        keys.append(f"m-{key}")
    for key in rng.sample(sorted(CODE), 2):
        items.append({"id": f"c-{key}", "completion": CODE[key][0],
                      "checks": {"code": {"tests": code_tests(key), "timeout_s": 2}}})  # fmt: skip
        keys.append(f"c-{key}")
    return Request(kind, "/v1/score", {"items": items, "timeout_s": DEADLINE_S}, keys)


def verdicts(req: Request, answer: dict[str, Any]) -> dict[str, Any]:
    """The verdicts of an answer by item key: a math status, a code request's verdicts, a score item's components."""
    if req.kind == "math":
        return {req.keys[0]: answer["status"]}
    if req.kind == "code":
        return {req.keys[0]: [t["verdict"] for t in answer["tests"]]}
    return {
        r["id"]: (r["reward"], sorted((k, c["status"]) for k, c in r["components"].items())) for r in answer["results"]
    }


def crashed(answer: dict[str, Any]) -> bool:
    """Whether an answer carries the SIGKILLs' marks (a worker died under an item): not a verdict to compare."""
    text = json.dumps(answer)
    return any(mark in text for mark in ("WorkerCrashed", "died", "sandbox failure", "sandbox_error"))


@dataclass
class Outcome:
    phase: int
    kind: str
    status: int  # -1: no answer (transport error or the client's timeout)
    latency_s: float
    changed: list[str] = field(default_factory=list)
    hit_by_kill: bool = False


def idle_reference(client: httpx.Client, url: str) -> dict[str, Any]:
    """Every item's verdict, one request at a time on the idle service."""
    requests = [Request("math", "/v1/verify/math", {"answer": a, "gold": g}, [f"math:{k}"])
                for k, a, g in [*MATH, ("tower", TOWER, "99999")]]  # fmt: skip
    requests += [Request("code", "/v1/verify/code", {"code": CODE[k][0], "tests": code_tests(k), "timeout_s": 2},
                         [f"code:{k}"]) for k in CODE]  # fmt: skip
    reference: dict[str, Any] = {}
    for req in requests:
        r = client.post(url + req.path, json=req.body)
        r.raise_for_status()
        reference.update(verdicts(req, r.json()))
    score = make_request("score", random.Random(0), 0)
    score.body["items"] = [
        *({"id": f"m-{k}", "completion": a, "checks": {"math": {"gold": g}, "format": {}}} for k, a, g in MATH),
        *({"id": f"c-{k}", "completion": CODE[k][0], "checks": {"code": {"tests": code_tests(k), "timeout_s": 2}}}
          for k in CODE),
    ]  # fmt: skip
    score.body["timeout_s"] = 60
    r = client.post(url + score.path, json=score.body)
    r.raise_for_status()
    score.keys = [i["id"] for i in score.body["items"]]
    reference.update(verdicts(score, r.json()))
    return reference


async def client_loop(
    url: str, phase: int, stop_at: float, seed: int, reference: dict[str, Any], out: list[Outcome],
    http: httpx.AsyncClient,
) -> None:  # fmt: skip
    rng = random.Random(seed)
    serial = seed * 100_000
    while time.monotonic() < stop_at:
        kind = rng.choices(["math", "code", "score"], weights=[4, 3, 3])[0]
        serial += 1
        req = make_request(kind, rng, serial)
        started = time.monotonic()
        try:
            r = await http.post(url + req.path, json=req.body)
        except httpx.HTTPError:
            out.append(Outcome(phase, kind, -1, time.monotonic() - started))
            continue
        outcome = Outcome(phase, kind, r.status_code, time.monotonic() - started)
        if r.status_code == 200:
            answer = r.json()
            if crashed(answer):
                outcome.hit_by_kill = True
            else:
                got = verdicts(req, answer)
                outcome.changed = [f"{k}: idle {reference.get(k)!r}, loaded {v!r}" for k, v in got.items()
                                   if reference.get(k) != v]  # fmt: skip
        out.append(outcome)
        if r.status_code == 429:  # a client that honours Retry-After (capped: the phase is short)
            await asyncio.sleep(min(float(r.headers.get("retry-after", "1")), 2.0))


def children(pid: int) -> list[int]:
    """Children of every thread of `pid` (the sandbox's zygotes are its spawner thread's, not the main one's)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree(pid: int) -> list[int]:
    todo, found = [pid], []
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children(p)
    return found


def rss_mb(pid: int) -> float:
    total = 0.0
    for p in tree(pid):
        try:
            total += int(Path(f"/proc/{p}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024
        except (OSError, IndexError):
            continue
    return total


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_one(service_pid: int, what: str) -> int | None:
    """SIGKILL one math worker (a child of the pool's forkserver) or one sandbox zygote; its pid."""
    if what == "math_worker":
        servers = [p for p in children(service_pid) if "multiprocessing.forkserver" in cmdline(p)]
        victims = [c for s in servers for c in children(s)]
    else:
        victims = [p for p in children(service_pid) if "zygote.py" in cmdline(p)]
    if not victims:
        return None
    victim = random.Random(1).choice(victims)
    os.kill(victim, signal.SIGKILL)
    return victim


def percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3)


def summarize(phase: int, clients: int, seconds: float, outcomes: list[Outcome], rss: list[float]) -> dict[str, Any]:
    mine = [o for o in outcomes if o.phase == phase]
    codes = Counter(o.status for o in mine)
    ok = [o.latency_s for o in mine if o.status == 200]
    shed = [o.latency_s for o in mine if o.status == 429]
    changed = [c for o in mine for c in o.changed]
    return {
        "clients": clients,
        "seconds": round(seconds, 1),
        "answers": len(mine),
        "ok_per_s": round(len(ok) / seconds, 2),
        "answers_per_s": round(len(mine) / seconds, 2),
        "status": {str(k): v for k, v in sorted(codes.items())},
        "by_kind": {k: dict(Counter(str(o.status) for o in mine if o.kind == k)) for k in ("math", "code", "score")},
        "ok_latency_s": {"p50": percentile(ok, 50), "p95": percentile(ok, 95), "p99": percentile(ok, 99)},
        "shed_latency_s": {"p50": percentile(shed, 50), "p95": percentile(shed, 95), "p99": percentile(shed, 99)},
        "late": sum(o.latency_s > DEADLINE_S + 1 for o in mine if o.status in (200, 429)),
        "server_errors": sum(o.status >= 500 for o in mine),
        "no_answer": codes[-1],
        "verdicts_changed": len(changed),
        "changed_examples": changed[:5],
        "hit_by_kill": sum(o.hit_by_kill for o in mine),
        "rss_mb": {"start": round(rss[0], 1), "peak": round(max(rss), 1), "end": round(rss[-1], 1)} if rss else {},
    }


async def run_phases(url: str, pid: int, phase_s: float, reference: dict[str, Any]) -> dict[str, Any]:
    outcomes: list[Outcome] = []
    rss: dict[int, list[float]] = {i: [] for i in range(len(PHASES))}
    current = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.5):
            rss[current[0]].append(rss_mb(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    kills: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    pending: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(timeout=DEADLINE_S + 20, limits=limits) as http:
        for phase, clients in enumerate(PHASES):
            current[0] = phase
            started = time.monotonic()
            stop_at = started + phase_s
            loops = [asyncio.create_task(client_loop(url, phase, stop_at, 1000 * phase + i, reference, outcomes, http))
                     for i in range(clients)]  # fmt: skip
            pending |= set(loops)
            if clients == max(PHASES):
                for share, what in ((0.4, "math_worker"), (0.6, "zygote")):
                    await asyncio.sleep(max(0.0, started + share * phase_s - time.monotonic()))
                    victim = kill_one(pid, what)
                    kills.append({"what": what, "pid": victim, "at_s": round(time.monotonic() - started, 1)})
                    log.info("SIGKILL %s %s", what, victim)
            await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
        await asyncio.gather(*pending)  # the last answers of each phase (its clients stop at its end)
    sampling.set()
    sampler.join()
    results = [summarize(i, c, phase_s, outcomes, rss[i]) for i, c in enumerate(PHASES)]
    return {"phases": results, "kills": kills}


def scrape(url: str) -> dict[str, float]:
    wanted = ("grpo_reward_rejected_total", "grpo_reward_cancelled_total", "grpo_reward_abandoned_total",
              "grpo_reward_admission_unit_seconds", "grpo_reward_sandbox_kills_total")  # fmt: skip
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith(wanted)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase-s", type=float, default=25.0)
    parser.add_argument("--baseline-src", type=Path, default=None, help="another checkout's services/reward/src")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    env = {"PYTHONPATH": str(args.baseline_src.resolve())} if args.baseline_src else None
    level = os.environ.get("BENCH_LOG", "WARNING")  # DEBUG: the service's log is kept, admission's estimates in it
    flags = ("--log-level", level, "--default-timeout-s", str(DEADLINE_S), "--math-timeout-s", "3")
    service = start_reward(*flags, workers=2, env=env)
    url, pid = service.http_url, service.proc.pid
    try:
        with httpx.Client(timeout=120) as client:
            idle_started = time.monotonic()
            reference = idle_reference(client, url)
            log.info("idle reference: %d verdicts in %.1fs", len(reference), time.monotonic() - idle_started)
        rss_start = rss_mb(pid)
        run = asyncio.run(run_phases(url, pid, args.phase_s, reference))
        recovered_at = time.monotonic()
        after = httpx.post(f"{url}/v1/verify/math", json={"answer": "\\boxed{4}", "gold": "4"}, timeout=30)
        recovered = after.status_code == 200 and after.json()["status"] == "correct"
        recovery_s = time.monotonic() - recovered_at
        metrics = scrape(url)
        alive = service.proc.poll() is None
    finally:
        service.stop()
        if "BENCH_LOG" not in os.environ:
            service.log_path.unlink(missing_ok=True)
    phases = run["phases"]
    result = {
        "service": "baseline: " + str(args.baseline_src) if args.baseline_src else "this checkout",
        "workers": 2,
        "deadline_s": DEADLINE_S,
        "phase_s": args.phase_s,
        "cpus": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "rss_before_mb": round(rss_start, 1),
        "phases": phases,
        "kills": run["kills"],
        "recovered": recovered,
        "recovery_s": round(recovery_s, 2),
        "alive": alive,
        "metrics": metrics,
        "ratios": {
            "ok_per_s_64_over_8": round(phases[1]["ok_per_s"] / max(phases[0]["ok_per_s"], 1e-9), 2),
            "ok_per_s_after_over_before": round(phases[2]["ok_per_s"] / max(phases[0]["ok_per_s"], 1e-9), 2),
            "rss_peak_after_minus_before_mb": round(
                phases[2]["rss_mb"].get("peak", 0) - phases[0]["rss_mb"].get("peak", 0), 1
            ),
        },
    }
    targets = {
        "no_5xx": all(p["server_errors"] == 0 for p in phases),
        "none_late": all(p["late"] == 0 and p["no_answer"] == 0 for p in phases),
        "verdicts_unchanged": all(p["verdicts_changed"] == 0 for p in phases),
        "rss_flat": abs(result["ratios"]["rss_peak_after_minus_before_mb"]) < 50,  # type: ignore[index]
        "recovered": recovered and alive,
    }
    result["targets"] = targets
    path = RESULTS / ("overload_baseline.json" if args.baseline_src else "overload.json")
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    for p in phases:
        log.info("%d clients: %s", p["clients"], {k: p[k] for k in ("ok_per_s", "status", "ok_latency_s", "late",
                                                                   "verdicts_changed", "hit_by_kill", "rss_mb")})  # fmt: skip
    ok = all(targets.values())
    log.info("%s -> %s: %s", "targets met" if ok else "TARGETS MISSED", path, targets)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
