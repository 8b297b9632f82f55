"""The rollout worker loop in-process over a real Redis, the tiny model and a real reward service.

Just past 500 lines on purpose: the tests share a module's reward service and model, one start-up for all."""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch

from grpo.common.net import free_port
from grpo.common.queue import Entry, RunQueue, connect
from grpo.common.registry import ReplicaRegistry
from grpo.common.tiny_model import ensure_tiny_model
from grpo.local.redis_server import RedisServer
from grpo.rollout.engines.base import Sample
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.records import Generated, batches, score_items
from grpo.rollout.service import RolloutService, WeightsBroken
from grpo.rollout.settings import RolloutSettings
from grpo.rollout.worker import RolloutWorker
from grpo.rollout.worker_wiring import run_worker
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2

RUN = "wtest"


@pytest.fixture(scope="module")
def service() -> Iterator[RolloutService]:
    model = str(ensure_tiny_model())
    svc = RolloutService(HFEngine(model, torch_threads=1), model, "inproc")
    yield svc
    svc.close()


@pytest.fixture
def queue(redis_url: str) -> RunQueue:
    q = RunQueue(connect(redis_url), RUN)
    q.ensure_groups()
    return q


@pytest.fixture(autouse=True)
def fast_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker options through the environment, as a deployment would set them."""
    for name, value in {
        "RUN": RUN,
        "HEARTBEAT_S": "0.2",
        "RECLAIM_IDLE_S": "0.6",
        "WORKER_BLOCK_MS": "100",
        "REWARD_TIMEOUT_S": "3",
        "TASK_MAX_ATTEMPTS": "2",
    }.items():
        monkeypatch.setenv(f"GRPO_ROLLOUT_{name}", value)


@contextmanager
def worker(service: RolloutService, redis_url: str, reward_addr: str, replica_id: str = "w1") -> Iterator[None]:
    settings = RolloutSettings(
        redis_url=redis_url, reward_addr=reward_addr, replica_id=replica_id, advertise_host="127.0.0.1", grpc_port=0
    )
    stop = threading.Event()
    thread = threading.Thread(target=run_worker, args=(service, settings, stop), name=f"test-{replica_id}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the worker did not stop within 60 s"


def math_task(task_id: str, a: int, b: int, *, n: int = 4, text: str | None = None) -> queue_pb2.PromptTask:
    return queue_pb2.PromptTask(
        task_id=task_id,
        policy_version=0,  # what a fresh replica holds: no trainer pushes in these tests
        prompt=rollout_pb2.Prompt(text=text or f"What is {a} + {b}? Answer inside <answer></answer>."),
        checks=reward_pb2.Checks(math=reward_pb2.MathCheck(gold=str(a + b)), format=reward_pb2.FormatCheck()),
        sampling=rollout_pb2.SamplingParams(n=n, temperature=1.0, max_new_tokens=24, seed=1),
        task_type="math",
    )


def wait_groups(queue: RunQueue, ids: set[str], timeout: float = 60.0) -> dict[str, list[queue_pb2.GroupRecord]]:
    """Every group read (acked) until each id in `ids` has one; duplicates kept, by group id."""
    found: dict[str, list[queue_pb2.GroupRecord]] = {}
    deadline = time.monotonic() + timeout
    while not ids <= found.keys():
        assert time.monotonic() < deadline, f"groups missing after {timeout}s: {sorted(ids - found.keys())}"
        entries = queue.read_groups("test-trainer", count=50, block_ms=200)
        for e in entries:
            assert e.message is not None
            found.setdefault(e.message.group_id, []).append(e.message)
        queue.ack_groups([e.entry_id for e in entries])
    return found


def test_tasks_come_back_as_scored_groups(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    tasks = [math_task("m1", 2, 3), math_task("m2", 4, 4)]
    queue.publish_tasks(tasks)
    registry = ReplicaRegistry(connect(redis_url), RUN)
    with worker(service, redis_url, live_reward.grpc_addr):
        groups = wait_groups(queue, {"m1", "m2"})
        (replica,) = registry.live_replicas()
    assert (replica.replica_id, replica.weight_version, replica.weight_checksum) == ("w1", 0, service.checksum)
    assert registry.live_replicas() == []  # a graceful stop deregisters at once
    assert queue.client.xinfo_consumers(queue.tasks_key, "rollout") == []  # and leaves the tasks group
    for task in tasks:
        (group,) = groups[task.task_id]
        assert (group.status, group.error, group.task_id) == ("ok", "", task.task_id)
        assert (group.policy_version, group.weight_version, group.weight_checksum) == (0, 0, service.checksum)
        assert group.replica_id == "w1" and group.prompt_token_ids and group.generate_s > 0
        assert len(group.samples) == 4
        for sample in group.samples:
            c = sample.completion
            assert c.token_ids and len(c.token_ids) == len(c.logprobs) and c.finish_reason in ("stop", "length")
            assert all(lp <= 0 for lp in c.logprobs)
            assert {"math", "format"} <= set(sample.components) and all(x.status for x in sample.components.values())
            if sample.HasField("reward"):  # the weighted sum (weights 1) of components that could judge
                assert math.isfinite(sample.reward)
                assert sample.reward == pytest.approx(sum(x.score for x in sample.components.values()))
            else:
                assert any(not x.HasField("score") for x in sample.components.values())
    assert queue.stats()["tasks"].unacked == 0
    assert service.status().tasks_done >= 2


def test_a_replica_killed_without_leaving_is_swept_from_the_tasks_group(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    """A replica SIGKILLed after its last task never runs `remove_consumer`: a live replica takes its consumer
    out of the group once it has been idle for reclaim_idle_s, as it reclaims the tasks of one killed mid-task."""
    queue.publish_tasks([math_task("k1", 1, 1), math_task("k2", 2, 2)])
    (done,) = queue.read_tasks("killed-after-its-task", count=1, block_ms=100)
    queue.ack_tasks([done.entry_id])
    (held,) = queue.read_tasks("killed-mid-task", count=1, block_ms=100)
    names = {c["name"] for c in queue.client.xinfo_consumers(queue.tasks_key, "rollout")}
    assert names == {b"killed-after-its-task", b"killed-mid-task"}
    with worker(service, redis_url, live_reward.grpc_addr, replica_id="w1"):
        wait_groups(queue, {held.message.task_id} if held.message else set())  # its task reclaimed and done
        deadline = time.monotonic() + 30
        while names - {b"w1"}:
            assert time.monotonic() < deadline, f"still in the group: {names}"
            time.sleep(0.2)
            names = {c["name"] for c in queue.client.xinfo_consumers(queue.tasks_key, "rollout")}
    assert queue.stats()["tasks"].pending == 0


def test_a_written_task_leaves_the_lease_at_once(
    service: RolloutService,
    queue: RunQueue,
    redis_url: str,
    live_reward: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One read, six batches (different sampling params): the heartbeat renewing the lease of tasks already
    written must not report them as taken over (it did, with one replica, in `docker compose up`)."""
    monkeypatch.setenv("GRPO_ROLLOUT_HEARTBEAT_S", "0.05")
    tasks = [math_task(f"l{n}", n, 1, n=n) for n in range(2, 8)]
    queue.publish_tasks(tasks)
    with (
        caplog.at_level(logging.WARNING, logger="grpo.rollout.worker"),
        worker(service, redis_url, live_reward.grpc_addr),
    ):
        groups = wait_groups(queue, {t.task_id for t in tasks})
    assert all(g.status == "ok" for (g,) in groups.values())
    assert not [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]


