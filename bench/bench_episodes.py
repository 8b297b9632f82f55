"""Multi-turn episodes against single-turn samples, through the real services → bench/results/episodes.json.

(a) Throughput through a private Redis, the reward service and a rollout replica (processes), with the tool model
    (tests/support/tool_model.py: `<code>print(6*7)</code>`, the sandbox's `<output>42</output>`, then
    `<answer>42</answer>`): tasks of 8 episodes each (tools [python], tagged) against tasks of 8 single-turn samples
    of the same prompt whose `max_new_tokens` is the episodes' mean model tokens (equal generated tokens), the two
    interleaved, several rounds. Episodes/s, model tokens/s (and all tokens/s), and their ratios to single-turn.
    One greedy episode is kept as the services recorded it (docs/multi-turn.md's worked example).
(b) Scheduling, and where an episode batch's wall time goes: the rollout's EpisodeRunner in this process on the
    same engine and model, its python tool calling the same reward service, every engine call and tool call timed.
    Seeded batches of one task x 8 concurrent episodes, and of 4 tasks (the worker's default batch), each batch
    run under every schedule in SCHEDULES (rotated order, the same seed: the same episodes token for token, so they
    differ only in scheduling): the runner's default (tool calls overlapping generation, gathering results that
    finish within one engine call's time), overlapping with no gathering, and the old synchronous turns; and
    single-turn batches of as many samples at the episodes' mean model tokens. Per schedule: the share of tool time
    during which the engine was generating, the share of wall time in tool calls, engine calls per batch,
    episodes/s and model tokens/s and their ratios to single-turn, and the wall time against sync's on the same
    batch. Three tool
    latencies: the sandbox alone; plus a fixed `delay_s`; plus a uniform draw from [0, 2 x delay_s] per call (a
    stand-in for a slower tool whose calls differ, named so). --repeats runs of the whole of (b) give the spread.

The machine is shared (2 cores, other jobs): absolute numbers are context, the ratios carry.
Usage: python bench/bench_episodes.py [--tasks 8] [--rounds 5] [--batches 8] [--repeats 3] [--delay-s 0.2]
       [--batch-tasks 1 4] [--skip-throughput]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo.common.queue import RunQueue, connect
from grpo.common.reward_client import RewardClient
from grpo.common.tiny_model import cache_root
from grpo.local.redis_server import RedisServer
from grpo.local.services import start_reward, start_rollout
from grpo.rollout.engines.base import SamplingParams
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.episodes.runner import EpisodeRunner
from grpo.rollout.episodes.spec import episode_rules
from grpo.rollout.episodes.tools import Limits, PythonTool, Tool, ToolResult
from grpo.rollout.service import RolloutService
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tool model's recipe lives in tests/support
from tests.support.tool_model import TOOL_PROMPT, TOOL_RESULT, tool_model_path  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "episodes.json"
RUN = "bench-episodes"
G = 8
MAX_NEW_TOKENS = 24
SPEC = queue_pb2.EpisodeSpec(tools=["python"], tool_format="tagged", max_turns=3, max_tool_calls=2,
                             max_total_tokens=3 * MAX_NEW_TOKENS, max_tool_output_chars=1000, tool_timeout_s=5.0)  # fmt: skip
log = logging.getLogger("bench.episodes")


def task(task_id: str, seed: int, max_new_tokens: int, episode: bool, n: int = G, temperature: float = 1.0
         ) -> queue_pb2.PromptTask:  # fmt: skip
    t = queue_pb2.PromptTask(
        task_id=task_id,
        policy_version=0,
        prompt=rollout_pb2.Prompt(text=TOOL_PROMPT),
        checks=reward_pb2.Checks(math=reward_pb2.MathCheck(gold=TOOL_RESULT)),
        sampling=rollout_pb2.SamplingParams(n=n, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed),
        task_type="math",
    )
    if episode:
        t.episode.CopyFrom(SPEC)
    return t


def run_arm(queue: RunQueue, tasks: list[queue_pb2.PromptTask], timeout_s: float = 600) -> dict[str, Any]:
    """Publish `tasks` at once; wall time until the last group is back, and what the groups held."""
    want = {t.task_id for t in tasks}
    started = time.perf_counter()
    queue.publish_tasks(tasks)
    groups: dict[str, queue_pb2.GroupRecord] = {}
    while not want <= groups.keys():
        assert time.perf_counter() - started < timeout_s, f"groups missing: {sorted(want - groups.keys())}"
        entries = queue.read_groups("bench", count=64, block_ms=50)
        groups.update({e.message.group_id: e.message for e in entries if e.message is not None})
        queue.ack_groups([e.entry_id for e in entries])
    wall = time.perf_counter() - started
    records = [groups[i] for i in sorted(want)]
    assert all(r.status == "ok" for r in records), [r.error for r in records if r.status != "ok"]
    samples = [s for r in records for s in r.samples]
    model = sum(sum(s.token_mask) if s.token_mask else len(s.completion.token_ids) for s in samples)
    stats = [s.episode for s in samples if s.HasField("episode")]
    return {
        "wall_s": wall,
        "samples": len(samples),
        "model_tokens": model,
        "all_tokens": sum(len(s.completion.token_ids) for s in samples),
        "tool_calls": sum(st.tool_calls for st in stats),
        "tool_errors": sum(st.tool_errors for st in stats),
        "tool_s": sum(st.tool_s for st in stats),  # each call's own time (they run several at once)
        "turns": sum(st.turns for st in stats),
        "accuracy": sum(s.reward >= 1.0 for s in samples) / len(samples),
        "example": samples[0],
    }


def throughput(model: Path, reward_addr: str, log_dir: Path, tasks: int, rounds: int) -> dict[str, Any]:
    """(a) episodes vs single-turn through Redis, the rollout replica and the reward service."""
    with RedisServer() as redis_server:
        url = redis_server.url
        env = {"GRPO_ROLLOUT_WORKER_BLOCK_MS": "50", "GRPO_ROLLOUT_HEARTBEAT_S": "0.5"}
        rollout = start_rollout("--model", str(model), "--redis-url", url, "--reward-addr", reward_addr,
                                "--run", RUN, log_dir=log_dir, env=env)  # fmt: skip
        try:
            queue = RunQueue(connect(url), RUN)
            queue.ensure_groups()
            run_arm(queue, [task("warm-e", 0, MAX_NEW_TOKENS, True), task("warm-s", 0, MAX_NEW_TOKENS, False)])
            probe = run_arm(queue, [task(f"probe-{i}", 100 + i, MAX_NEW_TOKENS, True) for i in range(tasks)])
            equal = max(1, round(probe["model_tokens"] / probe["samples"]))  # single-turn budget: equal tokens
            arms: dict[str, list[dict[str, Any]]] = {"episodes": [], "single": []}
            for r in range(rounds):
                for name in ("episodes", "single") if r % 2 == 0 else ("single", "episodes"):
                    budget = MAX_NEW_TOKENS if name == "episodes" else equal
                    batch = [task(f"{name}-{r}-{i}", 1000 * r + i, budget, name == "episodes") for i in range(tasks)]
                    arms[name].append(run_arm(queue, batch))
            # The worked example of docs/multi-turn.md: one greedy episode, as the services record it.
            example = run_arm(queue, [task("greedy", 0, MAX_NEW_TOKENS, True, n=1, temperature=0.0)])["example"]
        finally:
            rollout.stop()
    out: dict[str, Any] = {"single_turn_max_new_tokens": equal}
    for name, runs in arms.items():
        out[name] = {
            "per_round": [
                {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k != "example"} for r in runs
            ],
            "samples_per_s": round(statistics.median(r["samples"] / r["wall_s"] for r in runs), 2),
            "model_tokens_per_s": round(statistics.median(r["model_tokens"] / r["wall_s"] for r in runs), 1),
            "all_tokens_per_s": round(statistics.median(r["all_tokens"] / r["wall_s"] for r in runs), 1),
            "model_tokens_per_sample": round(sum(r["model_tokens"] for r in runs) / sum(r["samples"] for r in runs), 2),
        }
    e, s = out["episodes"], out["single"]
    out["episodes_per_s_vs_single_samples_per_s"] = round(e["samples_per_s"] / s["samples_per_s"], 3)
    out["model_tokens_per_s_ratio"] = round(e["model_tokens_per_s"] / s["model_tokens_per_s"], 3)
    out["example_episode"] = {"token_ids": list(example.completion.token_ids), "mask": list(example.token_mask),
                              "logprobs": [round(x, 4) for x in example.completion.logprobs],
                              "text": example.completion.text, "stats": str(example.episode).strip()}  # fmt: skip
    return out


class Timeline:
    """Intervals (start, end) of engine calls and tool calls, from this process's clock."""

    def __init__(self) -> None:
        self.generate: list[tuple[float, float]] = []
        self.tools: list[tuple[float, float]] = []
        self.lock = threading.Lock()

    def add(self, kind: str, start: float, end: float) -> None:
        with self.lock:
            getattr(self, kind).append((start, end))


