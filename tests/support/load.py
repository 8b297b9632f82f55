"""Loading a service over HTTP, for the overload fault test and bench/bench_load.py: a closed loop that measures
what it serves, an open loop that offers a fixed rate whatever the answers, and a process tree's memory."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


def answered_200(reply: httpx.Response) -> bool:
    return reply.status_code == 200


def closed_loop_rate(
    url: str,
    body: dict[str, Any],
    seconds: float,
    clients: int = 4,
    served: Callable[[httpx.Response], bool] = answered_200,
) -> float:
    """Requests per second that `served` counts, `clients` threads each POSTing `body` to `url` back to back."""
    done, stop = [0], time.monotonic() + seconds

    def loop() -> None:
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < stop:
                if served(client.post(url, json=body)):
                    done[0] += 1

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / seconds


async def open_loop(url: str, body: dict[str, Any], rate: float, seconds: float) -> tuple[Counter[int], float]:
    """POST `body` to `url` at `rate` per second for `seconds`, whatever the answers: (status counts, -1 for a
    transport error; the wall time until the last answer)."""
    codes: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def one() -> None:
            try:
                codes[(await client.post(url, json=body)).status_code] += 1
            except httpx.HTTPError:
                codes[-1] += 1

        # Requests go out on schedule (not when an answer comes back): an overloaded service gets more than it serves.
        tasks, start, i = [], time.monotonic(), 0
        while (now := time.monotonic() - start) < seconds:
            while i < rate * now:
                tasks.append(asyncio.create_task(one()))
                i += 1
            await asyncio.sleep(0.005)
        await asyncio.gather(*tasks)
        return codes, time.monotonic() - start


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and all its descendants (MiB), from /proc."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(status.split("VmRSS:")[1].split()[0]) / 1024
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (OSError, IndexError):
            continue
    return total
