"""The rollout's probe (adaptive group size) as pure functions: which probes are widened, how the rest is asked
for, and how a probe and its rest become one group with results in sample order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo.rollout.probe import Sampled, probe_tasks, probing, rest_tasks, results_of, varies, whole_tasks
from grpo.rollout.records import Generated
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2


def task(tid: str, n: int = 8, size: int = 4, seed: int | None = 7) -> queue_pb2.PromptTask:
    sampling = rollout_pb2.SamplingParams(n=n, temperature=1.0, max_new_tokens=8)
    if seed is not None:
        sampling.seed = seed
    t = queue_pb2.PromptTask(task_id=tid, sampling=sampling)
    if size:
        t.probe.CopyFrom(queue_pb2.ProbeSpec(size=size, on="reward"))
    return t


def result(rid: str, reward: float | None, math: float | None = None) -> reward_pb2.ScoreResult:
    r = reward_pb2.ScoreResult(id=rid)
    if reward is not None:
        r.reward = reward
    if math is not None:
        r.components["math"].score = math
    return r


def test_probe_rest_and_whole_tasks() -> None:
    tasks = [task("a"), task("b", seed=None)]
    assert probing(tasks) and not probing([task("c", size=0)]) and not probing([task("d", n=4, size=4)])
    assert [(t.sampling.n, t.sampling.seed) for t in probe_tasks(tasks)] == [(4, 7), (4, 0)]
    rest = rest_tasks(tasks)
    # under its own seed the engine would repeat the probe's answers: the rest samples under seed + 1
    assert [(t.sampling.n, t.sampling.HasField("seed"), t.sampling.seed) for t in rest] == [(4, True, 8), (4, False, 0)]
    assert [(t.sampling.n, t.HasField("probe")) for t in whole_tasks(tasks)] == [(8, False), (8, False)]
    assert tasks[0].sampling.n == 8 and tasks[0].probe.size == 4  # the originals are untouched


def test_what_varies_is_what_the_trainer_compares() -> None:
    assert not varies([result("a/0", 1.0), result("a/1", 1.0)], "reward")
    assert varies([result("a/0", 1.0), result("a/1", 0.5)], "reward")
    # on accuracy equal correctness is flat however the rewards differ (DAPO's filter) ...
    assert not varies([result("a/0", 1.0, math=1.0), result("a/1", 0.8, math=1.0)], "accuracy")
    assert varies([result("a/0", 1.0, math=1.0), result("a/1", 1.0, math=0.0)], "accuracy")
    # ... and falls back on the rewards when a sample has no correctness score, as the trainer does
    assert varies([result("a/0", 1.0, math=1.0), result("a/1", 0.8)], "accuracy")
    # an unscored sample makes the group unscored however many samples it has: not worth widening
    assert not varies([result("a/0", 1.0), result("a/1", None)], "reward")


def test_results_are_the_tasks_own_in_sample_order() -> None:
    results = [result("a/1", 0.0), result("ab/0", 5.0), result("a/0", 1.0), result("a/x", 9.0)]
    assert [r.id for r in results_of(task("a"), results)] == ["a/0", "a/1"]


def completion(text: str) -> SimpleNamespace:
    return SimpleNamespace(text=text, token_ids=[1], logprobs=[-0.1], finish_reason="stop")


def generated(version: int, texts: list[list[str]]) -> Generated:
    return Generated([[10 + i] for i in range(len(texts))], [[completion(t) for t in ts] for ts in texts],
                     version, f"c{version}")  # fmt: skip


def test_a_widened_group_is_its_probe_then_its_rest() -> None:
    tasks = [task("a", n=4, size=2), task("b", n=4, size=2)]
    first = Sampled(generated(3, [["a0", "a1"], ["b0", "b1"]]),
                    [result(f"{t}/{i}", float(i)) for t in "ab" for i in range(2)], "", 1.0, 0.5)  # fmt: skip
    rest = Sampled(generated(3, [["b2", "b3"]]), [result("b/0", 7.0), result("b/1", 8.0)], "", 2.0, 0.25)
    wide = first.subset([1]).widened(rest, [tasks[1]], probe_size=2)
    assert wide.generated.prompt_token_ids == [[11]]
    assert [c.text for c in wide.generated.completions[0]] == ["b0", "b1", "b2", "b3"]
    assert [(r.id, r.reward) for r in results_of(tasks[1], wide.results or [])] == [
        ("b/0", 0.0), ("b/1", 1.0), ("b/2", 7.0), ("b/3", 8.0)]  # fmt: skip
    assert (wide.generate_s, wide.score_s) == (3.0, 0.75)
    stale = Sampled(generated(4, [["b2", "b3"]]), rest.results, "", 2.0, 0.25)
    with pytest.raises(ValueError, match="different weights"):  # the worker samples such groups whole instead
        first.subset([1]).widened(stale, [tasks[1]], probe_size=2)
