"""Control-path overhead per group at 1, 8 and 64 simulated rollout replicas (real worker loops, stand-in engine).

What is real: a private redis-server; the trainer's own loop (`GrpoRun.run`: admission control, the
publisher, the group reader, triage, the accounting, the outcome ledger, deferred acks after checkpoints,
the metrics sink); and N `RolloutWorker` loops (read / reclaim, leases renewed by heartbeats, registry,
append + ack script, release on stop), as threads in a few replica-host processes. What stands in, named so:

* `StandInEngine` — a benchmark stand-in for vLLM / transformers: fixed completions, returned instantly.
* `StandInLearner` — no update is computed: the version moves on, a checkpoint writes only the run's state.
* `StandInPushRun` — reads the live replicas as the real loop does, pushes no weights (bench_rollout measures
  the push).

Scoring arms: `instant` (`instant_score`, an in-process stand-in scorer: the control path alone) and
`reward` (the real reward service over gRPC through the rollout's `RewardClient`, math + format checks).
Per arm it records groups/s, wall ms per group, CPU ms per group of Redis, the replica hosts, the trainer
(this process) and the reward service, Redis commands and bytes per group (`INFO commandstats` / `stats`
deltas over the measured steps, after `skip` warm-up steps; commands run inside the scripts count too), and
the idle rates (heartbeats, lease renewals, blocked reads) before the run. An arm with long completions
(`--long-tokens`) at the largest N shows what the payload costs. Reference in the same run: a bare Redis
round trip (PING) from one client. The reward service's scoring rate per worker is bench_reward.py's
(`--per-worker`, in reward.json).

The machine is shared (2 cores, other jobs): absolute numbers are context, the ratios carry.
Writes bench/results/control_path.json. One script past 500 lines on purpose: its stand-ins, arms and books
are read together, and a benchmark is run as one file.
Usage: python bench/bench_control_path.py [--replicas 1 8 64] [--steps 40] [--repeats 3] [--prompts 128]
       [--group-size 8] [--tokens 24] [--long-tokens 1024] [--reward-steps 8] [--reward-workers 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

from grpo.common.queue import RunQueue, connect
from grpo.common.registry import ReplicaRegistry
from grpo.common.reward_client import RewardClient
from grpo.common.signals import stop_on_signals
from grpo.local.procs import Child, spawn
from grpo.local.redis_server import RedisServer
from grpo.local.services import ServiceProc, start_reward
from grpo.rollout.engines.base import Sample
from grpo.rollout.records import Generated
from grpo.rollout.settings import RolloutSettings
from grpo.rollout.stats import WorkerStats
from grpo.rollout.worker import RolloutWorker
from grpo.v1 import queue_pb2, reward_pb2

RESULTS = Path(__file__).parent / "results" / "control_path.json"
HOSTS_MAX = 2  # replica-host processes, one per core here: more would only contend for the same two cores
ZERO_VARIANCE_EVERY = 8  # tasks whose id hashes to 0 mod this get all-correct samples: a counted drop
log = logging.getLogger("bench.control_path")


# ---- the stand-ins ----------------------------------------------------------------------------------


def gold_of(task: queue_pb2.PromptTask) -> str:
    return task.checks.math.gold


def all_correct(task_id: str) -> bool:
    """Deterministic: the benchmark and its test know which groups must be dropped as zero-variance."""
    return zlib.crc32(task_id.encode()) % ZERO_VARIANCE_EVERY == 0


class StandInEngine:
    """Benchmark stand-in for the generation engine: fixed completions of `tokens` tokens, returned instantly.

    Half of each group answers right and half wrong (all right for `all_correct` ids), so triage sees the
    same verdicts from the instant scorer and the reward service. Its weight version is the task's policy
    version: the stand-in holds whatever the trainer published under (no push is simulated)."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.version = 0

    def completion(self, task: queue_pb2.PromptTask, i: int) -> Sample:
        gold = gold_of(task)
        right = all_correct(task.task_id) or i % 2 == 0
        answer = gold if right else str(int(gold) + 1)
        ids = [3 + (k % 17) for k in range(self.tokens)]
        return Sample(ids, [-0.5] * self.tokens, f"<think>adding</think><answer>{answer}</answer>", "stop")

    def generate(self, tasks: Sequence[queue_pb2.PromptTask]) -> Generated:
        self.version = max(self.version, max(t.policy_version for t in tasks))
        samples = [[self.completion(t, i) for i in range(t.sampling.n)] for t in tasks]
        return Generated([[1, 2, 3, 4, 5, 6, 7, 8] for _ in tasks], samples, self.version, "stand-in")

    def weight_info(self) -> tuple[int, str]:
        return self.version, "stand-in"