class ReplyDropper:
    """A TCP proxy in front of Redis that, once armed, passes on a command containing `needle` and then cuts the
    client off instead of returning Redis' reply: the command ran, the caller only sees a broken connection."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream, self.needle, self.dropped = upstream, b"", 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, needle: bytes) -> None:
        with self._lock:
            self.needle = needle

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            doomed = threading.Event()  # the reply now on its way must not reach the client
            threading.Thread(target=self._to_server, args=(client, server, doomed), daemon=True).start()
            threading.Thread(target=self._to_client, args=(server, client, doomed), daemon=True).start()

    def _to_server(self, client: socket.socket, server: socket.socket, doomed: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                with self._lock:
                    if self.needle and self.needle in chunk:
                        self.needle = b""
                        doomed.set()
                server.sendall(chunk)

    def _to_client(self, server: socket.socket, client: socket.socket, doomed: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while chunk := server.recv(65536):
                if doomed.is_set():
                    self.dropped += 1
                    break
                client.sendall(chunk)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_a_lost_reply_to_the_append_counts_the_group_once_without_false_warnings(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis appends the group and acks the task, but the reply never reaches the worker (connection cut). Its
    retry must learn that its own first attempt went through: before, it logged "dropping result ...: already
    done", counted the group as dropped (the books said 0 done), and the heartbeat meanwhile reported the acked
    task as "taken over by other replicas" with no other replica in sight."""
    events = service.metrics.registry.get_sample_value
    before = {k: events("grpo_rollout_worker_events_total", {"kind": k}) or 0.0 for k in ("done", "dropped")}
    append_script = queue._append_script
    queue.client.script_load(append_script.script)  # so the worker's first call is the EVALSHA that runs it
    url = urlsplit(redis_url)
    proxy = ReplyDropper((url.hostname or "127.0.0.1", url.port or 6379))
    proxy.arm(append_script.sha.encode())
    queue.publish_tasks([math_task("lost", 1, 1, n=2)])
    try:
        with (
            caplog.at_level(logging.INFO, logger="grpo.rollout.worker"),
            worker(service, f"redis://127.0.0.1:{proxy.port}{url.path}", live_reward.grpc_addr),
        ):
            (group,) = wait_groups(queue, {"lost"})["lost"]  # the first attempt wrote it; the worker heard nothing
            deadline = time.monotonic() + 15
            while not any("dropping result" in r.getMessage() or "reply was lost" in r.getMessage()
                          for r in caplog.records):  # fmt: skip
                assert time.monotonic() < deadline, "the worker never retried the append"
                time.sleep(0.05)
            assert not queue.read_groups("test-trainer", count=10, block_ms=300)  # no second group
    finally:
        proxy.close()
    assert proxy.dropped == 1, "the proxy never cut a reply off: the test did not test anything"
    assert group.status == "ok"
    after = {k: events("grpo_rollout_worker_events_total", {"kind": k}) or 0.0 for k in ("done", "dropped")}
    assert (after["done"] - before["done"], after["dropped"] - before["dropped"]) == (1, 0)
    messages = [r.getMessage() for r in caplog.records]
    assert any("written by the attempt whose reply was lost" in m for m in messages), messages
    assert not [m for m in messages if "dropping result" in m or "taken over" in m or "reclaimed by" in m]


