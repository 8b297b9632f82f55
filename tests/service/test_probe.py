"""Adaptive group size (probe_size) through real parts: the rollout worker over a private Redis with the answer model
(tests/support/answer_model.py: right about three times in four) and the reward service, then a whole GRPO run.

A probe of 2 of a group of 4: the prompts whose gold the model never gives (a + b + 50) agree in every probe and must
come back as 2-sample groups; the solvable ones come back short when their 2 agree, whole when they do not, and each
sample's score must be its own (the rest's results are renumbered after the probe's)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from grpo.common.queue import RunQueue, connect
from grpo.common.registry import ReplicaRegistry
from grpo.common.tiny_model import cache_root
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.records import Generated
from grpo.rollout.service import RolloutService
from grpo.rollout.settings import RolloutSettings
from grpo.rollout.worker import RolloutWorker
from grpo.rollout.worker_wiring import reward_client, run_worker, service_generator
from grpo.trainer.ledger import read_ledger
from grpo.trainer.publisher import position_of, row_of
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2
from tests.support.answer_model import PROBLEMS, answer_model_path, prompt
from tests.support.trainer_proc import read_metrics, run_trainer, trainer_config, write_rows

pytestmark = pytest.mark.slow
RUN = "probe"
SOLVABLE = 4


@pytest.fixture(scope="module")
def service() -> Iterator[RolloutService]:
    model = str(answer_model_path(cache_root() / "test-models"))
    svc = RolloutService(HFEngine(model, torch_threads=1), model, "inproc")
    yield svc
    svc.close()


def task(tid: str, a: int, b: int, gold: int, seed: int) -> queue_pb2.PromptTask:
    return queue_pb2.PromptTask(
        task_id=tid,
        prompt=rollout_pb2.Prompt(text=prompt(a, b)),
        checks=reward_pb2.Checks(math=reward_pb2.MathCheck(gold=str(gold))),
        weights={"math": 1.0},
        sampling=rollout_pb2.SamplingParams(n=4, temperature=1.0, max_new_tokens=24, seed=seed),
        probe=queue_pb2.ProbeSpec(size=2, on="reward"),
    )


def tasks(seed: int = 3) -> list[queue_pb2.PromptTask]:
    right = [task(f"r{a}{b}", a, b, a + b, seed) for a, b in PROBLEMS]
    never = [task(f"n{a}{b}", a, b, a + b + 50, seed) for a, b in PROBLEMS[:SOLVABLE]]
    return right + never


def settings(redis_url: str, reward_addr: str) -> RolloutSettings:
    return RolloutSettings(redis_url=redis_url, reward_addr=reward_addr, replica_id="p1", advertise_host="127.0.0.1",
                           grpc_port=0, run=RUN)  # fmt: skip


def check_groups(sent: Sequence[queue_pb2.PromptTask], groups: dict[str, queue_pb2.GroupRecord]) -> tuple[int, int]:
    """Every group is a flat probe or a whole group (whose probe varied), each sample scored on its own answer;
    (short, whole) counts."""
    short = whole = 0
    for t in sent:
        g = groups[t.task_id]
        assert g.status == "ok", g.error
        rewards = [s.reward for s in g.samples]
        for s in g.samples:  # the score belongs to this sample's text: a renumbering slip would mix them up
            assert s.reward == (1.0 if f"<answer>{t.checks.math.gold}</answer>" in s.completion.text else 0.0), (
                t.task_id, s.completion.text, s.reward)  # fmt: skip
        if len(rewards) == 2:
            assert rewards[0] == rewards[1], (t.task_id, rewards)
            short += 1
        else:  # widened because its probe varied; sampled whole after new weights, any 4 (its probe is gone)
            assert len(rewards) == 4 and (rewards[0] != rewards[1] or g.discarded_samples), (t.task_id, rewards)
            whole += 1
    return short, whole


def test_flat_probes_come_back_short_and_the_others_whole(
    service: RolloutService, redis_url: str, live_reward: Any
) -> None:
    queue = RunQueue(connect(redis_url), RUN)
    queue.ensure_groups()
    sent = tasks()
    queue.publish_tasks(sent)
    stop = threading.Event()
    thread = threading.Thread(target=run_worker, args=(service, settings(redis_url, live_reward.grpc_addr), stop))
    thread.start()
    groups: dict[str, queue_pb2.GroupRecord] = {}
    try:
        while len(groups) < len(sent):
            entries = queue.read_groups("test-trainer", count=50, block_ms=500)
            groups.update({e.message.group_id: e.message for e in entries if e.message is not None})
            queue.ack_groups([e.entry_id for e in entries])
            assert thread.is_alive()
    finally:
        stop.set()
        thread.join(timeout=60)
    short, whole = check_groups(sent, groups)
    assert all(len(groups[t.task_id].samples) == 2 for t in sent if t.task_id.startswith("n"))  # never solved
    assert short >= SOLVABLE and whole >= 1, (short, whole)  # both kinds happened
    assert all(g.discarded_samples == 0 for g in groups.values())  # no weights came in between


def test_new_weights_between_probe_and_rest_sample_the_group_whole(
    service: RolloutService, redis_url: str, live_reward: Any
) -> None:
    """The trainer's push can land between the probe's engine call and the rest's: a group is one policy's samples,
    so the widened groups are sampled whole under the new weights, and the thrown-away probe is counted."""
    assert isinstance(service.engine, HFEngine)
    generate = service_generator(service)
    calls: list[int] = []

    def generate_then_push(batch: Sequence[queue_pb2.PromptTask]) -> Generated:
        out = generate(batch)
        calls.append(out.weight_version)
        if len(calls) == 1:  # a push right after the probes: the same values under the next version
            live = {k: v.detach().clone() for k, v in service.engine.weights().items()}
            service.load_weights(service.version + 1, f"v{service.version + 1}", live)
        return out

    s = settings(redis_url, live_reward.grpc_addr)
    client = connect(redis_url)
    worker = RolloutWorker(generate_then_push, lambda: (service.version, service.checksum),
                           reward_client(s).score, RunQueue(client, RUN), ReplicaRegistry(client, RUN),
                           replica_id="p2", address="127.0.0.1:0", options=s)  # fmt: skip
    sent = tasks(seed=5)
    before = service.version
    records = worker._generate_and_score(sent)
    groups = {r.group_id: r for r in records}
    assert [r.group_id for r in records] == [t.task_id for t in sent]  # in the batch's order
    _, whole = check_groups(sent, groups)
    assert whole >= 1 and len(calls) == 3  # probes, rest (under new weights), the widened groups whole
    for r in records:
        if len(r.samples) == 2:  # cut at the probe: the probe's weights
            assert (r.weight_version, r.discarded_samples) == (before, 0)
        else:  # widened: all 4 from the new weights; the old probe's 2 and the rest's 2 counted as thrown away
            assert (r.weight_version, r.discarded_samples) == (before + 1, 4)
            assert r.discarded_tokens >= 4


def test_a_reward_outage_after_the_probes_fails_only_the_widened_groups(
    service: RolloutService, redis_url: str, live_reward: Any
) -> None:
    """The reward service answers the probes, then fails on the rest: the widened groups fail with the reason (never
    a reward of 0), their probes counted as thrown away; the groups cut at their probe are written as they are."""
    s = settings(redis_url, live_reward.grpc_addr)
    score = reward_client(s).score
    calls: list[int] = []

    def score_then_fail(items: list[reward_pb2.ScoreItem]) -> list[reward_pb2.ScoreResult]:
        calls.append(len(items))
        if len(calls) > 1:
            raise ConnectionError("reward service unreachable (injected after the probes)")
        return score(items)

    client = connect(redis_url)
    worker = RolloutWorker(service_generator(service), lambda: (service.version, service.checksum), score_then_fail,
                           RunQueue(client, RUN), ReplicaRegistry(client, RUN), replica_id="p3",
                           address="127.0.0.1:0", options=s)  # fmt: skip
    sent = tasks(seed=3)
    records = worker._generate_and_score(sent)
    failed = [r for r in records if r.status != "ok"]
    assert failed and len(calls) == 2
    for r in records:
        if r.status == "ok":  # cut at the probe
            assert len(r.samples) == 2 and r.samples[0].reward == r.samples[1].reward
        else:
            assert "reward service" in r.error and "injected" in r.error
            assert not any(x.HasField("reward") for x in r.samples)
            assert (len(r.samples), r.discarded_samples) == (2, 2)  # the rest's 2, unscored; the probe's 2 thrown


@pytest.mark.parametrize("probe_all", [True, False])
def test_a_grpo_run_trains_the_widened_groups_and_counts_every_sample(
    tmp_path: Path, redis_url: str, rollout_for: Callable[..., Any], probe_all: bool
) -> None:
    """probe_all probes every task (with refill here); by default only a row whose last group says the probe pays
    gets one (here the never-solved rows, 0 of 4, from their second group on; unseen rows sample whole groups).
    Without refill every step settles its 4 tasks before the next are published, so each row's second group is
    published after its first was judged."""
    model = answer_model_path(cache_root() / "test-models")
    rollout_for(RUN)
    problems = PROBLEMS[:SOLVABLE]
    train = [{"id": f"p{a}{b}", "prompt": prompt(a, b), "gold": str(a + b)} for a, b in problems] + [
        {"id": f"n{a}{b}", "prompt": prompt(a, b), "gold": str(a + b + 50)} for a, b in problems]  # fmt: skip
    config = trainer_config(
        tmp_path, RUN, redis_url, model=str(model), train_data=str(write_rows(tmp_path / "probe.jsonl", train)),
        steps=5, prompts_per_step=4, group_size=4, probe_size=2, probe_all=probe_all, refill_zero_variance=probe_all,
        max_refill_per_step=4,
        max_new_tokens=24, stop=[], overlong_soft_penalty=False, reward_weights={"math": 1.0}, checkpoint_every=1,
    )  # fmt: skip
    run_trainer(config, tmp_path / "trainer.log", timeout=240)
    out = tmp_path / "out"
    metrics = [r for r in read_metrics(out) if "groups/train" in r]
    ledger = read_ledger(out / "ledger")
    never = [e for e in ledger if row_of(str(e["task_id"]), len(train), 0) >= SOLVABLE]
    assert never and all(e["outcome"] == "zero_variance" for e in never)
    cut = sum(r["groups/probe_flat"] for r in metrics)
    probed = sum(r["tasks/probed"] for r in metrics)
    if probe_all:
        assert cut >= len(never)  # each cut at its probe: 2 samples, not 4
        assert probed == metrics[-1]["tasks/published"]  # every task carried the probe
    else:  # a row's first group is whole; a never-solved row is probed (and cut) from its second on
        judged_before = [e for e in ledger if position_of(str(e["task_id"]))[0] > 0]
        later_never = [e for e in never if position_of(str(e["task_id"]))[0] > 0]
        in_flight = metrics[-1]["tasks/in_flight"]  # published, not settled when the run ended
        assert later_never and len(later_never) <= cut <= probed <= len(judged_before) + in_flight, (cut, probed)
    # trained groups (with probe_all each a widened probe: one left short would have failed, not trained)
    assert sum(r["groups/train"] for r in metrics) > 0
    for r in metrics:
        assert r["groups/failed"] == 0, r
        flat, cut = r["groups/zero_variance"], r["groups/probe_flat"]
        assert r["groups/zero_variance_samples"] >= 2 * cut + 4 * (flat - cut), r
        assert r["rollout/samples"] >= 4 * r["groups/train"] + r["groups/zero_variance_samples"], r
        assert r["rollout/tokens"] >= r["groups/zero_variance_tokens"] > 0 or flat == 0, r
