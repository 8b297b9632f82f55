"""Adaptive group size (probe_size) on the trainer's side: the settings' refusals, which tasks carry the probe (where
the row's record says it pays; never evaluation or value tasks), why a probe group fails, and the step's rollout
spend."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from grpo.common.queue import RunQueue, connect
from grpo.trainer.accounting import Accounting
from grpo.trainer.assemble import resolve_algo, task_spec
from grpo.trainer.config import parse_settings
from grpo.trainer.consumer import failure_reason, spend_metrics
from grpo.trainer.data import load_rows
from grpo.trainer.difficulty import BucketRules, DifficultyTracker, flat_chance, probe_pays
from grpo.trainer.order import DataCursor
from grpo.trainer.publisher import Publisher, build_task
from grpo.v1 import queue_pb2


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "1+1?", "gold": "2"}\n')
    return path


@pytest.fixture
def base(data: Path) -> list[str]:
    return ["--train-data", str(data), "--group-size", "8"]


def test_the_settings_are_checked(base: list[str]) -> None:
    assert (parse_settings(base).probe_size, parse_settings(base).probe_all) == (0, False)  # off: whole groups
    assert parse_settings([*base, "--probe-size", "4"]).probe_size == 4
    for size in ("1", "8", "9"):
        with pytest.raises(ValidationError, match=r"2 <= probe_size < group_size"):
            parse_settings([*base, "--probe-size", size])
    with pytest.raises(ValidationError, match="probe_size"):
        parse_settings([*base, "--probe-size", "-1"])
    with pytest.raises(ValidationError, match="needs skip_zero_variance"):
        parse_settings([*base, "--probe-size", "4", "--skip-zero-variance", "false"])
    with pytest.raises(ValidationError, match="credit 'process'"):
        parse_settings([*base, "--probe-size", "4", "--credit", "process", "--step-check", '{"source": "rule"}'])
    with pytest.raises(ValidationError, match="mode sft samples none"):
        parse_settings([*base, "--mode", "sft", "--probe-size", "4"])
    assert parse_settings([*base, "--probe-size", "4", "--probe-all"]).probe_all
    with pytest.raises(ValidationError, match="probe_all sends every task's probe, but probe_size is 0"):
        parse_settings([*base, "--probe-all"])


def test_a_probe_pays_where_a_short_group_is_not_flat_by_chance() -> None:
    """k · P(flat of k) < G · P(flat of G) under the row's posterior Beta(1 + solved, 1 + missed). By hand for G 8,
    probe 4, after 7 of 8: E[p^4] = 8·9·10·11 / (10·11·12·13) = 72/156, E[(1-p)^4] = 2·3·4·5 / (10·11·12·13);
    E[p^8] = 8·9 / (16·17), E[(1-p)^8] = 2·3·…·9 / (10·11·…·17) -> 4 · 0.4654 = 1.862 < 8 · 0.2651 = 2.121."""
    assert 4 * flat_chance(7, 8, 4) == pytest.approx(4 * (72 / 156 + 120 / 17160))
    assert 8 * flat_chance(7, 8) == pytest.approx(8 * (72 / 272 + 362880 / (17 * 16 * 15 * 14 * 13 * 12 * 11 * 10)))
    assert [s for s in range(9) if probe_pays(s, 8, 4, 8)] == [0, 1, 7, 8]
    assert [s for s in range(5) if probe_pays(s, 4, 4, 8)] == [0, 4]  # after a flat probe: probe again
    assert not any(probe_pays(s, 8, 7, 8) for s in range(2, 7))


def test_the_tracker_probes_the_rows_whose_record_says_so() -> None:
    t = DifficultyTracker(BucketRules(probe_size=4))
    assert t.rules.active and not t.probes(0, 8)  # unseen: whole groups
    t.observe(0, 0, 1, [1.0] * 8)  # 8 of 8
    t.observe(1, 0, 1, [1.0] * 4 + [0.0] * 4)  # 4 of 8
    t.observe(2, 0, 1, [None] * 8)  # no correctness: no record to read
    assert [t.probes(r, 8) for r in range(3)] == [True, False, False]
    every = DifficultyTracker(BucketRules(probe_size=4, probe_all=True), t.records)
    assert all(every.probes(r, 8) for r in range(4))
    assert not DifficultyTracker(BucketRules(), t.records).probes(0, 8)
    assert not any(t.skips(r, 1) for r in range(3))  # a probe passes over nothing


def test_a_flat_probe_predicts_the_next_group_of_g_not_of_its_own_size() -> None:
    """After 4 of 4 right, a group of 4 is flat 56 % likely but a group of 8 only 39 % (5/13 + 1/1287): skip_flat_above
    0.5 sets a row aside after 8 of 8 right (53 %), not after a flat probe of 4."""
    assert flat_chance(4, 4) == pytest.approx(5 / 9 + 1 / 126)
    assert flat_chance(4, 4, 8) == pytest.approx(5 / 13 + 1 / 1287)
    rules = BucketRules(skip_flat_above=0.5, probe_size=4, group_size=8)
    t = DifficultyTracker(rules)
    t.observe(0, 0, 1, [1.0] * 4)  # a flat probe
    t.observe(1, 0, 1, [1.0] * 8)  # a flat whole group
    assert [t.predicts_flat(r) for r in (0, 1)] == [False, True]


@pytest.mark.parametrize(("extra", "on"), [([], "reward"), (["--refill-zero-variance", "true"], "accuracy"),
                                           (["--zero-variance-on", "accuracy"], "accuracy")])  # fmt: skip
def test_training_tasks_carry_the_probe_on_what_the_filter_compares(
    base: list[str], data: Path, extra: list[str], on: str
) -> None:
    """`auto` is resolved as the zero-variance filter resolves it: the rollout must call flat what triage drops."""
    s = parse_settings([*base, "--probe-size", "4", *extra])
    spec = task_spec(s, resolve_algo(s))
    row = load_rows(data)[0]
    task = build_task(row, "t-e0-0", 0, spec)
    assert (task.sampling.n, task.probe.size, task.probe.on) == (8, 4, on)
    assert not build_task(row, "t-eval", 0, spec, evaluation=True).HasField("probe")  # one sample: nothing to probe
    plain = parse_settings(base)
    assert not build_task(row, "t-e0-0", 0, task_spec(plain, resolve_algo(plain))).HasField("probe")


def group(gid: str, rewards: list[float], tokens: int = 3) -> queue_pb2.GroupRecord:
    record = queue_pb2.GroupRecord(group_id=gid, task_id=gid, status="ok")
    for r in rewards:
        sample = record.samples.add(reward=r)
        sample.completion.token_ids.extend(range(tokens))
    return record


def test_a_probe_that_varies_but_came_back_short_says_so() -> None:
    short = group("a", [1.0, 0.0])
    assert "probe of 2 samples whose signal varies" in failure_reason(short, 4, probe_size=2)
    assert failure_reason(group("b", [1.0, 0.0, 1.0]), 4, probe_size=2) == "3 samples where the group size is 4"


def test_the_spend_counts_every_sample_that_came_back() -> None:
    settled = [
        ("t1", "train", group("t1", [1.0, 0.0, 1.0, 1.0], tokens=5)),
        ("t2", "zero_variance", group("t2", [1.0, 1.0], tokens=2)),  # a flat probe
        ("t3", "zero_variance", group("t3", [0.0, 0.0, 0.0, 0.0], tokens=4)),  # flat after widening (a clip)
        ("t4", "timeout", None),
        ("t5", "failed", group("t5", [])),
    ]
    out = spend_metrics(settled, probe_size=2)
    assert out == {
        "rollout/samples": 10.0, "rollout/tokens": 4 * 5 + 2 * 2 + 4 * 4.0,
        "groups/zero_variance_samples": 6.0, "groups/zero_variance_tokens": 2 * 2 + 4 * 4.0, "groups/probe_flat": 1.0,
    }  # fmt: skip
    assert "groups/probe_flat" not in spend_metrics(settled)  # whole groups: no probe to count
    resampled = group("t6", [0.0, 0.0, 0.0, 0.0], tokens=1)  # new weights came after its probe: sampled whole
    resampled.discarded_samples, resampled.discarded_tokens = 2, 9
    again = spend_metrics([*settled, ("t6", "zero_variance", resampled)], probe_size=2)
    assert (again["rollout/samples"], again["rollout/tokens"]) == (10.0 + 4 + 2, out["rollout/tokens"] + 4 + 9)
    assert (again["groups/zero_variance_samples"], again["groups/probe_flat"]) == (6.0 + 6, 1.0)


def test_the_publisher_sends_the_probe_where_the_record_says_so(tmp_path: Path, redis_url: str) -> None:
    """Through a real Redis: unseen rows get whole groups; after a judged group, a row last solved 8 of 8 gets the
    probe and one solved 4 of 8 does not; a value task never carries it; a republished task decides again."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+1?", "gold": "{i + 1}"}}\n' for i in range(3)))
    s = parse_settings(["--train-data", str(data), "--group-size", "8", "--probe-size", "4"])
    tracker = DifficultyTracker(BucketRules(probe_size=4, group_size=8))
    queue = RunQueue(connect(redis_url), "probe-pub")
    queue.ensure_groups()
    publisher = Publisher(queue, load_rows(data), task_spec(s, resolve_algo(s)), "run", DataCursor(seed=0),
                          difficulty=tracker)  # fmt: skip
    acct = Accounting()
    first = publisher.publish(3, 0, 0, acct)
    assert publisher.take_probed() == 0  # unseen: whole groups
    solved = {0: 8, 1: 4, 2: 0}
    for tid in first:
        row = publisher.row_index(tid)
        tracker.observe(row, 0, 1, [1.0] * solved[row] + [0.0] * (8 - solved[row]))
    second = publisher.publish(3, 1, 1, acct)
    tasks = {e.message.task_id: e.message for e in queue.read_tasks("w", 10) if e.message is not None}
    probed = {publisher.row_index(t) for t in second if tasks[t].HasField("probe")}
    assert probed == {0, 2} and publisher.take_probed() == 2  # 8 of 8 and 0 of 8; not 4 of 8
    assert all(tasks[t].probe.size == 4 for t in second if publisher.row_index(t) in probed)
    row0 = next(t for t in second if publisher.row_index(t) == 0)
    assert not publisher.value_task(row0, f"{row0}-v0", [1, 2], 1, 4).HasField("probe")
    tracker.observe(0, 1, 2, [1.0] * 4 + [0.0] * 4)  # row 0 is now middling: a new publication has no probe
    publisher.republish(row0, 2, acct)
    again = [e.message for e in queue.read_tasks("w", 10) if e.message is not None and e.message.task_id == row0]
    assert len(again) == 1 and not again[0].HasField("probe") and publisher.take_probed() == 0