def instant_score(items: list[reward_pb2.ScoreItem]) -> list[reward_pb2.ScoreResult]:
    """Benchmark stand-in scorer: reward 1 when the answer tag holds the gold, else 0; no I/O, no verifier."""
    out = []
    for item in items:
        score = float(f"<answer>{item.checks.math.gold}</answer>" in item.completion)
        result = reward_pb2.ScoreResult(id=item.id, reward=score, status="ok")
        result.components["math"].score = score
        out.append(result)
    return out


# ---- replica hosts (child processes running many worker loops) ------------------------------------------


def worker_settings(args: argparse.Namespace, index: int) -> RolloutSettings:
    return RolloutSettings(
        redis_url=args.redis_url, reward_addr=args.reward_addr or "unused:1", run=args.run,
        replica_id=f"standin-{index:03d}", advertise_host="127.0.0.1", grpc_port=0, weights_data_port=-1,
        wait_for_task_weights=False,  # the stand-in holds whatever the trainer published under: no push comes
    )  # fmt: skip


def host_main(args: argparse.Namespace) -> int:
    """Run `args.count` RolloutWorker loops (threads) until SIGTERM; write their counters to `args.out`."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    stop = stop_on_signals()
    workers: list[RolloutWorker] = []
    threads: list[threading.Thread] = []
    closers: list[Callable[[], None]] = []
    for index in range(args.first, args.first + args.count):
        settings = worker_settings(args, index)
        client = connect(args.redis_url, socket_timeout_s=settings.worker_block_ms / 1000 + 5.0)
        engine = StandInEngine(args.tokens)
        score: Callable[[list[reward_pb2.ScoreItem]], list[reward_pb2.ScoreResult]] = instant_score
        if args.reward_addr:
            reward = RewardClient(args.reward_addr, timeout_s=120.0, stop=stop)
            score, closers = reward.score, [*closers, reward.close]
        worker = RolloutWorker(
            engine.generate, engine.weight_info, score, RunQueue(client, args.run),
            ReplicaRegistry(client, args.run, ttl_s=settings.registry_ttl_s), replica_id=settings.replica_id,
            address=f"127.0.0.1:{index + 1}", options=settings, stats=WorkerStats(),
        )  # fmt: skip
        workers.append(worker)
        threads.append(threading.Thread(target=worker.run, args=(stop,), name=settings.replica_id, daemon=True))
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=30)
    for close in closers:
        close()
    totals: dict[str, int] = {}
    for w in workers:
        for k, v in w.stats.counts.items():
            totals[k] = totals.get(k, 0) + v
    Path(args.out).write_text(json.dumps(totals))
    return 0


@dataclass
class Hosts:
    """The replica-host children of one arm and where their counters land."""

    children: list[Child]
    outs: list[Path]

    def stop(self) -> dict[str, int]:
        for child in self.children:
            child.stop(grace_s=30.0)
        totals: dict[str, int] = {}
        for out in self.outs:
            for k, v in (json.loads(out.read_text()) if out.exists() else {"host_missing": 1}).items():
                totals[k] = totals.get(k, 0) + v
        return totals

    def cpu_s(self) -> float:
        return sum(_cpu(c.pid) for c in self.children)


def start_hosts(n: int, redis_url: str, run: str, reward_addr: str, tokens: int, work: Path) -> Hosts:
    hosts = min(n, HOSTS_MAX)
    counts = [n // hosts + (1 if h < n % hosts else 0) for h in range(hosts)]
    children, outs, first = [], [], 0
    for h, count in enumerate(counts):
        out = work / f"host-{h}.json"
        cmd = [sys.executable, __file__, "--host", "--redis-url", redis_url, "--run", run, "--first", str(first),
               "--count", str(count), "--tokens", str(tokens), "--out", str(out), "--reward-addr", reward_addr]  # fmt: skip
        children.append(spawn(f"replica-host-{h}", cmd, work / f"host-{h}.log", env={"OMP_NUM_THREADS": "1"}))
        outs.append(out)
        first += count
    return Hosts(children, outs)


def wait_live(redis_url: str, run: str, n: int, hosts: Hosts, timeout_s: float = 60.0) -> None:
    registry = ReplicaRegistry(connect(redis_url), run)
    deadline = time.monotonic() + timeout_s
    while len(registry.live_replicas()) < n:
        for child in hosts.children:
            if not child.alive():
                raise child.failure(f"exited with code {child.proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(registry.live_replicas())} of {n} replicas registered after {timeout_s}s")
        time.sleep(0.1)


# ---- the trainer side: the real loop with the update and the push stood in -------------------------------


class StandInLearner:
    """Benchmark stand-in for the trainer's RankDriver: `step` computes nothing and moves the version on;
    `save` writes only the run's state (data cursor, accounting), which is what the control path needs."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.steps = 0

    @property
    def updates(self) -> int:
        return self.steps

    def set_version(self, version: int) -> None:
        self.version = version

    def step(self, samples: list[Any]) -> dict[str, float]:
        self.steps += 1
        self.version += 1
        return {"samples": float(len(samples))}

    def save(
        self,
        root: Path,
        *,
        step: int,
        data_cursor: Any,
        inflight: Any,
        keep_last: int,
        outcomes: Any,
        ledger_root: Path,
        difficulty: Any = None,
    ) -> Path:
        from grpo.trainer.ledger import write_segment

        path = root / f"step-{step:08d}"
        path.mkdir(parents=True, exist_ok=True)
        state = {"data_cursor": data_cursor, "inflight": inflight, "difficulty": difficulty}
        (path / "state.json").write_text(json.dumps(state))
        write_segment(ledger_root, step, outcomes)  # as save_checkpoint: the step's segment after its checkpoint
        return path

    def save_final(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        pass


def trainer_run(settings: Any) -> Any:
    """A GrpoRun whose learner is a StandInLearner and whose weight push sends nothing (imports torch)."""
    from grpo.trainer.control import RunControl
    from grpo.trainer.run import GrpoRun

    class StandInPushRun(GrpoRun):
        def _sync_replicas(self, live: list[Any] | None = None) -> float:
            if live is None:
                self._live()  # the registry read of the real loop; no bytes move
            return 0.0

    run = StandInPushRun(settings, RunControl(settings.run_id, settings.steps))
    run.learner.close()
    run.learner = StandInLearner(run.learner.version)  # type: ignore[assignment]  # duck-typed: what the loop calls
    return run


def write_rows(path: Path, n: int = 512) -> Path:
    rows = []
    for i in range(n):
        a, b = 100 + (i * 37) % 900, 10 + (i * 91) % 990
        rows.append({"prompt": f"{a:03d}+{b:03d}=", "task_type": "math", "checks": {"math": {"gold": str(a + b)},
                     "format": {}}})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def trainer_settings(redis_url: str, run: str, work: Path, opts: ArmOptions, n: int) -> Any:
    from grpo.trainer.config import TrainerSettings

    return TrainerSettings(
        train_data=write_rows(work / "train.jsonl"), redis_url=redis_url, run_id=run, output_dir=work / "out",
        steps=opts.steps, prompts_per_step=opts.prompts, group_size=opts.group_size, max_staleness=opts.max_staleness,
        max_new_tokens=max(opts.tokens, 24), min_replicas=n, replica_wait_s=60, checkpoint_every=opts.checkpoint_every,
        resume="never", group_timeout_s=300, lr=1e-6,
    )  # fmt: skip


# ---- measurement ---------------------------------------------------------------------------------------


def _cpu(pid: int, children: bool = True) -> float:
    """User + system CPU seconds of a process (all its threads) and, with `children`, its live descendants."""
    try:
        procs = [psutil.Process(pid), *(psutil.Process(pid).children(recursive=True) if children else [])]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


@dataclass
class Snapshot:
    t: float
    commands: dict[str, int]
    redis_usec: float
    net_bytes: int  # into and out of Redis
    cpu: dict[str, float]
    resolved: int

    @staticmethod
    def take(client: redis.Redis, cpus: dict[str, Callable[[], float]], resolved: int) -> Snapshot:
        stats = client.info("commandstats")
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"}
        usec = sum(float(v["usec"]) for k, v in stats.items() if k != "cmdstat_info")
        net = client.info("stats")
        moved = int(net["total_net_input_bytes"]) + int(net["total_net_output_bytes"])
        return Snapshot(time.monotonic(), calls, usec, moved, {k: f() for k, f in cpus.items()}, resolved)


def deltas(a: Snapshot, b: Snapshot, groups: int) -> dict[str, Any]:
    """Per-group figures over the window a → b."""
    wall = b.t - a.t
    commands = {k: v - a.commands.get(k, 0) for k, v in b.commands.items() if v - a.commands.get(k, 0) > 0}
    per_group = {k: round(v / groups, 3) for k, v in sorted(commands.items(), key=lambda kv: -kv[1])}
    return {
        "window_s": round(wall, 3),
        "groups": groups,
        "groups_per_s": round(groups / wall, 1),
        "wall_ms_per_group": round(1000 * wall / groups, 3),
        "cpu_ms_per_group": {k: round(1000 * (b.cpu[k] - a.cpu[k]) / groups, 3) for k in b.cpu},
        "cpu_cores_busy": {k: round((b.cpu[k] - a.cpu[k]) / wall, 2) for k in b.cpu},
        "redis_commands_per_group": round(sum(commands.values()) / groups, 2),
        "redis_commands_per_group_by_command": per_group,
        "redis_server_us_per_group": round((b.redis_usec - a.redis_usec) / groups, 1),
        "redis_kib_per_group": round((b.net_bytes - a.net_bytes) / groups / 1024, 2),
    }


@dataclass
class ArmOptions:
    steps: int = 12
    skip: int = 2  # warm-up steps left out of the window
    prompts: int = 128
    group_size: int = 8
    tokens: int = 24  # completion tokens per sample (the demo's max_new_tokens)
    checkpoint_every: int = 4
    max_staleness: int = 1  # the demo's; a group triaged two steps after its batch was published is dropped stale
    idle_s: float = 3.0
    extra_cpus: dict[str, Callable[[], float]] = field(default_factory=dict)


def resolved(run: Any) -> int:
    return int(run.acct.trained + sum(run.acct.dropped.values()))


def measure_run(run: Any, client: redis.Redis, cpus: dict[str, Callable[[], float]], skip: int) -> dict[str, Any]:
    """Run the loop to its end; the window opens when step `skip` is done (a watcher thread takes the snapshot)."""
    marks: dict[str, Snapshot] = {}
    if skip <= 0:  # the whole run: the snapshot comes before the loop publishes anything
        marks["start"] = Snapshot.take(client, cpus, resolved(run))
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and run.step < skip:
            time.sleep(0.002)
        marks.setdefault("start", Snapshot.take(client, cpus, resolved(run)))

    watcher = threading.Thread(target=watch, name="bench-watch", daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        run.run()
    finally:
        done.set()
        watcher.join()
        run.close()
    end = Snapshot.take(client, cpus, resolved(run))
    out = deltas(marks["start"], end, max(end.resolved - marks["start"].resolved, 1))
    out["run_wall_s"] = round(time.monotonic() - started, 3)
    return out


def books(run: Any) -> dict[str, Any]:
    """The run's accounting and ledger: what the test checks for exactness."""
    from grpo.trainer.ledger import read_ledger

    acct = run.acct
    ledger = read_ledger(run.ledger_root)
    return {
        "published": acct.published,
        "trained": acct.trained,
        "dropped": dict(acct.dropped),
        "in_flight": acct.n_in_flight,
        "duplicates": acct.duplicates,
        "balanced": acct.balanced(),
        "ledger": {str(r["task_id"]): str(r["outcome"]) for r in ledger},
        "ledger_rows": len(ledger),
    }


def run_arm(
    redis_url: str, redis_pid: int, n: int, opts: ArmOptions, reward: ServiceProc | None = None, run_id: str = ""
) -> dict[str, Any]:
    """One arm: N replicas, the trainer loop to its end; per-group figures, idle rates and the books."""
    run_id = run_id or f"cp{n}x{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    with tempfile.TemporaryDirectory(prefix="grpo-bench-cp-") as tmp:
        work = Path(tmp)
        hosts = start_hosts(n, redis_url, run_id, reward.grpc_addr if reward else "", opts.tokens, work)
        try:
            wait_live(redis_url, run_id, n, hosts)
            run = trainer_run(trainer_settings(redis_url, run_id, work, opts, n))
            cpus = {"redis": lambda: _cpu(redis_pid), "replica_hosts": hosts.cpu_s,
                    "trainer": lambda: _cpu(os.getpid(), children=False), **opts.extra_cpus}  # fmt: skip
            idle = idle_rates(client, cpus, opts.idle_s)
            measured = measure_run(run, client, cpus, opts.skip)
        finally:
            workers = hosts.stop()
        result = {"replicas": n, "hosts": len(hosts.children), **measured, "idle": idle, "worker_counts": workers,
                  "load_avg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip
        result["books"] = books(run)
        result["stream_left"] = {k: vars(v) for k, v in RunQueue(client, run_id).stats().items()}
    client.close()
    return result


def idle_rates(client: redis.Redis, cpus: dict[str, Callable[[], float]], seconds: float) -> dict[str, Any]:
    """Redis commands/s and CPU while every replica waits for tasks: heartbeats, lease renewals, blocked reads."""
    a = Snapshot.take(client, cpus, 0)
    time.sleep(seconds)
    b = Snapshot.take(client, cpus, 0)
    wall = b.t - a.t
    return {
        "commands_per_s": round(sum(v - a.commands.get(k, 0) for k, v in b.commands.items()) / wall, 1),
        "cpu_cores_busy": {k: round((b.cpu[k] - a.cpu[k]) / wall, 3) for k in b.cpu},
    }


# ---- reference -----------------------------------------------------------------------


def redis_round_trip_us(redis_url: str, n: int = 3000) -> float:
    """A bare round trip (PING) from one Python client: the unit the control path's cost is counted in."""
    client = connect(redis_url)
    started = time.perf_counter()
    for _ in range(n):
        client.ping()
    elapsed = time.perf_counter() - started
    client.close()
    return round(1e6 * elapsed / n, 1)


# ---- main ------------------------------------------------------------------------------------------------


def control_arms(a: argparse.Namespace, redis_server: RedisServer) -> dict[str, Any]:
    """instant scorer at each N; long completions at the largest N; the real reward service at each N."""
    pid = redis_server.child.pid if redis_server.child else 0
    opts = ArmOptions(steps=a.steps, prompts=a.prompts, group_size=a.group_size, tokens=a.tokens)
    out: dict[str, Any] = {"instant": {}, "instant_long": {}, "reward": {}}
    for n in a.replicas:
        out["instant"][str(n)] = _median_arm([_arm(redis_server.url, pid, n, opts, "instant scorer")
                                              for _ in range(a.repeats)])  # fmt: skip
    if a.long_tokens:
        n, long_opts = max(a.replicas), ArmOptions(steps=max(a.steps // 2, 4), prompts=a.prompts,
                                                   group_size=a.group_size, tokens=a.long_tokens)  # fmt: skip
        out["instant_long"][str(n)] = _arm(redis_server.url, pid, n, long_opts, f"{a.long_tokens}-token samples")
    if a.reward_steps:
        reward = start_reward("--log-level", "WARNING", workers=a.reward_workers)
        try:
            ropts = ArmOptions(steps=a.reward_steps, skip=1, prompts=a.prompts, group_size=a.group_size,
                               tokens=a.tokens, extra_cpus={"reward": lambda: _cpu(reward.proc.pid)})  # fmt: skip
            for n in a.replicas:
                out["reward"][str(n)] = _arm(redis_server.url, pid, n, ropts, "reward service", reward)
        finally:
            reward.stop()
    return out


def _arm(url: str, pid: int, n: int, opts: ArmOptions, what: str, reward: ServiceProc | None = None) -> dict[str, Any]:
    arm = run_arm(url, pid, n, opts, reward)
    arm["books"] = {k: v for k, v in arm["books"].items() if k != "ledger"}  # the per-task ledger is for the test
    log.warning("%s, %d replicas: %s", what, n, _brief(arm))
    return arm


def _median_arm(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median wall ms per group, with every run's figure beside it (the machine is shared)."""
    ranked = sorted(runs, key=lambda r: r["wall_ms_per_group"])
    return {**ranked[len(ranked) // 2], "wall_ms_per_group_runs": [r["wall_ms_per_group"] for r in runs]}


def scaling(by_n: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Wall ms per group at each N over the smallest N's, same run: how the control path itself scales."""
    first = by_n[min(by_n, key=int)]["wall_ms_per_group"]
    return {n: round(arm["wall_ms_per_group"] / first, 3) for n, arm in by_n.items()}


def _brief(arm: dict[str, Any]) -> str:
    return (f"{arm['groups_per_s']} groups/s, {arm['wall_ms_per_group']} ms/group, "
            f"{arm['redis_commands_per_group']} Redis commands/group, cpu ms/group {arm['cpu_ms_per_group']}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=128, help="prompts per step (B)")
    ap.add_argument("--group-size", type=int, default=8, help="G")
    ap.add_argument("--tokens", type=int, default=24, help="completion tokens per sample")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each instant arm (the median is kept)")
    ap.add_argument("--reward-steps", type=int, default=8, help="steps of the reward-service arm (0: skip it)")
    ap.add_argument("--reward-workers", type=int, default=2)
    ap.add_argument("--long-tokens", type=int, default=1024, help="completion tokens of the long arm (0: skip it)")
    # replica-host mode (the benchmark starts these itself)
    ap.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    for name in ("--redis-url", "--run", "--out", "--reward-addr"):
        ap.add_argument(name, default="", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.host:
        return host_main(a)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    report: dict[str, Any] = {
        "benchmark": "control path per group (real Redis, trainer loop, RolloutWorker loops; StandInEngine)",
        "config": {
            "prompts_per_step": a.prompts,
            "group_size": a.group_size,
            "completion_tokens": a.tokens,
            "steps": a.steps,
            "repeats": a.repeats,
            "reward_steps": a.reward_steps,
            "max_staleness": 1,
            "worker_batch_tasks": 4,
            "heartbeat_s": 2.0,
            "hosts_max": HOSTS_MAX,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "shared": True,
            "load_avg_1m_start": round(os.getloadavg()[0], 2),
        },
    }
    with RedisServer() as server:
        report["reference_redis_ping_us"] = redis_round_trip_us(server.url)
        report["control_path"] = control_arms(a, server)
    report["instant_ms_per_group_vs_first_n"] = scaling(report["control_path"]["instant"])
    report["machine"]["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"written": str(RESULTS), "ping_us": report["reference_redis_ping_us"],
                      **{f"{arm} {n}": _brief(r) for arm, by_n in report["control_path"].items()
                         for n, r in by_n.items()}}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
