"""Redis Streams queues of one run: prompt tasks (trainer → rollout) and scored groups (rollout → trainer).

Each stream entry holds one field, "data": a serialized `grpo.v1` protobuf message.
Keys are `grpo:{<run>}:...`; the braces are a Redis Cluster hash tag, so every key of a
run lives in one slot and the scripts below may touch several of them atomically.

Delivery guarantees, and why they hold:

* A consumer reads through a consumer group; an entry stays in the group's pending list
  (PEL) until it is acked. A rollout worker acks a task only inside the same script that
  appends its group (`append_group`), so a crash leaves either both or neither.
* A worker renews the lease on the tasks it is working on (`touch_tasks`, each
  heartbeat); `reclaim_tasks` (XAUTOCLAIM) therefore only takes tasks from consumers
  that stopped renewing: dead or wedged ones.
* `append_group` writes only while the task is still pending *and owned by the caller*:
  a worker whose lease lapsed (its task was reclaimed) drops its result instead of
  writing a second group. Group ids equal task ids, so any duplicate that still slips
  through (e.g. a script retried after a lost reply) is detectable downstream.
* Trimming. XTRIM (MAXLEN or MINID) deletes entries even when they are pending in a PEL
  or not yet delivered, so a plain MAXLEN bound would silently drop un-acked work
  whenever the backlog, or the distance from the oldest still-pending entry, exceeds it.
  We therefore never trim by length: `trim_acked` trims by MINID to the oldest entry any
  consumer group still needs (its oldest pending entry, or the first not yet delivered),
  which by construction removes only acked entries. The publisher's admission control
  is what bounds the stream's length.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar
from urllib.parse import urlsplit

import redis
from google.protobuf.message import DecodeError, Message
from redis.backoff import NoBackoff
from redis.retry import Retry

from grpo.v1 import queue_pb2

log = logging.getLogger(__name__)

TASKS_GROUP = "rollout"  # consumer group of the rollout workers on the tasks stream
GROUPS_GROUP = "trainer"  # consumer group of the trainer on the groups stream
FIELD = b"data"

M = TypeVar("M", bound=Message)
P = ParamSpec("P")
R = TypeVar("R")


class QueueUnavailable(RuntimeError):
    """Redis could not be reached (or timed out); the caller should back off and retry."""


def connect(url: str, *, socket_timeout_s: float = 10.0, connect_timeout_s: float = 3.0) -> redis.Redis:
    """A client whose every call has a deadline and which never retries on its own.

    Automatic retries would re-send non-idempotent writes (XADD) after a lost reply;
    callers get `QueueUnavailable` instead and decide. Blocking reads must block for
    less than `socket_timeout_s`.
    """
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=connect_timeout_s,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 0),
    )


def redacted(url: str) -> str:
    """A Redis URL without its credentials, for logs."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def unavailable_on_error(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn connection errors and timeouts into `QueueUnavailable`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise QueueUnavailable(f"redis unavailable during {fn.__name__}: {exc}") from exc

    return wrapper


def stream_keys(run: str) -> tuple[str, str]:
    """(tasks stream, groups stream) of a run."""
    if not run or any(c in run for c in "{}: \n"):
        raise ValueError(f"run name {run!r} must be non-empty without braces, colons or spaces")
    return f"grpo:{{{run}}}:tasks", f"grpo:{{{run}}}:groups"


def encode(message: Message) -> dict[Any, Any]:
    return {FIELD: message.SerializeToString()}


def decode(cls: type[M], fields: dict[bytes, bytes] | None) -> M | None:
    """The message in an entry's fields; None for a deleted entry or an unreadable payload."""
    if not fields or FIELD not in fields:
        return None
    try:
        return cls.FromString(fields[FIELD])
    except DecodeError:
        log.error("undecodable %s payload (%d bytes)", cls.__name__, len(fields[FIELD]))
        return None


