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
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from grpo.local.services import start_reward

RESULTS = Path(__file__).parent / "results" / "load.json"
CODE = "x = 0\nfor i in range(400_000):\n    x += i\nprint(x)"  # ~50 ms of sandboxed CPU per call
BODY = {"language": "python", "code": CODE}
log = logging.getLogger("bench_load")


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its descendants (MiB)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += int(Path(f"/proc/{p}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (OSError, IndexError):
            continue
    return total


def capacity(url: str, seconds: float, clients: int = 4) -> float:
    done, stop = [0], time.monotonic() + seconds

    def loop() -> None:
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < stop:
                if client.post(f"{url}/v1/execute", json=BODY).status_code == 200:
                    done[0] += 1

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / seconds


async def offer(url: str, rate: float, seconds: float) -> tuple[Counter[int], float]:
    """Open loop at `rate`/s for `seconds`; (status counts, wall until the last answer)."""
    codes: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def one() -> None:
            try:
                codes[(await client.post(f"{url}/v1/execute", json=BODY)).status_code] += 1
            except httpx.HTTPError:
                codes[-1] += 1

        tasks, start, i = [], time.monotonic(), 0
        while (now := time.monotonic() - start) < seconds:
            while i < rate * now:
                tasks.append(asyncio.create_task(one()))
                i += 1
            await asyncio.sleep(0.005)
        await asyncio.gather(*tasks)
        return codes, time.monotonic() - start


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
        cap = capacity(url, 3.0)
        rss0 = rss_mb(proc.pid)
        runs: list[dict[str, Any]] = []
        for factor in (2.0, 4.0, 8.0):
            codes, wall = asyncio.run(offer(url, factor * cap, args.seconds))
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
