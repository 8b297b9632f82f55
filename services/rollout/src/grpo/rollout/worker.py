"""The rollout worker loop: prompt tasks from Redis → G samples → reward scores → one group record per task.

Per batch of tasks: renew their leases while working (so only dead replicas' tasks are
reclaimed), generate all prompts × n in one engine call, score every completion in one
reward `Score` call, then append each group and ack its task atomically. (Tasks with a
probe take two rounds: every probe, then the rest of the groups whose probe varies; probe.py.) An
unreachable reward service, or a task that keeps failing, yields a group with status
"failed" and the reason: never a reward of 0. On stop, unprocessed tasks are released
to other replicas (made idle at once), never acked. The service builds and runs it in worker_wiring.py.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from grpo.common.queue import APPENDED, TAKEN_OVER, WRITTEN_BEFORE, Entry, QueueUnavailable, RunQueue
from grpo.common.registry import ReplicaInfo, ReplicaRegistry
from grpo.common.retry import Backoff, RetryPolicy
from grpo.rollout.episodes.runner import Interrupted
from grpo.rollout.episodes.tools import ToolInfrastructureError
from grpo.rollout.probe import Sampled, discarding, probe_tasks, probing, rest_tasks, results_of, varies, whole_tasks
from grpo.rollout.records import Generated, batches, failed_record, group_records, score_items
from grpo.rollout.service import WeightsBroken
from grpo.rollout.settings import RolloutSettings
from grpo.rollout.stats import WorkerStats
from grpo.v1 import queue_pb2, reward_pb2

log = logging.getLogger(__name__)

# The worker's retry loops, under the one policy (grpo.common.retry; docs/reliability.md lists them all).
LOOP_RETRY = RetryPolicy(base_s=0.5, cap_s=10.0)  # the read loop: forever, reset after each batch
BATCH_RETRY = RetryPolicy(base_s=0.5, cap_s=5.0)  # one task that failed to generate (attempts from settings)
WRITE_RETRY = RetryPolicy(base_s=0.5, cap_s=5.0, attempts=5)  # append + ack through a short Redis outage
BROKEN_WAIT_S = 1.0  # how often a replica with mixed weights looks again (a complete push repairs it)
BEHIND_WAIT_S = 0.5  # how often a replica behind the tasks' weights looks again (the trainer's push brings it up)
BEHIND_REPORT_S = 15.0  # how often it says so

Scorer = Callable[[list[reward_pb2.ScoreItem]], list[reward_pb2.ScoreResult]]


class Stopping(Exception):
    """The worker is stopping: the batch in hand is released to other replicas, not written."""


class RolloutWorker:
    """Consumes tasks for one replica; `run()` blocks until `stop_event` is set."""

    def __init__(
        self,
        generate: Callable[[Sequence[queue_pb2.PromptTask]], Generated],
        weight_info: Callable[[], tuple[int, str]],
        score: Scorer,
        queue: RunQueue,
        registry: ReplicaRegistry,
        *,
        replica_id: str,
        address: str,
        options: RolloutSettings,
        data_port: int = 0,
        stats: WorkerStats | None = None,
        on_written: Callable[[bool], None] | None = None,
        broken: Callable[[], str | None] = lambda: None,
        max_context: int = 0,
    ) -> None:
        self.generate, self.weight_info, self.score = generate, weight_info, score
        self.broken = broken  # why this replica cannot generate now (mixed weights), or None
        self.max_context = max_context  # the engine's context, said in the registry (the trainer checks prompts)
        self.incarnation = uuid.uuid4().hex  # this process's start: the trainer pushes again to a restarted replica
        self._wanted_version = 0  # the newest policy version of a task put back for want of its weights
        self._behind_since: float | None = None
        self._behind_said = 0.0
        self.queue, self.registry = queue, registry
        self.replica_id, self.address, self.options = replica_id, address, options
        self.data_port = data_port
        self.stats = stats or WorkerStats()
        self.on_written = on_written
        self._leases: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()  # run()'s stop event: retries wait on it, so a stop is prompt

    # -- heartbeat and leases (own thread) --

    def heartbeat_once(self) -> None:
        version, checksum = self.weight_info()
        c = self.stats.counts
        info = ReplicaInfo(
            self.replica_id,
            self.address,
            version,
            checksum,
            heartbeat=time.time(),
            tasks_done=c["done"],
            tasks_failed=c["failed"],
            weights_data_port=self.data_port,
            max_new_tokens_cap=self.options.max_new_tokens_cap,
            max_context=self.max_context,
            incarnation=self.incarnation,
        )
        self.registry.heartbeat(info)
        with self._lock:  # held across the touch: a task written meanwhile would look taken over
            leased = sorted(self._leases)
            owned = self.queue.touch_tasks(self.replica_id, leased)
        if owned < len(leased):
            self._report_lost_leases(leased)

    def _report_lost_leases(self, leased: list[str]) -> None:
        """Say who holds the tasks we thought were ours: another replica (our lease lapsed) or nobody (acked)."""
        with self._lock:  # a task written meanwhile has left our leases and is no loss
            lost = {i: owner for i, owner in self.queue.task_owners(leased).items()
                    if owner != self.replica_id and i in self._leases}  # fmt: skip
        taken = sorted({owner for owner in lost.values() if owner is not None})
        if taken:
            n = sum(owner is not None for owner in lost.values())
            log.warning("%d of %d leased task(s) were reclaimed by other replicas (%s): our lease on them lapsed "
                        "(reclaim_idle_s %gs, heartbeat_s %gs)", n, len(leased), ", ".join(taken),
                        self.options.reclaim_idle_s, self.options.heartbeat_s)  # fmt: skip
        if None in lost.values():
            acked = sorted(i for i, owner in lost.items() if owner is None)
            log.warning("%d of %d leased task(s) were acked by another client while this replica worked on them: %s",
                        len(acked), len(leased), ", ".join(acked[:5]))  # fmt: skip

    def sweep_consumers(self) -> None:
        """Take replicas that died without leaving (SIGKILL, a lost node) out of the tasks group: any consumer
        idle for reclaim_idle_s that holds no task. Their tasks, if any, are reclaimed first (`_next_entries`)."""
        gone = self.queue.sweep_consumers(int(self.options.reclaim_idle_s * 1000), keep=self.replica_id)
        if gone:
            log.info("removed %d idle consumer(s) holding no task from the tasks group: %s", len(gone),
                     ", ".join(gone))  # fmt: skip

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        swept = time.monotonic()
        while not stop.is_set():
            try:
                self.heartbeat_once()
                if time.monotonic() - swept >= self.options.reclaim_idle_s:
                    swept = time.monotonic()
                    self.sweep_consumers()
            except QueueUnavailable as exc:
                log.warning("heartbeat failed: %s", exc)
            except Exception:
                log.exception("heartbeat failed")
            stop.wait(self.options.heartbeat_s)

    def _lease(self, ids: Sequence[str], hold: bool) -> None:
        with self._lock:
            (self._leases.update if hold else self._leases.difference_update)(ids)

    # -- main loop --

    def run(self, stop_event: threading.Event) -> None:
        self._stop = stop_event
        hb_stop = threading.Event()
        hb = threading.Thread(target=self._heartbeat_loop, args=(hb_stop,), name="rollout-heartbeat", daemon=True)
        hb.start()
        backoff = Backoff(LOOP_RETRY, "worker loop", stop_event, log)
        first = True
        try:
            while not stop_event.is_set():
                try:
                    if first:
                        self.queue.ensure_groups()
                    if self._paused(stop_event) or self._behind(stop_event):
                        continue
                    entries = self._next_entries(own_pending=first)
                    first = False
                    self._handle(entries, stop_event)
                    backoff.reset()
                except QueueUnavailable as exc:
                    self.stats.add("redis_errors")
                    backoff.wait(f"redis unavailable: {exc}")
                except WeightsBroken:  # mid-batch: _handle released the batch to other replicas
                    continue
                except Exception as exc:  # a bug or an unexpected Redis reply: keep serving, loudly
                    backoff.wait(f"{type(exc).__name__}: {exc}", exc_info=True)
        finally:
            hb_stop.set()
            hb.join(timeout=5)
            self._leave_group()
            try:
                self.registry.deregister(self.replica_id)
            except QueueUnavailable as exc:
                log.warning("could not deregister (the TTL will expire it): %s", exc)
            log.info("worker %s stopped: %s", self.replica_id, self.stats.counts)

    def _leave_group(self) -> None:
        """Remove our consumer from the tasks group once our tasks are done or released: a replica id is new at
        each start (hostname-pid), so the group would keep one idle consumer per start forever."""
        try:
            if not self.queue.remove_consumer(self.replica_id):
                log.info("consumer %s stays in the tasks group: tasks are still pending under it", self.replica_id)
        except QueueUnavailable as exc:
            log.warning("could not remove consumer %s from the tasks group: %s", self.replica_id, exc)
        except Exception:  # best effort: the stop goes on to deregister
            log.exception("could not remove consumer %s from the tasks group", self.replica_id)

    def _paused(self, stop_event: threading.Event) -> bool:
        """While the weights are mixed (a copy failed part-way) take no task: other replicas do them, and the
        heartbeat keeps us in the registry, where the trainer's next push repairs us."""
        why = self.broken()
        if why is None:
            return False
        log.warning("not taking tasks: %s", why)
        stop_event.wait(BROKEN_WAIT_S)
        return True

    def _behind(self, stop_event: threading.Event) -> bool:
        """Take no task while our weights are older than those of a task we put back: a replica that joins or
        restarts mid-run holds the model from disk until the trainer's push (which comes as soon as the registry
        shows it), and every group it made before would be dropped as stale, its prompt never trained."""
        version = self.weight_info()[0]
        if version >= self._wanted_version:
            if self._behind_since is not None:
                log.info("weights v%d arrived after %.1fs: taking tasks again", version,
                         time.monotonic() - self._behind_since)  # fmt: skip
                self._behind_since = None
            return False
        now = time.monotonic()
        if self._behind_since is None:
            self._behind_since = now
        if now - self._behind_said >= BEHIND_REPORT_S:
            self._behind_said = now
            log.info("holding weights v%d, the run's tasks are published under v%d: waiting for the trainer's push "
                     "(%.0fs so far)", version, self._wanted_version, now - self._behind_since)  # fmt: skip
        stop_event.wait(BEHIND_WAIT_S)
        return True

    def _put_back_newer(self, entries: list[Entry[queue_pb2.PromptTask]]) -> list[Entry[queue_pb2.PromptTask]]:
        """The entries our weights can serve; those published under newer weights go back to the group at once
        (another replica takes them, or we do once the push has come) and set the version `_behind` waits for."""
        if not self.options.wait_for_task_weights:
            return entries
        version = self.weight_info()[0]
        newer = {e.entry_id: e.message.policy_version for e in entries
                 if e.message is not None and e.message.policy_version > version}  # fmt: skip
        if not newer:
            return entries
        self._wanted_version = max(newer.values())
        self._release(list(newer))
        return [e for e in entries if e.entry_id not in newer]

    def _next_entries(self, own_pending: bool) -> list[Entry[queue_pb2.PromptTask]]:
        """Our own unacked tasks after a restart, then dead replicas' tasks, then new ones."""
        n = self.options.worker_batch_tasks
        if own_pending:
            mine = self.queue.read_tasks(self.replica_id, n, own_pending=True)
            if mine:
                return mine
        idle_ms = int(self.options.reclaim_idle_s * 1000)
        reclaimed = self.queue.reclaim_tasks(self.replica_id, idle_ms, n)
        if reclaimed:
            self.stats.add("reclaimed", len(reclaimed))
            log.info("reclaimed %d idle task(s)", len(reclaimed))
            return reclaimed
        entries = self.queue.read_tasks(self.replica_id, n, self.options.worker_block_ms)
        more = self.options.worker_eval_batch_tasks - n
        if len(entries) == n and more > 0 and all(e.message is not None and e.message.eval for e in entries):
            entries += self.queue.read_tasks(self.replica_id, more)  # an evaluation: fill its engine call now
        return entries

    def _handle(self, entries: list[Entry[queue_pb2.PromptTask]], stop_event: threading.Event) -> None:
        valid = []
        for entry in entries:
            if entry.message is None:  # deleted or unreadable: nothing to generate, nothing to report under
                log.error("task entry %s has no readable task; acking it", entry.entry_id)
                self.queue.ack_tasks([entry.entry_id])
                self.stats.add("invalid")
            elif entry.deliveries > self.options.task_max_attempts:
                error = f"gave up after {entry.deliveries - 1} deliveries (replicas died or stalled on it)"
                self._write(entry, failed_record(entry.message, self.replica_id, error))
            else:
                valid.append(entry)
        valid = self._put_back_newer(valid)
        ids = [e.entry_id for e in valid]
        self._lease(ids, hold=True)
        finished = False
        try:
            for batch in batches(valid, self.options.worker_batch_tasks, self.options.worker_eval_batch_tasks):
                if stop_event.is_set():
                    return
                self._process(batch)
            finished = not stop_event.is_set()  # a stop may have cut a retry short: release what is left
        finally:
            self._lease(ids, hold=False)
            if not finished:  # stopping, or Redis failed mid-way: let any replica take the rest now
                self._release(ids)

    def _process(self, batch: list[Entry[queue_pb2.PromptTask]]) -> None:
        """Generate, score and write a batch; when it fails, split it up so one bad task fails alone."""
        tasks = [e.message for e in batch if e.message is not None]
        policy = replace(BATCH_RETRY, attempts=self.options.task_max_attempts)
        backoff = Backoff(policy, f"task {tasks[0].task_id}", self._stop, log)
        error, retry = "", False
        while True:
            try:
                records = self._generate_and_score(tasks)
            except QueueUnavailable:
                raise
            except Stopping:
                return  # released by _handle
            except WeightsBroken:
                raise  # _handle releases the batch to other replicas: not the task's fault
            except ValueError as exc:  # a bad task (e.g. prompt too long): retrying cannot help
                error, retry = f"invalid task: {exc}", False
            except Exception as exc:
                if len(batch) == 1:
                    error, retry = f"failed after {backoff.failures + 1} attempt(s): {type(exc).__name__}: {exc}", True
                else:
                    log.exception("batch of %d task(s) failed; trying them one by one", len(tasks))
            else:
                for entry, record in zip(batch, records, strict=True):
                    self._write(entry, record)
                return
            if len(batch) > 1:
                for entry in batch:
                    if self._stop.is_set():
                        return  # released by _handle
                    self._process([entry])
                return
            if not retry or not backoff.wait(error, exc_info=True):
                break
        if self._stop.is_set() and retry:
            return  # stopping mid-retry: the task is released to other replicas, not failed
        log.error("task %s: %s", tasks[0].task_id, error)
        self._write(batch[0], failed_record(tasks[0], self.replica_id, error))

    def _generate_and_score(self, tasks: list[queue_pb2.PromptTask]) -> list[queue_pb2.GroupRecord]:
        if probing(tasks):
            return self._probe_then_widen(tasks)
        return self._records(tasks, self._sample(tasks))

    def _sample(self, tasks: list[queue_pb2.PromptTask]) -> Sampled:
        """One engine call and one reward call for `tasks`; a reward service that failed leaves results None."""
        t0 = time.monotonic()
        try:
            generated = self.generate(tasks)
        except Interrupted as exc:
            raise Stopping from exc
        except ToolInfrastructureError as exc:  # a tool the reward service could not run: retried, then failed
            if self._stop.is_set():
                raise Stopping from exc  # our own shutdown cut the client's retries short
            raise
        t1 = time.monotonic()
        try:
            results: list[reward_pb2.ScoreResult] | None = self.score(score_items(tasks, generated))
            reward_error = ""
        except Exception as exc:  # the client already retried: the group fails, it is never scored 0
            if self._stop.is_set():
                raise Stopping from exc  # our own shutdown cut the retries short: release the task, do not fail it
            log.error("reward service failed for %d task(s): %s", len(tasks), exc)
            results, reward_error = None, f"reward service: {type(exc).__name__}: {exc}"
        return Sampled(generated, results, reward_error, t1 - t0, time.monotonic() - t1)

    def _records(self, tasks: Sequence[queue_pb2.PromptTask], sampled: Sampled) -> list[queue_pb2.GroupRecord]:
        return group_records(
            tasks, sampled.generated, sampled.results, replica_id=self.replica_id, generate_s=sampled.generate_s,
            score_s=sampled.score_s, reward_error=sampled.reward_error,
        )  # fmt: skip

    def _probe_then_widen(self, tasks: list[queue_pb2.PromptTask]) -> list[queue_pb2.GroupRecord]:
        """Adaptive group size (probe.py): every task's probe, then the rest of the groups whose probe varies."""
        first = self._sample(probe_tasks(tasks))
        if first.results is None:
            return self._records(tasks, first)  # the reward service failed: every group fails with its error
        varied = [varies(results_of(task, first.results), task.probe.on) for task in tasks]
        wide = [i for i, v in enumerate(varied) if v]
        flat = [i for i, v in enumerate(varied) if not v]
        records = dict(zip(flat, self._records([tasks[i] for i in flat], first.subset(flat)), strict=True))
        if wide:
            wide_tasks, probes = [tasks[i] for i in wide], first.subset(wide)
            rest = self._sample(rest_tasks(wide_tasks))
            same_weights = (rest.generated.weight_version, rest.generated.weight_checksum) == (
                first.generated.weight_version, first.generated.weight_checksum)  # fmt: skip
            if rest.results is None:  # failed: the rest could not be scored, and the probes are not in the group
                groups = discarding(self._records(wide_tasks, rest), probes)
            elif not same_weights:
                # New weights arrived between the two calls: a group is one policy's samples, so sample it whole.
                log.info("weights changed between probe and rest: sampling %d group(s) whole", len(wide))
                groups = discarding(self._records(wide_tasks, self._sample(whole_tasks(wide_tasks))), probes, rest)
            else:
                groups = self._records(wide_tasks, probes.widened(rest, wide_tasks, tasks[0].probe.size))
            records.update(zip(wide, groups, strict=True))
        return [records[i] for i in range(len(tasks))]

    def _write(self, entry: Entry[queue_pb2.PromptTask], record: queue_pb2.GroupRecord) -> None:
        """Append + ack atomically, retrying through short Redis outages; else leave the task pending."""
        backoff = Backoff(WRITE_RETRY, f"append of group {record.group_id}", self._stop, log)
        while True:
            try:
                with self._lock:  # the task leaves our leases as it is acked, not when the whole batch is done
                    code = self.queue.append_group(self.replica_id, entry.entry_id, record)
                    self._leases.discard(entry.entry_id)
                break
            except QueueUnavailable as exc:
                # The append may have gone through with its reply lost: stop renewing a task that may be acked
                # (were it not, the retries end well inside reclaim_idle_s).
                with self._lock:
                    self._leases.discard(entry.entry_id)
                if not backoff.wait(exc):
                    log.warning("group %s not written: its task stays pending for a reclaim", record.group_id)
                    return  # still pending: reclaimed later, by us or another replica
        if code == WRITTEN_BEFORE:
            log.info("group %s was written by the attempt whose reply was lost", record.group_id)
        if code in (APPENDED, WRITTEN_BEFORE):
            self.stats.add("done" if record.status == "ok" else "failed")
            if self.on_written is not None:
                self.on_written(record.status == "ok")
        else:
            why = "taken over by another replica" if code == TAKEN_OVER else "already done by another replica"
            log.warning("dropping result of task %s: %s", record.task_id, why)
            self.stats.add("dropped")

    def _release(self, ids: list[str]) -> None:
        """Acked ids are skipped by Redis; the rest become reclaimable at once instead of after the idle threshold."""
        try:
            released = self.queue.release_tasks(self.replica_id, ids)
        except QueueUnavailable as exc:
            log.warning("could not release %d task(s); they are reclaimed once idle: %s", len(ids), exc)
            return
        if released:
            log.info("released %d unprocessed task(s) to other replicas", released)
