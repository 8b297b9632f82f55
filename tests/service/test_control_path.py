"""bench/bench_control_path.py in a tiny configuration: real Redis, the trainer's loop, two worker loops.

The benchmark's numbers mean something only if the path it times loses nothing: every published task must
end trained or dropped with its reason, once, in the accounting, the ledger, the workers' counts and Redis.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from grpo.local.redis_server import RedisServer

pytestmark = pytest.mark.slow  # 10–15 s on 2 shared cores: torch, the trainer loop, two replica processes

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_control_path.py"
STEPS, PROMPTS = 4, 8


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """The benchmark script as a module (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("bench_control_path", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def arm(bench: ModuleType, redis_server: RedisServer) -> dict[str, Any]:
    """One tiny run (2 replicas, 4 steps of 8 prompts × G = 4) on the session's Redis, measured from its start."""
    assert redis_server.child is not None
    # max_staleness = STEPS: a group that arrives after the next batch's (replicas finish out of order) is still
    # trained, so the expected outcome of each task depends on its id alone.
    opts = bench.ArmOptions(steps=STEPS, skip=0, prompts=PROMPTS, group_size=4, idle_s=0.2, checkpoint_every=2,
                            max_staleness=STEPS)  # fmt: skip
    # A fixed run id: its task ids, hence which groups the stand-in engine makes all-correct, are known.
    return dict(bench.run_arm(redis_server.url, redis_server.child.pid, 2, opts, run_id="cptest"))


def test_every_published_task_is_trained_or_dropped_with_its_reason_once(
    bench: ModuleType, arm: dict[str, Any]
) -> None:
    books = arm["books"]
    ledger: dict[str, str] = books["ledger"]
    assert books["published"] == STEPS * PROMPTS == books["ledger_rows"] == len(ledger)  # each task once
    expected = {tid: "zero_variance" if bench.all_correct(tid) else "trained" for tid in ledger}
    assert ledger == expected
    n_dropped = sum(outcome == "zero_variance" for outcome in expected.values())
    assert 0 < n_dropped < len(ledger)  # 1 in 8 ids on average: both outcomes occur
    assert books["trained"] == STEPS * PROMPTS - n_dropped
    assert books["dropped"] == {"zero_variance": n_dropped}
    assert (books["in_flight"], books["duplicates"], books["balanced"]) == (0, 0, True)


def test_workers_wrote_each_group_once_and_redis_holds_nothing_unacked(arm: dict[str, Any]) -> None:
    counts = arm["worker_counts"]
    assert counts["done"] == arm["books"]["published"]
    assert {k: v for k, v in counts.items() if k != "done" and v} == {}  # no failed, reclaimed, dropped, errors
    left = arm["stream_left"]
    assert left["tasks"]["pending"] + left["tasks"]["lag"] == 0
    assert left["groups"]["pending"] + left["groups"]["lag"] == 0  # the final checkpoint acked every group


def test_the_window_counts_groups_and_redis_commands(arm: dict[str, Any]) -> None:
    # skip=0: the window is the whole run, so the per-group counts are exact where the protocol fixes them.
    assert arm["groups"] == STEPS * PROMPTS and arm["groups_per_s"] > 0 and arm["wall_ms_per_group"] > 0
    per_command = arm["redis_commands_per_group_by_command"]
    assert per_command["xadd"] == 2.0  # the task's, and the group's inside the append script
    assert per_command["evalsha"] >= 1.0 and per_command["xack"] >= 1.0  # the append script (+ lease renewals)
    assert arm["redis_commands_per_group"] >= 5
