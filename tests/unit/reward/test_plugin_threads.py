"""A plug-in's own threads: timed from the start of each call, queueing bounded by the deadline, stuck ones named."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from grpo.reward.plugin_threads import Contained, PluginThreads, PluginTimeout


def test_the_timeout_counts_from_the_start_not_while_queued() -> None:
    release = threading.Event()
    threads = PluginThreads("p", timeout_s=0.5, threads=1)

    async def main() -> tuple[float, float]:
        deadline = time.monotonic() + 10
        blocker = asyncio.ensure_future(threads.call(lambda: release.wait(0.4) or 1.0, deadline))
        await asyncio.sleep(0.05)  # the blocker holds the only thread; the next call queues ~0.35s
        second = await threads.call(lambda: time.sleep(0.3) or 2.0, deadline)  # 0.3s run: within 0.5s of its start
        return await blocker, second

    assert asyncio.run(main()) == (1.0, 2.0)
    threads.close()


def test_queued_past_the_deadline_is_an_error_that_says_so_and_the_call_never_runs() -> None:
    release, ran = threading.Event(), threading.Event()
    threads = PluginThreads("p", timeout_s=5, threads=1)

    async def main() -> None:
        busy = asyncio.ensure_future(threads.call(lambda: release.wait(5), time.monotonic() + 10))
        await asyncio.sleep(0.05)
        with pytest.raises(PluginTimeout, match="no free thread for plug-in 'p' before the request's deadline"):
            await threads.call(ran.set, time.monotonic() + 0.2)
        release.set()
        await busy

    asyncio.run(main())
    time.sleep(0.1)
    assert not ran.is_set()
    threads.close()


def test_a_hung_call_times_out_and_when_every_thread_is_stuck_the_plugin_is_named() -> None:
    release = threading.Event()
    threads = PluginThreads("hangs", timeout_s=0.2, threads=2)

    async def main() -> None:
        for _ in range(2):
            with pytest.raises(PluginTimeout, match=r"gave no answer within 0\.2s of starting"):
                await threads.call(lambda: release.wait(30), time.monotonic() + 10)
        slow = PluginThreads("slow", timeout_s=5)
        with pytest.raises(PluginTimeout, match=r"deadline passed 0\.1s into plug-in 'slow' \(its own limit: 5s\)"):
            await slow.call(lambda: time.sleep(0.5), time.monotonic() + 0.1)
        slow.close()

    assert threads.problem() is None
    asyncio.run(main())
    problem = threads.problem()
    assert problem is not None and "plug-in 'hangs': all 2 of its threads are stuck" in problem
    release.set()
    time.sleep(0.1)
    assert threads.problem() is None and threads.stuck() == []
    threads.close()


def test_a_system_exit_comes_back_as_an_ordinary_exception() -> None:
    threads = PluginThreads("p", timeout_s=5, threads=1)

    async def main() -> None:
        with pytest.raises(Contained, match="SystemExit: 3"):
            await threads.call(lambda: sys.exit(3), time.monotonic() + 5)
        assert await threads.call(lambda: 7, time.monotonic() + 5) == 7  # the thread lives on

    asyncio.run(main())
    threads.close()


def test_plugin_threads_are_daemons() -> None:
    threads = PluginThreads("daemons", timeout_s=1, threads=2)
    mine = [t for t in threading.enumerate() if t.name.startswith("plugin-daemons-")]
    assert len(mine) == 2 and all(t.daemon for t in mine)
    threads.close()