def next_id(entry_id: str) -> str:
    """The smallest stream id greater than `entry_id` ("ms-seq")."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def trim_floor(groups: Iterable[tuple[str, str | None]]) -> str | None:
    """The oldest id any consumer group still needs, from (last-delivered id, oldest pending id) pairs.

    Entries below it were delivered and acked by every group. None when there is no group
    (nobody consumes yet, so nothing may be trimmed).
    """
    floors = [min(next_id(last), pending, key=_id_key) if pending else next_id(last) for last, pending in groups]
    return min(floors, key=_id_key) if floors else None


@dataclass(frozen=True)
class Entry(Generic[M]):
    """One stream entry as delivered to a consumer."""

    entry_id: str
    message: M | None  # None: deleted while pending, or unreadable
    deliveries: int = 1  # how many times the group has delivered it (reclaims count)


@dataclass(frozen=True)
class StreamStats:
    length: int
    pending: int  # delivered to the group, not acked
    lag: int  # not yet delivered to the group
    last_delivered: str = ""  # the group's last delivered id: it moves whenever a consumer takes an entry

    @property
    def unacked(self) -> int:
        return self.pending + self.lag


# Append the group and ack the task in one atomic step, only if the caller still owns the task. A short-lived
# marker remembers who wrote it: when the reply is lost and the caller tries again, it learns that its own
# first attempt went through (WRITTEN_BEFORE) instead of taking its group for someone else's.
_APPEND_GROUP = """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 then
  if redis.call('GET', KEYS[3]) == ARGV[2] then return 2 end
  return 0
end
if p[1][2] ~= ARGV[2] then return -1 end
redis.call('XADD', KEYS[2], '*', 'data', ARGV[4])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[5])
return 1
"""

# Set the idle time of the caller's own pending tasks without counting a delivery:
# 0 renews the lease, a huge value releases them for XAUTOCLAIM by anyone at once.
_SET_IDLE = """
local n = 0
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    n = n + 1
  end
