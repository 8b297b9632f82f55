"""Queue and registry helpers against a real private Redis: delivery, atomic append+ack, reclaim, trimming, TTLs."""

from __future__ import annotations

import time

import pytest
import redis

from grpo.common.net import free_port
from grpo.common.queue import (
    ALREADY_DONE,
    APPENDED,
    TAKEN_OVER,
    WRITTEN_BEFORE,
    QueueUnavailable,
    RunQueue,
    connect,
    next_id,
    stream_keys,
    trim_floor,
)
from grpo.common.registry import ReplicaInfo, ReplicaRegistry
from grpo.local.redis_server import RedisServer
from grpo.v1 import queue_pb2


@pytest.fixture
def queue(redis_url: str) -> RunQueue:
    q = RunQueue(connect(redis_url), "test")
    q.ensure_groups()
    return q


def tasks(n: int, prefix: str = "t") -> list[queue_pb2.PromptTask]:
    return [queue_pb2.PromptTask(task_id=f"{prefix}{i}", policy_version=3) for i in range(n)]


def test_keys_share_a_cluster_slot_and_reject_bad_run_names() -> None:
    assert stream_keys("r1") == ("grpo:{r1}:tasks", "grpo:{r1}:groups")
    for bad in ("", "a:b", "a{b", "a b"):
        with pytest.raises(ValueError, match="run name"):
            stream_keys(bad)


def test_trim_floor_is_the_oldest_entry_any_group_still_needs() -> None:
    assert next_id("5-9") == "5-10"
    assert trim_floor([]) is None
    assert trim_floor([("10-0", None)]) == "10-1"  # everything delivered was acked
    assert trim_floor([("10-0", "3-1")]) == "3-1"  # an old entry is still pending
    assert trim_floor([("10-0", None), ("2-5", None)]) == "2-6"  # a slower group holds the floor
    assert trim_floor([("9-0", "10-0")]) == "9-1"


def test_publish_read_ack_and_stats(queue: RunQueue) -> None:
    ids = queue.publish_tasks(tasks(3))
    assert len(ids) == 3
    got = queue.read_tasks("a", count=2, block_ms=100)
    assert [e.message.task_id for e in got if e.message] == ["t0", "t1"]
    assert queue.stats()["tasks"].pending == 2 and queue.stats()["tasks"].lag == 1
    assert queue.ack_tasks([got[0].entry_id]) == 1
    stats = queue.stats()["tasks"]
    assert (stats.pending, stats.lag, stats.unacked) == (1, 1, 2)
    assert queue.read_tasks("b", count=10, block_ms=100)[0].message.task_id == "t2"  # type: ignore[union-attr]
    assert queue.read_tasks("b", count=10, block_ms=50) == []
    own = queue.read_tasks("a", count=10, own_pending=True)
    assert [e.entry_id for e in own] == [got[1].entry_id] and own[0].deliveries == 2


def test_append_group_acks_atomically_and_only_for_the_owner(queue: RunQueue) -> None:
    queue.publish_tasks(tasks(1))
    (entry,) = queue.read_tasks("a", count=1, block_ms=100)
    record = queue_pb2.GroupRecord(group_id="t0", task_id="t0", status="ok")
    assert queue.append_group("intruder", entry.entry_id, record) == TAKEN_OVER
    assert queue.stats()["groups"].length == 0 and queue.stats()["tasks"].pending == 1
    assert queue.append_group("a", entry.entry_id, record) == APPENDED
    assert queue.stats()["tasks"].pending == 0
    # Again, as after a lost reply: the caller learns its own first call went through; anyone else: done already.
    assert queue.append_group("a", entry.entry_id, record) == WRITTEN_BEFORE
    assert queue.append_group("b", entry.entry_id, record) == ALREADY_DONE
    assert queue.task_owners([entry.entry_id]) == {entry.entry_id: None}
    groups = queue.read_groups("trainer-0", count=10, block_ms=100)
    assert [g.message.group_id for g in groups if g.message] == ["t0"]
    assert queue.ack_groups([groups[0].entry_id]) == 1


def test_failed_append_leaves_the_task_pending(queue: RunQueue) -> None:
    queue.publish_tasks(tasks(1))
    (entry,) = queue.read_tasks("a", count=1, block_ms=100)
    queue.client.delete(queue.groups_key)
    queue.client.set(queue.groups_key, "not a stream")  # the XADD inside the script fails
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queue.append_group("a", entry.entry_id, queue_pb2.GroupRecord(group_id="t0"))
    assert queue.client.xpending(queue.tasks_key, "rollout")["pending"] == 1  # no ack without the group