class TimedTool:
    """The python tool, timed; `delay_s` (low, high) adds a uniform draw from it before each call (a stand-in for
    a slower tool: fixed when low == high, each call its own latency otherwise)."""

    def __init__(self, tool: Tool, timeline: Timeline, delay_s: tuple[float, float] = (0.0, 0.0)) -> None:
        self.tool, self.timeline, self.delay_s = tool, timeline, delay_s
        self.random = random.Random(0)

    def __call__(self, arguments: Mapping[str, Any], limits: Limits) -> ToolResult:
        start = time.perf_counter()
        if self.delay_s[1] > 0:
            time.sleep(self.random.uniform(*self.delay_s))
        try:
            return self.tool(arguments, limits)
        finally:
            self.timeline.add("tools", start, time.perf_counter())


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in union(a) for s2, e2 in union(b))


# The runner's schedules compared in (b): its default; overlapping without waiting for more results; synchronous.
SCHEDULES: dict[str, dict[str, Any]] = {"overlap": {}, "overlap_gather0": {"gather": 0.0}, "sync": {"overlap": False}}


def timed_runner(
    service: RolloutService, execute: Any, delay_s: tuple[float, float], **schedule: Any
) -> tuple[EpisodeRunner, Timeline]:
    timeline = Timeline()

    def generate(prompts: list[list[int]], params: SamplingParams) -> Any:
        start = time.perf_counter()
        try:
            return service.generate(prompts, params, source="bench")
        finally:
            timeline.add("generate", start, time.perf_counter())

    tools = {"python": TimedTool(PythonTool(execute), timeline, delay_s)}
    return EpisodeRunner(generate, service.tokenizer, tools, concurrency=G, **schedule), timeline


def spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}  # fmt: skip


def timeline_arm(
    service: RolloutService, execute: Any, batches: int, delay_s: tuple[float, float], tasks: int
) -> dict[str, Any]:
    """(b) `batches` seeded batches of `tasks` tasks x G episodes, each run under every schedule (interleaved, the
    same seed: the same episodes, token for token, so they differ only in scheduling), and single-turn batches of
    as many samples at the episodes' mean model tokens; every engine and tool call timed."""
    modes = {name: timed_runner(service, execute, delay_s, **kw) for name, kw in SCHEDULES.items()}
    rules = episode_rules(SPEC, MAX_NEW_TOKENS, {"python"})
    prompts = [list(service.tokenizer.encode(TOOL_PROMPT, add_special_tokens=False))] * tasks
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in [*SCHEDULES, "single"]}
    equal = 0
    try:
        for runner, timeline in modes.values():  # warm-up, not counted
            runner.run(prompts, rules, SamplingParams(n=G, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS, seed=-1))
            timeline.generate.clear()
            timeline.tools.clear()
        for b in range(batches):
            params = SamplingParams(n=G, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS, seed=b)
            order = list(SCHEDULES)[b % len(SCHEDULES) :] + list(SCHEDULES)[: b % len(SCHEDULES)]  # rotated
            for mode in order:
                runner, timeline = modes[mode]
                calls_before = len(timeline.generate)
                start = time.perf_counter()
                episodes = [e for group in runner.run(prompts, rules, params).episodes for e in group]
                wall = time.perf_counter() - start
                runs[mode].append({"wall_s": wall, "episodes": len(episodes),
                                   "model_tokens": sum(sum(e.token_mask) for e in episodes),
                                   "all_tokens": sum(len(e.token_ids) for e in episodes),
                                   "tool_calls": sum(e.stats.tool_calls for e in episodes),
                                   "engine_calls": len(timeline.generate) - calls_before,
                                   "tokens": [e.token_ids for e in episodes]})  # fmt: skip
            # Single-turn at the episodes' mean model tokens so far (equal generated tokens).
            sync = runs["sync"]
            equal = max(1, round(sum(r["model_tokens"] for r in sync) / sum(r["episodes"] for r in sync)))
            single = SamplingParams(n=G, temperature=1.0, max_new_tokens=equal, seed=b)
            start = time.perf_counter()
            outputs, _, _ = service.generate(prompts, single, source="bench")
            wall = time.perf_counter() - start
            tokens = sum(len(s.token_ids) for o in outputs for s in o.samples)
            runs["single"].append({"wall_s": wall, "episodes": G * tasks, "model_tokens": tokens, "all_tokens": tokens})
    finally:
        for runner, _ in modes.values():
            runner.close()
    same = all(len({str(r["tokens"]) for r in rs}) == 1 for rs in zip(*(runs[m] for m in SCHEDULES), strict=True))
    out: dict[str, Any] = {"delay_s": delay_s, "batches": batches, "tasks_per_batch": tasks,
                           "single_turn_max_new_tokens": equal, "same_episodes_in_every_schedule": same}  # fmt: skip
    for mode, rs in runs.items():
        wall = sum(r["wall_s"] for r in rs)
        out[mode] = {
            "wall_s_per_batch": spread([r["wall_s"] for r in rs]),
            "episodes_per_s": round(sum(r["episodes"] for r in rs) / wall, 2),
            "model_tokens_per_s": round(sum(r["model_tokens"] for r in rs) / wall, 1),
            "all_tokens_per_s": round(sum(r["all_tokens"] for r in rs) / wall, 1),
            "model_tokens_per_episode": round(sum(r["model_tokens"] for r in rs) / sum(r["episodes"] for r in rs), 2),
        }
        if mode == "single":
            continue
        timeline = modes[mode][1]
        tool_union, engine_calls = length(union(timeline.tools)), sum(r["engine_calls"] for r in rs)
        out[mode].update({
            "engine_calls_per_batch": round(engine_calls / len(rs), 2),
            "generate_s_per_batch": round(length(union(timeline.generate)) / len(rs), 4),
            "tool_calls": sum(r["tool_calls"] for r in rs),
            "tool_call_s_mean": round(length(timeline.tools) / max(len(timeline.tools), 1), 4),
            "tool_share_of_wall": round(tool_union / wall, 4),
            "tool_calls_at_once": round(length(timeline.tools) / tool_union, 2) if tool_union else 0.0,
            "tool_time_overlapping_generation": round(overlap(timeline.tools, timeline.generate) / tool_union, 4)
            if tool_union else 0.0,
            # Paired with sync: the same seeded batch, so the machine's drift between batches cancels.
            "speedup_vs_sync": spread([s["wall_s"] / r["wall_s"] for r, s in zip(rs, runs["sync"], strict=True)]),
        })  # fmt: skip
    for mode in SCHEDULES:
        out[mode]["episodes_per_s_vs_single"] = round(out[mode]["episodes_per_s"] / out["single"]["episodes_per_s"], 3)
        out[mode]["model_tokens_per_s_vs_single"] = round(
            out[mode]["model_tokens_per_s"] / out["single"]["model_tokens_per_s"], 3
        )
    return out


