"""Load shedding of the reward service: offer 2×, 4× and 8× its measured capacity; how much is still served.

Reference (same run): the capacity measured closed-loop just before. Ratios written to bench/results/load.json:
served_ratio = served req/s under overload ÷ capacity (target ≥ 0.7: shedding keeps the service near capacity
instead of collapsing), shed fraction, errors (target 0: only 200 or 429), and RSS growth in MiB (target < 50).
Run: .venv/bin/python bench/bench_load.py [--seconds 8] [--queue 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import httpx

from grpo.local.services import start_reward

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a script's path starts at bench/: the load loops are shared with the fault test
from tests.support.load import closed_loop_rate, open_loop, rss_mb  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "load.json"
CODE = "x = 0\nfor i in range(400_000):\n    x += i\nprint(x)"  # ~50 ms of sandboxed CPU per call
BODY = {"language": "python", "code": CODE}
log = logging.getLogger("bench_load")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--queue", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    service = start_reward("--log-level", "WARNING", "--max-queue", str(args.queue), workers=1)
    url, proc = service.http_url, service.proc
    try:
        cap = closed_loop_rate(f"{url}/v1/execute", BODY, 3.0)
        rss0 = rss_mb(proc.pid)
        runs: list[dict[str, Any]] = []
        for factor in (2.0, 4.0, 8.0):
            codes, wall = asyncio.run(open_loop(f"{url}/v1/execute", BODY, factor * cap, args.seconds))
            offered = sum(codes.values())
            run = {
                "factor": factor,
                "offered": offered,
                "served": codes[200],
                "shed": codes[429],
                "errors": offered - codes[200] - codes[429],
                "served_ratio": round(codes[200] / wall / cap, 3),
                "shed_fraction": round(codes[429] / offered, 3),
                "rss_growth_mb": round(rss_mb(proc.pid) - rss0, 1),
            }
            log.info("%.0fx: %s", factor, run)
            runs.append(run)
        recovered = httpx.post(f"{url}/v1/execute", json=BODY, timeout=30).status_code == 200
    finally:
        service.stop()
        service.log_path.unlink(missing_ok=True)
    result = {"capacity_rps": round(cap, 1), "queue": args.queue, "runs": runs, "recovered": recovered}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    ok = recovered and all(r["errors"] == 0 and r["served_ratio"] >= 0.7 and r["rss_growth_mb"] < 50 for r in runs)
    log.info("capacity %.1f/s; %s -> %s", cap, "targets met" if ok else "TARGETS MISSED", RESULTS)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