def test_reclaim_takes_idle_tasks_but_not_leased_ones(queue: RunQueue) -> None:
    queue.publish_tasks(tasks(2))
    first, second = queue.read_tasks("dead", count=2, block_ms=100)
    assert queue.reclaim_tasks("b", min_idle_ms=150, count=10) == []  # not idle yet
    for _ in range(4):  # "dead" keeps renewing the lease on `second` only
        time.sleep(0.06)
        assert queue.touch_tasks("dead", [second.entry_id]) == 1
    reclaimed = queue.reclaim_tasks("b", min_idle_ms=150, count=10)
    assert [e.entry_id for e in reclaimed] == [first.entry_id]
    assert reclaimed[0].message.task_id == "t0" and reclaimed[0].deliveries == 2  # type: ignore[union-attr]
    assert queue.touch_tasks("dead", [first.entry_id]) == 0  # its lease is gone
    assert queue.task_owners([first.entry_id, second.entry_id]) == {first.entry_id: "b", second.entry_id: "dead"}
    record = queue_pb2.GroupRecord(group_id="t0", task_id="t0")
    assert queue.append_group("dead", first.entry_id, record) == TAKEN_OVER
    assert queue.append_group("b", first.entry_id, record) == APPENDED


def test_length_trimming_deletes_pending_entries(queue: RunQueue) -> None:
    """The Redis semantics that rule out MAXLEN bounds: XTRIM deletes an entry even while it is pending."""
    queue.publish_tasks(tasks(2))
    pending = queue.read_tasks("dead", count=1, block_ms=100)[0]
    queue.client.xtrim(queue.tasks_key, maxlen=0, approximate=False)
    (lost,) = queue.reclaim_tasks("b", min_idle_ms=0, count=10)
    assert lost.entry_id == pending.entry_id and lost.message is None
    assert queue.stats()["tasks"].pending == 0  # XAUTOCLAIM dropped it from the PEL: that task is gone


def test_trim_acked_keeps_pending_and_undelivered_entries(queue: RunQueue) -> None:
    ids = queue.publish_tasks(tasks(6))
    got = queue.read_tasks("a", count=3, block_ms=100)
    queue.ack_tasks([got[0].entry_id, got[2].entry_id])
    assert queue.trim_acked(queue.tasks_key, approximate=False) == 1  # ids[1] still pending holds the floor
    remaining = [i.decode() for i, _ in queue.client.xrange(queue.tasks_key)]
    assert remaining == ids[1:]
    queue.ack_tasks([got[1].entry_id])
    assert queue.trim_acked(queue.tasks_key, approximate=False) == 2
    assert queue.stats()["tasks"].length == 3 and queue.stats()["tasks"].lag == 3
    assert [e.message.task_id for e in queue.read_tasks("a", 10, 100) if e.message] == ["t3", "t4", "t5"]