end
return n
"""

# Delete the caller's consumer only while it holds no pending entry: XGROUP DELCONSUMER drops a consumer's
# pending entries from the PEL, so they would never be reclaimed. One script, so nothing (another process
# with the same replica id) can take a task under this name between the check and the delete.
_DELETE_IDLE_CONSUMER = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# The same for every consumer idle for ARGV[2] ms or more but ARGV[3] (the caller): a replica killed with no
# chance to leave (SIGKILL, a lost node) would otherwise stay in the group for good. A live replica swept while
# it holds nothing loses nothing: its next read or claim adds its consumer again.
_SWEEP_IDLE_CONSUMERS = """
local gone = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if f['pending'] == 0 and f['idle'] >= tonumber(ARGV[2]) and f['name'] ~= ARGV[3] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    gone[#gone + 1] = f['name']
  end
end
return gone
"""

APPENDED, ALREADY_DONE, TAKEN_OVER, WRITTEN_BEFORE = 1, 0, -1, 2
WRITTEN_MARKER_MS = 2 * 60 * 1000  # how long a retried append can still recognise its own earlier write
RELEASED_IDLE_MS = 10 * 365 * 24 * 3600 * 1000  # idle "forever": past any reclaim threshold


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RunQueue:
    """The task and group streams of one run, on one Redis client."""

    def __init__(self, client: redis.Redis, run: str = "default") -> None:
        self.client = client
        self.run = run
        self.tasks_key, self.groups_key = stream_keys(run)
        self._append_script = client.register_script(_APPEND_GROUP)
        self._idle_script = client.register_script(_SET_IDLE)
        self._delete_consumer_script = client.register_script(_DELETE_IDLE_CONSUMER)
        self._sweep_script = client.register_script(_SWEEP_IDLE_CONSUMERS)

    # ---- set-up -------------------------------------------------------------------------

    @unavailable_on_error
    def ensure_groups(self) -> None:
        """Create both consumer groups (and streams) if missing; from id 0 so nothing published earlier is skipped."""
        for key, group in ((self.tasks_key, TASKS_GROUP), (self.groups_key, GROUPS_GROUP)):
            try:
                self.client.xgroup_create(key, group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def _with_groups(self, call: Callable[[], R]) -> R:
        """Run `call`, recreating the groups once if Redis lost them (restart without persistence)."""
        try:
            return call()
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("consumer group missing on %s; recreating", self.run)
            self.ensure_groups()
            return call()

    # ---- tasks (trainer publishes, rollout consumes) ------------------------------------------

    @unavailable_on_error
    def publish_tasks(self, tasks: Sequence[queue_pb2.PromptTask]) -> list[str]:
        """XADD every task in one pipelined transaction; returns their entry ids."""
        pipe = self.client.pipeline(transaction=True)
        for task in tasks:
            pipe.xadd(self.tasks_key, encode(task))
        ids = [_str(i) for i in pipe.execute()]
        self._tidy(self.tasks_key)
        return ids

    @unavailable_on_error
    def read_tasks(
        self, consumer: str, count: int, block_ms: int | None = None, *, own_pending: bool = False
    ) -> list[Entry[queue_pb2.PromptTask]]:
        """New tasks for `consumer` (XREADGROUP >), or with `own_pending` those it was given and never acked."""
        return self._read(self.tasks_key, TASKS_GROUP, queue_pb2.PromptTask, consumer, count, block_ms, own_pending)

    @unavailable_on_error
    def reclaim_tasks(self, consumer: str, min_idle_ms: int, count: int) -> list[Entry[queue_pb2.PromptTask]]:
        """Take over tasks idle for `min_idle_ms` on any consumer (XAUTOCLAIM), with their delivery counts.

        Entries deleted while pending come back with `message=None`; Redis has already
        dropped them from the PEL.
        """

        def claim() -> Any:
            return self.client.xautoclaim(self.tasks_key, TASKS_GROUP, consumer, min_idle_ms, "0-0", count=count)

        reply = self._with_groups(claim)
        claimed = [(_str(i), f) for i, f in reply[1] if i is not None]
        deleted = [_str(i) for i in reply[2]] if len(reply) > 2 else []
        if deleted:
            log.error("reclaim found %d task(s) deleted while pending: %s", len(deleted), deleted[:5])
        counts = self._delivery_counts(self.tasks_key, TASKS_GROUP, [i for i, _ in claimed])
        entries = [Entry(i, decode(queue_pb2.PromptTask, f), counts.get(i, 1)) for i, f in claimed]
        return entries + [Entry(i, None, 0) for i in deleted]

    @unavailable_on_error
    def touch_tasks(self, consumer: str, entry_ids: Sequence[str]) -> int:
        """Renew `consumer`'s lease on tasks it is still working on; returns how many it still owns."""
        return self._set_idle(consumer, entry_ids, 0)

    @unavailable_on_error
    def task_owners(self, entry_ids: Sequence[str]) -> dict[str, str | None]:
        """Which consumer holds each task now; None when it is no longer pending (acked, or deleted)."""
        pipe = self.client.pipeline(transaction=False)
        for entry_id in entry_ids:
            pipe.xpending_range(self.tasks_key, TASKS_GROUP, min=entry_id, max=entry_id, count=1)
        owners: dict[str, str | None] = dict.fromkeys(entry_ids)
        for entry_id, rows in zip(entry_ids, pipe.execute(), strict=True):
            if rows:
                owners[entry_id] = _str(rows[0]["consumer"])
        return owners

    @unavailable_on_error
    def release_tasks(self, consumer: str, entry_ids: Sequence[str]) -> int:
        """Give back tasks `consumer` will not finish (graceful stop): any replica may reclaim them now."""
        return self._set_idle(consumer, entry_ids, RELEASED_IDLE_MS)

    def _set_idle(self, consumer: str, entry_ids: Sequence[str], idle_ms: int) -> int:
        if not entry_ids:
            return 0
        return int(self._idle_script(keys=[self.tasks_key], args=[TASKS_GROUP, consumer, idle_ms, *entry_ids]))

    @unavailable_on_error
    def remove_consumer(self, consumer: str) -> bool:
        """Take `consumer` out of the tasks group (a stopped replica: ids like hostname-pid are never reused, so
        the group would otherwise grow by one consumer per start). Only when it holds no pending task: True
        when it is gone, False when it keeps tasks (released ones too, until someone reclaims them)."""
        try:
            return bool(self._delete_consumer_script(keys=[self.tasks_key], args=[TASKS_GROUP, consumer]))
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            return True  # no group (Redis lost it): no consumer either

    @unavailable_on_error
    def sweep_consumers(self, min_idle_ms: int, keep: str) -> list[str]:
        """Take out of the tasks group every consumer but `keep` that holds no pending task and has not read or
        claimed for `min_idle_ms` (replicas that died without `remove_consumer`); their names."""
        try:
            gone = self._sweep_script(keys=[self.tasks_key], args=[TASKS_GROUP, min_idle_ms, keep])
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                raise
            return []  # no group or no stream (Redis lost them): no consumer either
        return [_str(name) for name in gone]

    @unavailable_on_error
    def ack_tasks(self, entry_ids: Sequence[str]) -> int:
        return int(self.client.xack(self.tasks_key, TASKS_GROUP, *entry_ids)) if entry_ids else 0

    @unavailable_on_error
    def append_group(self, consumer: str, task_entry_id: str, record: queue_pb2.GroupRecord) -> int:
        """Append `record` and ack its task atomically, if `consumer` still owns the task.

        Returns APPENDED, WRITTEN_BEFORE (this consumer's earlier call already did it: its reply was lost),
        ALREADY_DONE (the task is no longer pending: someone else finished it) or TAKEN_OVER (another
        consumer reclaimed it and will write the group).
        """
        args = [TASKS_GROUP, consumer, task_entry_id, record.SerializeToString(), WRITTEN_MARKER_MS]
        keys = [self.tasks_key, self.groups_key, f"{self.tasks_key}:written:{task_entry_id}"]
        return int(self._append_script(keys=keys, args=args))

    # ---- groups (rollout appends, trainer consumes) ------------------------------------------

    @unavailable_on_error
    def read_groups(
        self, consumer: str, count: int, block_ms: int | None = None, *, own_pending: bool = False
    ) -> list[Entry[queue_pb2.GroupRecord]]:
        """Groups for the trainer; `own_pending` re-reads those delivered but not acked (after a restart)."""
        return self._read(self.groups_key, GROUPS_GROUP, queue_pb2.GroupRecord, consumer, count, block_ms, own_pending)

    @unavailable_on_error
    def ack_groups(self, entry_ids: Sequence[str]) -> int:
        """Ack groups the trainer has durably recorded (checkpointed), then trim what everyone has acked."""
        if not entry_ids:
            return 0
        acked = int(self.client.xack(self.groups_key, GROUPS_GROUP, *entry_ids))
        self._tidy(self.groups_key)
        return acked

    # ---- shared -----------------------------------------------------------------------------

    @unavailable_on_error
    def _tidy(self, key: str) -> None:
        """trim_acked after a write that went through. Best-effort: an error here would make the caller repeat
        the write (a publish: every task generated twice), and the next write trims again."""
        try:
            self.trim_acked(key)
        except redis.RedisError as exc:
            log.warning("could not trim %s after a write (the next write tries again): %s", key, exc)

    def trim_acked(self, key: str, *, approximate: bool = True) -> int:
        """Remove entries every consumer group has acked (XTRIM MINID); never un-acked work. Returns the count."""
        groups = self.client.xinfo_groups(key) if self.client.exists(key) else []
        pairs: list[tuple[str, str | None]] = []
        for g in groups:
            pending_min = None
            if g["pending"]:
                summary = self.client.xpending(key, _str(g["name"]))
                pending_min = _str(summary["min"])
            pairs.append((_str(g["last-delivered-id"]), pending_min))
        floor = trim_floor(pairs)
        if floor is None:
            return 0
        return int(self.client.xtrim(key, minid=floor, approximate=approximate))

    @unavailable_on_error
    def stats(self) -> dict[str, StreamStats]:
        """Length, pending and lag of both streams (metrics and admission control)."""
        return {"tasks": self._stats(self.tasks_key, TASKS_GROUP), "groups": self._stats(self.groups_key, GROUPS_GROUP)}

    def _stats(self, key: str, group: str) -> StreamStats:
        length = int(self.client.xlen(key))
        info = next((g for g in self.client.xinfo_groups(key) if _str(g["name"]) == group), None) if length else None
        if info is None:
            return StreamStats(length=length, pending=0, lag=length)
        lag = info.get("lag")
        if lag is None:  # Redis cannot tell after deletions; count what lies past the last delivery
            lag = len(self.client.xrange(key, min=next_id(_str(info["last-delivered-id"])), max="+") or [])
        last = _str(info["last-delivered-id"])
        return StreamStats(length=length, pending=int(info["pending"]), lag=int(lag), last_delivered=last)

    def _read(
        self,
        key: str,
        group: str,
        cls: type[M],
        consumer: str,
        count: int,
        block_ms: int | None,
        own_pending: bool,
    ) -> list[Entry[M]]:
        start = "0" if own_pending else ">"

        def read() -> Any:
            return self.client.xreadgroup(group, consumer, {key: start}, count=count, block=block_ms)

        reply = self._with_groups(read)
        if not reply:
            return []
        rows = reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))[0]
        entries: list[Entry[M]] = [Entry(_str(i), decode(cls, f)) for i, f in rows if i is not None]
        if own_pending and entries:
            counts = self._delivery_counts(key, group, [e.entry_id for e in entries])
            entries = [Entry(e.entry_id, e.message, counts.get(e.entry_id, 1)) for e in entries]
        return entries

    def _delivery_counts(self, key: str, group: str, entry_ids: Sequence[str]) -> dict[str, int]:
        if not entry_ids:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for entry_id in entry_ids:
            pipe.xpending_range(key, group, min=entry_id, max=entry_id, count=1)
        counts: dict[str, int] = {}
        for rows in pipe.execute():
            for row in rows:
                counts[_str(row["message_id"])] = int(row["times_delivered"])
        return counts