def test_a_lapsed_lease_names_the_replica_that_took_the_task(
    queue: RunQueue, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat's report on leases it lost says who holds them now, or that they were acked."""
    client = connect(redis_url)
    w = RolloutWorker(
        lambda tasks: Generated([], [], 0, ""), lambda: (0, ""), lambda items: [], queue, ReplicaRegistry(client, RUN),
        replica_id="w1", address="127.0.0.1:1", options=RolloutSettings(redis_url=redis_url, reward_addr="x:1"),
    )  # fmt: skip
    queue.publish_tasks([math_task(f"l{i}", i, 1) for i in range(3)])
    held = queue.read_tasks("w1", count=3, block_ms=100)
    w._lease([e.entry_id for e in held], hold=True)
    with caplog.at_level(logging.WARNING, logger="grpo.rollout.worker"):
        w.heartbeat_once()
        assert not caplog.records  # all three still ours
        assert queue.reclaim_tasks("w2", min_idle_ms=0, count=1)  # w2 thinks w1 is dead
        queue.ack_tasks([held[2].entry_id])  # and some other client acks one
        w.heartbeat_once()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "1 of 3 leased task(s) were reclaimed by other replicas (w2): our lease on them lapsed "
        "(reclaim_idle_s 0.6s, heartbeat_s 0.2s)",
        f"1 of 3 leased task(s) were acked by another client while this replica worked on them: {held[2].entry_id}",
    ], messages
    client.close()


def test_unreachable_reward_service_fails_the_group_never_scores_zero(
    service: RolloutService, queue: RunQueue, redis_url: str
) -> None:
    queue.publish_tasks([math_task("r1", 1, 1, n=2)])
    with worker(service, redis_url, f"127.0.0.1:{free_port()}"):
        (group,) = wait_groups(queue, {"r1"})["r1"]
    assert group.status == "failed" and "reward service" in group.error
    assert len(group.samples) == 2 and all(s.completion.token_ids for s in group.samples)  # kept for debugging
    assert not any(s.HasField("reward") or s.components for s in group.samples)
    assert queue.stats()["tasks"].unacked == 0