def summary(repeats: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per tool latency, the headline numbers of every repeat (the spread between repeats of the whole arm)."""
    out = []
    for arms in zip(*repeats, strict=True):
        row: dict[str, Any] = {
            "delay_s": arms[0]["delay_s"],
            "tasks_per_batch": arms[0]["tasks_per_batch"],
            "same_episodes_in_every_schedule": all(a["same_episodes_in_every_schedule"] for a in arms),
            "single_samples_per_s": [a["single"]["episodes_per_s"] for a in arms],
        }
        for mode in SCHEDULES:
            row[mode] = {
                key: [a[mode][key] for a in arms]
                for key in ("tool_time_overlapping_generation", "episodes_per_s", "episodes_per_s_vs_single",
                            "model_tokens_per_s_vs_single", "engine_calls_per_batch", "tool_share_of_wall")
            }  # fmt: skip
            if mode != "sync":
                row[mode]["speedup_vs_sync_median"] = [a[mode]["speedup_vs_sync"]["median"] for a in arms]
        out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=8, help="tasks (of 8 samples) per arm and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=8, help="episode batches per timeline arm and schedule")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the timeline arms (their spread)")
    parser.add_argument("--delay-s", type=float, default=0.2, help="stand-in extra latency per tool call")
    parser.add_argument(
        "--batch-tasks", type=int, nargs="+", default=[1, 4], help="tasks (of G episodes) per timed batch (4: the "
        "worker's default worker_batch_tasks)"
    )  # fmt: skip
    parser.add_argument("--skip-throughput", action="store_true", help="(b) only; keeps (a) from the last results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-episodes-"))
    model = tool_model_path(cache_root() / "models")  # trained once (minutes on 2 busy cores), then reused
    reward = start_reward(workers=2, timeout_s=120)
    results: dict[str, Any] = {"workload": f"tool model (tiny Qwen2, fp32, 1 torch thread), {G} samples per task, "
                               f"T=1, max_new_tokens {MAX_NEW_TOKENS} per turn, episodes tagged, max_turns 3"}  # fmt: skip
    try:
        if args.skip_throughput:
            results["throughput"] = json.loads(RESULTS.read_text())["throughput"]
        else:
            results["throughput"] = throughput(model, reward.grpc_addr, log_dir, args.tasks, args.rounds)
        service = RolloutService(HFEngine(str(model), torch_threads=1), str(model), "bench")
        client = RewardClient(reward.grpc_addr)
        try:
            delays = [(0.0, 0.0), (args.delay_s, args.delay_s), (0.0, 2 * args.delay_s)]
            repeats = [
                [timeline_arm(service, client.execute, args.batches, d, n) for n in args.batch_tasks for d in delays]
                for _ in range(args.repeats)
            ]
        finally:
            client.close()
            service.close()
    finally:
        reward.stop()
    results["timeline_summary"] = summary(repeats)
    results["timeline"] = repeats
    results["machine"] = "2-core CPU, shared with other jobs"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    log.info("wrote %s", RESULTS)
    scalars = {k: v for k, v in results["throughput"].items() if not isinstance(v, dict | list)}
    log.info("throughput: %s", json.dumps(scalars))
    log.info("timeline: %s", json.dumps(results["timeline_summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
