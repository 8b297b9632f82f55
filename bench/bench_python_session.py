"""What a python session (python_session: true) costs per call → bench/results/python_session.json.

Through a reward service started here (2 workers), the python tool runs episodes of CALLS calls, each call the same
kind of program, once as a session (call k replays the k - 1 before it) and once as fresh programs, the two
interleaved episode by episode. Per call index: the median latency of each arm and their ratio (session / fresh).
Two kinds of call: `small` (a few statements, what a model's calls mostly are: the interpreter's start dominates)
and `compute` (~20 ms of CPU each, which every later call of a session pays again).

The machine is shared (2 cores, other jobs): absolute numbers are context, the ratios carry.
Usage: python bench/bench_python_session.py [--episodes 10] [--calls 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from grpo.common.reward_client import RewardClient
from grpo.local.services import start_reward
from grpo.rollout.episodes.tools import Limits, PythonSession, PythonTool

RESULTS = Path(__file__).resolve().parent / "results" / "python_session.json"
LIMITS = Limits(timeout_s=5.0, output_chars=1000)
KINDS = {
    "small": "v{k} = sum(range({k} * 10))\nprint(v{k})",
    "compute": "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.02:\n    pass\nv{k} = {k}\nprint(v{k})",
}
log = logging.getLogger("bench_python_session")


def episode(tool: PythonTool, template: str, calls: int, session: PythonSession | None) -> list[float]:
    """Seconds per call of one episode; every call must succeed (a failed one would time nothing real)."""
    seconds = []
    for k in range(1, calls + 1):
        started = time.perf_counter()
        result = tool({"code": template.format(k=k)}, LIMITS, session)
        seconds.append(time.perf_counter() - started)
        assert not result.error, result.text
    return seconds


def arm(tool: PythonTool, template: str, episodes: int, calls: int) -> dict[str, Any]:
    fresh: list[list[float]] = []
    session: list[list[float]] = []
    for _ in range(episodes):  # interleaved: load drifts affect both arms alike
        fresh.append(episode(tool, template, calls, None))
        session.append(episode(tool, template, calls, PythonSession()))
    per_call = []
    for k in range(calls):
        f = statistics.median(e[k] for e in fresh)
        s = statistics.median(e[k] for e in session)
        per_call.append({"call": k + 1, "fresh_ms": round(1000 * f, 1), "session_ms": round(1000 * s, 1),
                         "ratio": round(s / f, 2)})  # fmt: skip
    return {"per_call": per_call, "mean_ratio": round(statistics.mean(c["ratio"] for c in per_call), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    reward = start_reward(workers=2, timeout_s=120)
    try:
        with RewardClient(reward.grpc_addr, timeout_s=30) as client:
            tool = PythonTool(client.execute)
            episode(tool, KINDS["small"], 2, PythonSession())  # warm the pool
            results: dict[str, Any] = {
                kind: arm(tool, template, args.episodes, args.calls) for kind, template in KINDS.items()
            }
    finally:
        reward.stop()
    results["workload"] = (f"{args.episodes} episodes x {args.calls} calls per arm and kind, the reward service's "
                           "python sandbox (2 workers), medians per call index")  # fmt: skip
    results["machine"] = "2-core CPU, shared with other jobs"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    log.info("wrote %s: %s", RESULTS, json.dumps({k: v["per_call"] for k, v in results.items() if k in KINDS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