def test_a_stop_during_a_reward_outage_is_prompt(
    service: RolloutService, queue: RunQueue, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The reward client's retries wait on the worker's stop event: no waiting out the 30 s retry budget."""
    queue.publish_tasks([math_task("r2", 1, 1, n=2)])
    with caplog.at_level(logging.WARNING, logger="grpo.common.reward_client"):
        ctx = worker(service, redis_url, f"127.0.0.1:{free_port()}")
        ctx.__enter__()
        deadline = time.monotonic() + 30
        while not any("Score to" in r.getMessage() and "retry" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the worker never retried the reward service"
            time.sleep(0.05)
        started = time.monotonic()
        ctx.__exit__(None, None, None)
        stopped_s = time.monotonic() - started
    assert stopped_s < 5, f"the worker took {stopped_s:.1f}s to stop"
    assert queue.read_groups("test-trainer", count=10, block_ms=100) == []  # no group made up from the outage
    assert queue.stats()["tasks"].pending == 1  # released for another replica, not failed


def test_a_bad_task_fails_alone_with_its_reason(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    too_long = math_task("long", 1, 2, text="1 + " * 2000)  # same sampling as "ok": one batch, then split
    queue.publish_tasks([too_long, math_task("ok", 2, 2)])
    with worker(service, redis_url, live_reward.grpc_addr):
        groups = wait_groups(queue, {"long", "ok"})
    (bad,), (good,) = groups["long"], groups["ok"]
    assert bad.status == "failed" and "invalid task" in bad.error and "context" in bad.error
    assert not bad.samples
    assert good.status == "ok" and len(good.samples) == 4


def test_a_sample_the_reward_service_cannot_judge_keeps_its_reason(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    """A malformed gold: every sample comes back without a reward, and with the reward service's reason for it (the
    trainer says it when it drops the group as unscored); a sample that has a reward carries no reason."""
    bad = math_task("bad", 1, 2)
    bad.checks.math.gold = "\\frac{1}{2"
    queue.publish_tasks([bad, math_task("good", 2, 2)])
    with worker(service, redis_url, live_reward.grpc_addr):
        groups = wait_groups(queue, {"bad", "good"})
    (unjudged,), (judged,) = groups["bad"], groups["good"]
    assert unjudged.status == "ok" and len(unjudged.samples) == 4
    for sample in unjudged.samples:
        assert not sample.HasField("reward") and sample.components["math"].status == "unparseable_gold"
        assert "math: unparseable_gold" in sample.score_error and "malformed" in sample.score_error, sample
    assert all(s.HasField("reward") and s.score_error == "" for s in judged.samples)


def test_a_task_that_keeps_killing_replicas_is_written_as_failed(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    queue.publish_tasks([math_task("poison", 1, 2)])
    assert queue.read_tasks("ghost", count=1, block_ms=100)
    for _ in range(2):  # it came back to replicas that died on it again (each delivery counts)
        assert queue.read_tasks("ghost", count=1, own_pending=True)
    with worker(service, redis_url, live_reward.grpc_addr):
        (group,) = wait_groups(queue, {"poison"})["poison"]
    assert group.status == "failed" and "gave up after" in group.error and not group.samples


def test_stop_finishes_the_batch_in_hand_and_releases_the_rest(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    tasks = [math_task(f"s{i}", 1, i, n=16) for i in range(3)]
    for i, t in enumerate(tasks):  # different sampling params: three engine calls
        t.sampling.max_new_tokens = 200 + i
    queue.publish_tasks(tasks)
    with worker(service, redis_url, live_reward.grpc_addr):
        first = wait_groups(queue, {"s0"})
    later = queue.read_groups("test-trainer", count=10, block_ms=100)  # written before the stop took effect
    written = set(first) | {e.message.group_id for e in later if e.message}
    pending = queue.client.xpending_range(queue.tasks_key, "rollout", "-", "+", 10)
    assert len(written) + len(pending) == 3 and pending  # nothing acked without its group
    consumers = queue.client.xinfo_consumers(queue.tasks_key, "rollout")
    assert [c["name"] for c in consumers] == [b"w1"]  # it holds the released tasks: its consumer stays
    released = queue.reclaim_tasks("other", min_idle_ms=60_000, count=10)  # no waiting for the idle threshold
    assert sorted(e.message.task_id for e in released if e.message) == sorted({"s0", "s1", "s2"} - written)


def test_a_replica_with_mixed_weights_takes_no_task_until_a_complete_update(
    queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    """A copy that failed part-way leaves some tensors at the new version: the worker must not sample from that
    mix (nor fail the tasks it holds); it takes no task until a complete update, and stays registered for it."""
    model = str(ensure_tiny_model())
    svc = RolloutService(HFEngine(model, torch_threads=1), model, "inproc")
    try:
        assert isinstance(svc.engine, HFEngine)
        live = svc.engine.weights()
        new = {k: v + 0.01 for k, v in live.items()}
        last = live[list(live)[-1]]
        own = last.detach()
        with torch.no_grad():  # a fault in the live memory: torch refuses the last copy, after the others
            last.set_(torch.zeros(1, dtype=last.dtype).untyped_storage(), 0, last.shape, (0,) * last.dim())
        with pytest.raises(WeightsBroken):
            svc.load_weights(1, "v1", new)
        queue.publish_tasks([math_task("b1", 1, 1)])
        registry = ReplicaRegistry(connect(redis_url), RUN)
        with worker(svc, redis_url, live_reward.grpc_addr, replica_id="broken"):
            time.sleep(2.0)
            assert [r.replica_id for r in registry.live_replicas()] == ["broken"]  # reachable for the repair
            assert queue.stats()["tasks"].lag == 1 and queue.stats()["tasks"].pending == 0  # not taken
            with torch.no_grad():
                last.set_(own.untyped_storage(), own.storage_offset(), own.shape, own.stride())
            svc.load_weights(2, "v2", new)  # the trainer's next push, complete
            (group,) = wait_groups(queue, {"b1"})["b1"]
        assert (group.status, group.weight_version) == ("ok", 2)
    finally:
        svc.close()


def test_worker_survives_a_redis_restart(service: RolloutService, live_reward: Any) -> None:
    with RedisServer(appendonly=True) as server:
        queue = RunQueue(connect(server.url), RUN)
        queue.ensure_groups()
        with worker(service, server.url, live_reward.grpc_addr):
            queue.publish_tasks([math_task("before", 1, 1, n=2)])
            wait_groups(queue, {"before"})
            server.kill()
            time.sleep(1.0)  # the worker's reads fail meanwhile; it backs off and retries
            server.start()
            queue.publish_tasks([math_task("after", 2, 2, n=2)])
            (group,) = wait_groups(queue, {"after"})["after"]
        assert group.status == "ok"
    errors = service.metrics.registry.get_sample_value("grpo_rollout_worker_events_total", {"kind": "redis_errors"})
    assert errors and errors >= 1


def test_an_evaluation_fills_one_engine_call(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    """Evaluation tasks ask for one greedy answer each: worker_batch_tasks (4) of them per engine call left the
    engine nearly idle. 24 of them waiting go in one call; 8 training tasks of the same size still take 2."""

    def calls() -> float:
        return (
            service.metrics.registry.get_sample_value("grpo_rollout_generate_requests_total", {"source": "worker"})
            or 0.0
        )

    evals = [math_task(f"e{i}", i, 1, n=1) for i in range(24)]
    for task in evals:
        task.eval = True
    train = [math_task(f"t{i}", i, 2, n=1) for i in range(8)]
    for tasks, expected in ((evals, 1), (train, 2)):
        before = calls()
        queue.publish_tasks(tasks)  # all waiting before the worker reads: its first read sees them together
        with worker(service, redis_url, live_reward.grpc_addr):
            wait_groups(queue, {t.task_id for t in tasks})
        assert calls() - before == expected


def test_batches_group_equal_sampling_params_and_score_items_carry_token_counts() -> None:
    a, b, c = math_task("a", 1, 1), math_task("b", 1, 2), math_task("c", 1, 3, n=2)
    entries = [Entry(str(i), t) for i, t in enumerate((a, c, b))]
    assert [[e.message.task_id for e in batch if e.message] for batch in batches(entries, 4)] == [["a", "b"], ["c"]]
    assert [len(batch) for batch in batches(entries, 1)] == [1, 1, 1]
    evals = [Entry(str(i), math_task(f"e{i}", 1, i, n=1)) for i in range(5)]
    for e in evals:
        assert e.message is not None
        e.message.eval = True
    assert [len(batch) for batch in batches(evals, 2, eval_size=4)] == [4, 1]
    assert [len(batch) for batch in batches(evals, 2)] == [2, 2, 1]
    a.checks.overlong.max_tokens = 100
    sample = Sample(token_ids=[5, 6, 7], logprobs=[-0.1] * 3, text="x", finish_reason="length")
    (item,) = score_items([a], Generated([[1]], [[sample]], 3, "sha"))
    assert item.id == "a/0" and item.checks.overlong.completion_tokens == 3 and item.checks.math.gold == "2"


def test_step_scores_travel_with_their_token_ends(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    """A task asking for step scores: each sample carries the reward service's steps and, per step, the fewest
    completion tokens whose text reaches its end (the rollout's own tokenizer, multi-character BPE tokens)."""
    task = math_task("st1", 47, 586, text="047+586=")
    task.checks.steps.CopyFrom(reward_pb2.StepsCheck(source="rule", rule="column_addition"))
    queue.publish_tasks([task])
    with worker(service, redis_url, live_reward.grpc_addr):
        (group,) = wait_groups(queue, {"st1"})["st1"]
    assert group.status == "ok", group.error
    tokenizer = service.tokenizer
    for sample in group.samples:
        ids, text = list(sample.completion.token_ids), sample.completion.text
        assert sample.steps and len(sample.step_token_ends) == len(sample.steps)
        assert all(s.HasField("score") for s in sample.steps)  # a random model's text is judged, not skipped
        for step, end in zip(sample.steps, sample.step_token_ends, strict=True):
            assert 0 <= step.start <= step.end <= len(text) and 0 <= end <= len(ids)
            reached = tokenizer.decode(ids[:end], skip_special_tokens=True)
            assert len(reached) >= step.end  # the tokens cover the step ...
            if end > 0:  # ... and one token fewer would not
                assert len(tokenizer.decode(ids[: end - 1], skip_special_tokens=True)) < step.end
        assert list(sample.step_token_ends) == sorted(sample.step_token_ends)


def test_token_ends_with_tokens_of_several_characters() -> None:
    from grpo.rollout.records import token_ends

    pieces = ["<think>", "13", " ", "1", "3 0", "6", "</think>"]  # token i decodes to pieces[i]

    def decode(ids: list[int]) -> str:
        return "".join(pieces[i] for i in ids)

    ids = list(range(len(pieces)))
    text = decode(ids)
    # char ends: after "13" (9), inside the token "3 0" (13: after "3"), the very end (22), and 0
    assert token_ends(decode, ids, text, [9, 13, 22, 0]) == [2, 5, 7, 0]
    assert token_ends(decode, [], "", [0]) == [0]


def test_token_ends_count_every_byte_of_a_split_character() -> None:
    """Byte-level tokens: "é" is two tokens; a step ending after it owns both (a prefix with half of it decodes
    to U+FFFD, which is not the text)."""
    from grpo.rollout.records import token_ends

    raw = "aé\nb".encode()  # a, 0xC3, 0xA9, \n, b: one token per byte

    def decode(ids: list[int]) -> str:
        return bytes(raw[i] for i in ids).decode("utf-8", "replace")

    ids = list(range(len(raw)))
    assert token_ends(decode, ids, "aé\nb", [2, 3, 4]) == [3, 4, 5]


def test_a_value_task_continues_its_prefix_and_scores_the_whole_answer(
    service: RolloutService, queue: RunQueue, redis_url: str, live_reward: Any
) -> None:
    """VinePPO's value task through Redis: the group has the task's kind, n continuations of the prefix, and each
    is scored on prefix + continuation (here the prefix already holds the right answer)."""
    prefix = service.tokenizer.encode("<think>13 13 06</think><answer>633</answer>", add_special_tokens=False)
    task = math_task("val1/v0.5@3", 47, 586, n=3, text="047+586=")
    task.kind = "value"
    task.prompt.prefix_token_ids.extend(prefix)
    task.sampling.max_new_tokens = 1
    queue.publish_tasks([task])
    with worker(service, redis_url, live_reward.grpc_addr):
        (group,) = wait_groups(queue, {task.task_id})[task.task_id]
    assert group.status == "ok" and group.kind == "value" and len(group.samples) == 3
    assert list(group.prompt_token_ids[-len(prefix) :]) == prefix  # what the model was given
    for sample in group.samples:
        assert len(sample.completion.token_ids) == 1  # the continuation only
        assert sample.components["math"].score == 1.0  # judged on the whole answer: the prefix's 633