def test_a_publish_that_went_through_is_not_reported_failed_when_its_trim_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The trim after a write is housekeeping: its error must not make the caller publish every task again."""
    with RedisServer() as server:
        queue = RunQueue(connect(server.url), "trim")
        queue.ensure_groups()
        # refuse XINFO, the trim's first call
        queue.client.acl_setuser("default", enabled=True, nopass=True, commands=["+@all", "-xinfo"])
        ids = queue.publish_tasks(tasks(2))
        assert len(ids) == 2 and queue.client.xlen(queue.tasks_key) == 2
        assert "could not trim" in caplog.text and "xinfo" in caplog.text.lower()


def test_unreachable_redis_raises_queue_unavailable_fast() -> None:
    q = RunQueue(connect(f"redis://127.0.0.1:{free_port()}/0", connect_timeout_s=0.5), "test")
    start = time.monotonic()
    with pytest.raises(QueueUnavailable, match="redis unavailable during read_tasks"):
        q.read_tasks("a", count=1, block_ms=10)
    assert time.monotonic() - start < 3


def test_groups_are_recreated_after_a_redis_restart_without_persistence() -> None:
    with RedisServer() as server:
        q = RunQueue(connect(server.url), "test")
        q.ensure_groups()
        server.kill()
        with pytest.raises(QueueUnavailable):
            q.publish_tasks(tasks(1))
        server.start()
        q.client.xadd(q.tasks_key, {"data": tasks(1)[0].SerializeToString()})  # stream back, groups gone
        assert [e.message.task_id for e in q.read_tasks("a", 5, 100) if e.message] == ["t0"]


def test_registry_lists_live_replicas_until_their_ttl_expires(redis_url: str) -> None:
    registry = ReplicaRegistry(connect(redis_url), "test", ttl_s=0.4)
    for rid, version in (("r1", 3), ("r2", 4)):
        registry.heartbeat(
            ReplicaInfo(rid, f"127.0.0.1:{50050 + version}", version, f"sha-{version}", time.time(),
                        weights_data_port=60000 + version)
        )  # fmt: skip
    live = registry.live_replicas()
    assert [(r.replica_id, r.weight_version, r.weight_checksum, r.weights_data_port) for r in live] == [
        ("r1", 3, "sha-3", 60003),
        ("r2", 4, "sha-4", 60004),
    ]
    assert live[0].address == "127.0.0.1:50053"
    for _ in range(4):  # r1 keeps beating, r2 went silent
        time.sleep(0.15)
        registry.heartbeat(ReplicaInfo("r1", "127.0.0.1:50053", 5, "sha-5", time.time()))
    live = registry.live_replicas()
    assert [(r.replica_id, r.weight_version) for r in live] == [("r1", 5)]
    assert registry.client.smembers(registry._index) == {b"r1"}  # the dead id was pruned
    registry.deregister("r1")
    assert registry.live_replicas() == []
    with pytest.raises(ValueError, match="ttl_s"):
        ReplicaRegistry(registry.client, "test", ttl_s=0)


def test_released_tasks_are_reclaimable_at_once(queue: RunQueue) -> None:
    queue.publish_tasks(tasks(2))
    first, _ = queue.read_tasks("stopping", count=2, block_ms=100)
    assert queue.release_tasks("someone-else", [first.entry_id]) == 0  # only the owner may release
    assert queue.release_tasks("stopping", [first.entry_id]) == 1
    reclaimed = queue.reclaim_tasks("b", min_idle_ms=60_000, count=10)
    assert [e.entry_id for e in reclaimed] == [first.entry_id]


def _consumers(queue: RunQueue) -> list[str]:
    return sorted(c["name"].decode() for c in queue.client.xinfo_consumers(queue.tasks_key, "rollout"))


def test_a_stopped_consumer_leaves_the_group_only_when_it_holds_no_task(queue: RunQueue) -> None:
    queue.publish_tasks(tasks(2))
    (done,) = queue.read_tasks("done", count=1, block_ms=100)
    (busy,) = queue.read_tasks("busy", count=1, block_ms=100)
    queue.ack_tasks([done.entry_id])
    assert queue.release_tasks("busy", [busy.entry_id]) == 1  # released, but still pending under "busy"
    assert _consumers(queue) == ["busy", "done"]
    assert queue.remove_consumer("done") and _consumers(queue) == ["busy"]
    assert not queue.remove_consumer("busy") and _consumers(queue) == ["busy"]  # its pending task stays reclaimable
    assert [e.entry_id for e in queue.reclaim_tasks("other", min_idle_ms=60_000, count=10)] == [busy.entry_id]
    assert queue.remove_consumer("busy") and _consumers(queue) == ["other"]  # once reclaimed, it holds nothing
    assert queue.remove_consumer("never-read")  # no such consumer: nothing to do
    assert RunQueue(queue.client, "no-groups-yet").remove_consumer("x")  # no stream or group at all


def test_consumers_of_replicas_that_died_without_leaving_are_swept(queue: RunQueue) -> None:
    """Only consumers idle past the threshold with nothing pending go; never the caller, never a pending task."""
    queue.publish_tasks(tasks(4))
    (killed,) = queue.read_tasks("killed-idle", count=1, block_ms=100)
    queue.ack_tasks([killed.entry_id])  # it finished its task, then was SIGKILLed
    (held,) = queue.read_tasks("killed-busy", count=1, block_ms=100)  # SIGKILLed holding a task
    for name in ("sweeper", "live"):  # each finishes a task; "live" reads it just before the sweep
        if name == "live":
            time.sleep(0.3)
        (done,) = queue.read_tasks(name, count=1, block_ms=100)
        queue.ack_tasks([done.entry_id])
    assert _consumers(queue) == ["killed-busy", "killed-idle", "live", "sweeper"]
    assert queue.sweep_consumers(min_idle_ms=200, keep="sweeper") == ["killed-idle"]
    assert _consumers(queue) == ["killed-busy", "live", "sweeper"]
    assert queue.stats()["tasks"].pending == 1  # killed-busy's task is still there to be reclaimed
    assert [e.entry_id for e in queue.reclaim_tasks("sweeper", min_idle_ms=200, count=10)] == [held.entry_id]
    assert queue.sweep_consumers(min_idle_ms=200, keep="sweeper") == ["killed-busy"]
    assert queue.sweep_consumers(min_idle_ms=60_000, keep="sweeper") == []  # "live" is not idle that long
    assert RunQueue(queue.client, "no-groups-yet").sweep_consumers(1, "x") == []
