"""Registry of live rollout replicas in Redis: heartbeats with a TTL, so the trainer finds every replica.

Each replica owns a hash `grpo:{<run>}:replica:<id>` whose TTL every heartbeat renews;
the set `grpo:{<run>}:replicas` indexes the ids. A replica is live while its hash exists:
liveness is decided by the Redis server's clock (the TTL), never by comparing clocks of
different machines. Ids whose hash has expired are pruned from the set when read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from grpo.common.queue import stream_keys, unavailable_on_error

DEFAULT_TTL_S = 10.0


@dataclass(frozen=True)
class ReplicaInfo:
    """What a replica last reported about itself."""

    replica_id: str
    address: str  # host:port of its gRPC server
    weight_version: int
    weight_checksum: str
    heartbeat: float  # unix time of the last heartbeat, by the replica's clock (informational)
    tasks_done: int = 0
    tasks_failed: int = 0
    weights_data_port: int = 0  # its weights data port on the same host; 0 = none
    max_new_tokens_cap: int = 0  # the largest max_new_tokens it generates; 0 = not said (an older replica)
    max_context: int = 0  # prompt + completion tokens its engine holds; 0 = not said
    incarnation: str = ""  # new at each start of the replica's process: a restart under the same id is a new one


def _registry_keys(run: str) -> tuple[str, str]:
    tasks_key, _ = stream_keys(run)  # validates the run name
    prefix = tasks_key.removesuffix(":tasks")
    return f"{prefix}:replica:", f"{prefix}:replicas"


def _parse(raw: dict[bytes, bytes]) -> ReplicaInfo:
    get = {k.decode(): v.decode() for k, v in raw.items()}
    return ReplicaInfo(
        replica_id=get["replica_id"],
        address=get.get("address", ""),
        weight_version=int(get.get("weight_version", "0")),
        weight_checksum=get.get("weight_checksum", ""),
        heartbeat=float(get.get("heartbeat", "0")),
        tasks_done=int(get.get("tasks_done", "0")),
        tasks_failed=int(get.get("tasks_failed", "0")),
        weights_data_port=int(get.get("weights_data_port", "0")),
        max_new_tokens_cap=int(get.get("max_new_tokens_cap", "0")),
        max_context=int(get.get("max_context", "0")),
        incarnation=get.get("incarnation", ""),
    )


class ReplicaRegistry:
    """Heartbeats (written by rollout replicas) and the live set (read by the trainer)."""

    def __init__(self, client: redis.Redis, run: str = "default", ttl_s: float = DEFAULT_TTL_S) -> None:
        if ttl_s <= 0:
            raise ValueError(f"registry ttl_s must be > 0, got {ttl_s}")
        self.client = client
        self.ttl_ms = int(ttl_s * 1000)
        self._prefix, self._index = _registry_keys(run)

    def key(self, replica_id: str) -> str:
        return self._prefix + replica_id

    @unavailable_on_error
    def heartbeat(self, info: ReplicaInfo) -> None:
        """Write `info` and renew its TTL in one transaction."""
        key = self.key(info.replica_id)
        fields: dict[Any, Any] = {
            "replica_id": info.replica_id,
            "address": info.address,
            "weight_version": info.weight_version,
            "weight_checksum": info.weight_checksum,
            "heartbeat": info.heartbeat or time.time(),
            "tasks_done": info.tasks_done,
            "tasks_failed": info.tasks_failed,
            "weights_data_port": info.weights_data_port,
            "max_new_tokens_cap": info.max_new_tokens_cap,
            "max_context": info.max_context,
            "incarnation": info.incarnation,
        }
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, self.ttl_ms)
        pipe.sadd(self._index, info.replica_id)
        pipe.execute()

    @unavailable_on_error
    def deregister(self, replica_id: str) -> None:
        """Leave at once (graceful stop) instead of waiting for the TTL."""
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.key(replica_id))
        pipe.srem(self._index, replica_id)
        pipe.execute()

    @unavailable_on_error
    def live_replicas(self) -> list[ReplicaInfo]:
        """Replicas whose last heartbeat is younger than the TTL, sorted by id."""
        ids = sorted(i.decode() if isinstance(i, bytes) else i for i in self.client.smembers(self._index))
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for replica_id in ids:
            pipe.hgetall(self.key(replica_id))
        live, gone = [], []
        for replica_id, raw in zip(ids, pipe.execute(), strict=True):
            if raw:
                live.append(_parse(raw))
            else:
                gone.append(replica_id)
        if gone:
            self.client.srem(self._index, *gone)
        return live
