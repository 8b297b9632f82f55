"""The GRPO loop: admit batches, collect and triage groups, update, push weights, checkpoint, evaluate.

The invariants this loop keeps, and where: task accounting and resume (accounting.py), admission
control (`batches_to_publish`), deferred acks after checkpoints (consumer.GroupReader), bounded
waits everywhere (group timeout, push timeout, Redis socket timeouts).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import torch
from prometheus_client import CollectorRegistry

from grpo.algo import group_advantages
from grpo.common.queue import QueueUnavailable, RunQueue, connect
from grpo.common.readiness import redis_check
from grpo.common.registry import ReplicaInfo, ReplicaRegistry
from grpo.common.retry import RetryPolicy, retry
from grpo.common.weight_broadcast import WeightBroadcaster
from grpo.trainer.accounting import (
    GROUP_VERDICTS,
    Accounting,
    FailureStreak,
    StepQuota,
    batches_to_publish,
    describe_failures,
    lineage_staleness,
    resolved_groups,
    triage,
)
from grpo.trainer.assemble import build_learner, load_grpo_data, resolve_algo, task_spec
from grpo.trainer.checkpoint import Outcomes, latest_checkpoint, rewind
from grpo.trainer.config import TrainerSettings
from grpo.trainer.consumer import (
    GroupReader,
    facts_of,
    failure_reason,
    group_metrics,
    process_credit,
    step_metrics,
    to_samples,
)
from grpo.trainer.control import ReplicaView, RunControl
from grpo.trainer.data import DataCursor
from grpo.trainer.errors import RunError
from grpo.trainer.evaluation import evaluate
from grpo.trainer.ledger import read_segment
from grpo.trainer.metrics import MetricsSink
from grpo.trainer.publisher import Publisher
from grpo.trainer.pusher import ReplicaTarget, highest_pushed, push_mode, push_to_replicas, record_pushed
from grpo.trainer.ranks import RankDriver
from grpo.trainer.report import evaluated, last_row_at, read_metrics
from grpo.trainer.vine import VALUE_KIND, ValueBooks, sample_credit, split_points, value_task_id
from grpo.trainer.waiting import WaitReporter
from grpo.v1 import queue_pb2

log = logging.getLogger(__name__)
CONSUMER = "trainer"  # one stable consumer name per run: a restarted trainer finds its pending list under it
Kept = list[tuple[str, queue_pb2.GroupRecord]]
T = TypeVar("T")
REDIS_RETRY = RetryPolicy(base_s=0.5, cap_s=5.0)  # every Redis call of the loop; deadline_s is redis_outage_s
# A step's push counts when it pushed nothing: logged every step, as the triage counts (see _collect).
NO_PUSHES = {"push/ok": 0.0, "push/failed": 0.0, "push/bytes_sent": 0.0}
RESYNC_S = 2.0  # while groups are awaited, how often the registry is read for replicas that lack the weights


def evaluation_due(step: int, s: TrainerSettings) -> bool:
    """Whether the run evaluates at `step` (given eval data): the baseline at 0, every eval_every, the last."""
    if step == 0:
        return s.eval_before_train
    return bool(s.eval_every and step % s.eval_every == 0) or step == s.steps


class GrpoRun:
    """One GRPO run; `run()` blocks until the last step, a stop request or a fatal error."""

    def __init__(
        self, settings: TrainerSettings, control: RunControl, prometheus_registry: CollectorRegistry | None = None
    ) -> None:
        s = self.s = settings
        self.control = control
        self.algo = resolve_algo(s)
        self.zero_variance_on = self.algo.zero_variance_basis()  # resolved (and checked) once
        self.spec = task_spec(s, self.algo)
        data = load_grpo_data(s, self.algo, self.spec, s.model)
        self.rows, self.eval_rows = data.rows, data.eval_rows
        self.longest_prompt = data.longest_prompt  # what every replica's context must hold
        client = connect(s.redis_url)
        self.queue = RunQueue(client, s.run_id)
        self.control.readiness.add("redis", redis_check(s.redis_url))
        # A pod can start before Redis (or its DNS name) answers: wait for it as for any outage.
        self._retry(self.queue.ensure_groups, "creating the run's consumer groups")
        self.registry = ReplicaRegistry(client, s.run_id)
        self.broadcaster = (
            WeightBroadcaster(s.broadcast_address, s.broadcast_backend, s.broadcast_timeout_s)
            if s.weight_transport == "broadcast"
            else None
        )
        self.waiting = WaitReporter(self.queue, self.registry, s.redis_url)  # says what a long wait is for
        self.reader = GroupReader(self.queue, CONSUMER)
        self.learner = RankDriver(build_learner(s, self.algo), s.model)
        self.acct = Accounting()
        self.value_books = ValueBooks()
        self.failed_streak = FailureStreak(s.max_failed_steps)
        # The last _collect's triage verdicts (verdict -> groups) and its failed groups' reasons (reason -> groups).
        self.outcomes: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.step = 0
        self.ckpt_root = s.output_dir / "checkpoints"
        self.ledger_root = s.output_dir / "ledger"
        cursor = DataCursor(seed=s.seed)
        self.resumed_version: int | None = None
        path = None if s.resume == "never" else latest_checkpoint(self.ckpt_root) if s.resume == "auto" else s.resume
        info = None if path is None else self.learner.load(path)
        # The ledger and checkpoints follow the one resumed from (a fresh run: a fresh ledger, no checkpoints).
        rewind(self.ckpt_root, self.ledger_root, info)
        # The ledger segment of the last checkpoint's step: a re-save of that step adds to it.
        self.segment: tuple[int, Outcomes] = (-1, [])
        if info is not None:
            # A checkpoint from before checkpoints carried their segment: the ledger's copy is the one there is.
            outcomes = read_segment(self.ledger_root, info.step) if info.outcomes is None else info.outcomes
            self.segment = (info.step, outcomes)
            self.step = info.step
            cursor = DataCursor.from_state(info.data_cursor)
            self.acct = Accounting.from_state(info.inflight, time.monotonic())
            self.resumed_version = self.learner.version
            log.info("resumed at step %d, version %d, %d task(s) in flight", self.step, self.learner.version,
                     self.acct.n_in_flight)  # fmt: skip
        self.publisher = Publisher(self.queue, self.rows, self.spec, s.run_id, cursor)
        s.output_dir.mkdir(parents=True, exist_ok=True)
        # The row already logged for the step we start at (a resume), and whether that step still owes its
        # evaluation: due there and no eval/accuracy in the row (stopped mid-evaluation, or killed in it).
        resumed_row = last_row_at(s.output_dir / "metrics.jsonl", self.step) if path is not None else None
        self.eval_owed = bool(self.eval_rows) and evaluation_due(self.step, s) and not evaluated(resumed_row)
        self.resumed_row = resumed_row if self.eval_owed else None
        # The owed step's row is written again with the evaluation: drop the old one (and its TensorBoard events)
        # so that step has one row.
        start_step = (self.step - 1 if self.eval_owed else self.step) if path is not None else -1
        self.sink = MetricsSink(
            tensorboard_dir=s.output_dir / "tensorboard",
            jsonl_path=s.output_dir / "metrics.jsonl",
            prometheus_registry=prometheus_registry,
            wandb_project=s.wandb_project,
            wandb_run_name=s.run_id,
            run_config=s.run_record(),
            start_step=start_step,  # a fresh run (-1) starts fresh files, as the ledger
        )
        evaluations = [r for r in read_metrics(s.output_dir / "metrics.jsonl")
                       if "eval/accuracy" in r and r["step"] <= self.step]  # fmt: skip
        self.control.update(
            eval_history=tuple((r["step"], r["eval/accuracy"]) for r in evaluations),
            last_eval=eval_result(evaluations[-1]) if evaluations else None,  # a resumed run's, until its next one
        )
        self.confirmed: dict[str, int] = {}  # replica id -> version it confirmed (push reply)
        # replica id -> the incarnation that confirmed it: one restarted under the same id is back on the model from
        # disk, and is pushed to again
        self.confirmed_by: dict[str, str] = {}
        self.synced_at = 0.0  # when _resync last looked for replicas that lack the current weights
        self.push_stats: dict[str, float] = {}
        self.last_checkpoint_step = self.step if path is not None else -1

    @property
    def version(self) -> int:
        """The policy version: the learner's, which is also the version pushed to the replicas."""
        return self.learner.version

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        s = self.s
        self.control.update(phase="grpo", total_steps=s.steps, step=self.step, policy_version=self.version)
        if self.step < s.steps or self.eval_owed:
            self._start_replicas()
        if self.step < s.steps:
            self.reader.recover_pending()
        if self.eval_owed:  # the baseline (step 0), or an evaluation a stop or a crash took from this step
            self._evaluate_owed()
        while self.step < s.steps and not self.control.stopping:
            self._serve_checkpoint_requests()
            push_s = self._sync_replicas()
            self._admit()
            started = time.monotonic()
            kept, collect_metrics = self._collect()
            if kept is None:
                break  # stop requested mid-collection: the kept groups stay in flight and unacked
            self._judge_failures()
            wait_s = time.monotonic() - started
            train_metrics = self._train(kept)
            push_s += self._sync_replicas() if kept else 0.0
            self.step += 1
            self.acct.check()
            metrics = {**collect_metrics, **train_metrics, **self.acct.summary(), **NO_PUSHES, **self.push_stats}
            self.push_stats = {}
            metrics.update({"time/wait_rollouts_s": wait_s, "time/push_s": push_s, "policy_version": self.version})
            metrics["time/step_s"] = time.monotonic() - started
            if self.step % s.checkpoint_every == 0:
                self._checkpoint()
            if self.eval_rows and evaluation_due(self.step, s):
                metrics.update(self._evaluate())
            self.sink.log(self.step, metrics)
            self._publish_status(metrics)
        if self.last_checkpoint_step != self.step or self.acct.recent:
            self._checkpoint()
        # A final evaluation cut short is owed, not done: no final/, so the next start evaluates again
        # (service.final_evaluation_lost) before the run counts as finished.
        done = self.step >= s.steps and not self.eval_owed
        if done and self.acct.trained == 0:
            raise RunError(nothing_trained(self.step, self.acct.dropped))
        if done:
            self._save_final()
        self._serve_checkpoint_requests()
        self.control.update(phase="done" if done else "stopped")

    def close(self) -> None:
        """Release the follower ranks and the metrics files (idempotent; also after a failure)."""
        self.learner.close()
        self.sink.close()
        if self.broadcaster is not None:
            self.broadcaster.close()

    # ---- replicas ------------------------------------------------------------------------------
    def _live(self) -> list[Any]:
        return self._retry(self.registry.live_replicas, "reading the replica registry")

    def _start_replicas(self) -> None:
        """Wait for replicas, then push our weights under a version newer than any they hold."""
        deadline = time.monotonic() + self.s.replica_wait_s
        live = self._live()
        while len(live) < self.s.min_replicas:
            if self.control.stopping:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(live)} live rollout replica(s) for run {self.s.run_id!r} after "
                    f"{self.s.replica_wait_s:.0f}s (need {self.s.min_replicas}); are they started with the same "
                    "--redis-url and run name?"
                )
            self.waiting.tick(f"waiting for rollout replicas: {len(live)} of {self.s.min_replicas} live "
                              f"(the run fails after {self.s.replica_wait_s:.0f}s)")  # fmt: skip
            self.control.stop_event.wait(0.5)
            live = self._live()
        self.waiting.done()
        check_replica_caps(live, self.s.max_new_tokens, self.longest_prompt)
        newest = max([r.weight_version for r in live], default=0)
        # Above every version ever pushed from this output dir, not only the live replicas': restarted with the
        # trainer, they report 0, and the lost lineage's first version would be reused, its groups trained as
        # on-policy.
        new_version = max(self.version, newest, highest_pushed(self.s.output_dir)) + 1
        if self.resumed_version is not None:
            # The restored weights get a fresh version; versions in between belong to the lost lineage.
            self.acct.version_aliases.append((self.resumed_version, new_version))
        self.learner.set_version(new_version)
        self._sync_replicas(live)

    def _holds_version(self, replica: ReplicaInfo) -> bool:
        """Whether `replica` holds the current weights: by its heartbeat, or by this incarnation's push reply (the
        heartbeat lags a push by up to heartbeat_s)."""
        if replica.weight_version >= self.version:
            return True
        confirmed = self.confirmed.get(replica.replica_id) == self.version
        return confirmed and self.confirmed_by.get(replica.replica_id) == replica.incarnation

    def _sync_replicas(self, live: list[Any] | None = None) -> float:
        """Push the current weights to every live replica that does not hold them yet; seconds spent."""
        live = self._live() if live is None else live
        targets = [
            ReplicaTarget(r.replica_id, r.address, r.weights_data_port) for r in live if not self._holds_version(r)
        ]
        if not targets:
            return 0.0
        started = time.monotonic()
        record_pushed(self.s.output_dir, self.version)  # durable before any replica can hold it
        tensors = self.learner.push_tensors()
        results = push_to_replicas(
            targets, tensors, self.version, token=self.s.weights_token, timeout_s=self.s.push_timeout_s,
            retries=self.s.push_retries, ca_file=self.s.rollout_tls_ca_file,
            mode=push_mode(self.s.weight_push, len(targets)), fanout=self.s.relay_fanout,
            broadcaster=self.broadcaster, send_rate_mb_s=self.s.weights_send_rate_mb_s,
        )  # fmt: skip
        incarnations = {r.replica_id: r.incarnation for r in live}
        for r in results:
            if r.ok:
                self.confirmed[r.replica_id] = r.version
                self.confirmed_by[r.replica_id] = incarnations.get(r.replica_id, "")
        # Judged over every live replica, not this call's targets: one that took the version earlier serves it.
        if not any(self._holds_version(r) for r in live):
            log.error("no replica accepted version %d; its groups will be dropped as stale until one does",
                      self.version)  # fmt: skip
        for key, value in (  # summed: a step may push twice (before collecting, after training)
            ("push/ok", sum(r.ok for r in results)),
            ("push/failed", sum(not r.ok for r in results)),
            ("push/bytes_sent", sum(r.bytes_sent for r in results)),
        ):
            self.push_stats[key] = self.push_stats.get(key, 0.0) + float(value)
        return time.monotonic() - started

    def _resync(self) -> None:
        """While groups are awaited, push to replicas that joined or restarted since the step began (every
        RESYNC_S): they take no task published under weights they lack, so without it they would idle until the
        step's end, or, the only replica, stall the run."""
        if time.monotonic() - self.synced_at >= RESYNC_S:
            self.synced_at = time.monotonic()
            self._sync_replicas()

    # ---- publishing and collecting ---------------------------------------------------------------
    def _admit(self) -> None:
        s = self.s
        for _ in range(batches_to_publish(self.acct.batches_published, self.step, s.max_staleness, s.steps)):
            # A failed XADD whose reply was lost may leave tasks in Redis that the accounting never saw: the retry
            # republishes the same ids (the cursor did not move), and the extra group is counted as a duplicate.
            self._retry(
                lambda: self.publisher.publish(
                    s.prompts_per_step, self.version, self.acct.batches_published, self.acct
                ),
                "publishing tasks",
            )
            self.acct.batches_published += 1

    def _collect(self) -> tuple[Kept | None, dict[str, float]]:
        """Groups until the step's quota is met; None when a stop was requested first."""
        s = self.s
        refill = self.algo.refill_zero_variance
        budget = (
            (s.max_refill_per_step if s.max_refill_per_step is not None else 2 * s.prompts_per_step) if refill else 0
        )
        quota = StepQuota(need=s.prompts_per_step, refill_budget=budget)
        kept: Kept = []
        kept_ids: set[str] = set()
        sampled: list[queue_pb2.GroupRecord] = []  # every ok group that resolved its task, kept or dropped
        outcomes: Counter[str] = Counter()
        self.outcomes, self.failures = outcomes, Counter()
        staleness: list[int] = []
        while not quota.done:
            if self.control.stopping:
                return None, {}
            if self.acct.n_in_flight - len(kept) <= 0 and not self.reader.buffer:
                break  # nothing more can arrive for this step
            expired = self.acct.expired(time.monotonic(), s.group_timeout_s)
            arrived = {e.message.group_id for e in self.reader.buffer if e.message is not None} if expired else set()
            for tid in expired:
                if tid not in kept_ids and tid not in arrived:  # a group held back during value rollouts is here
                    log.warning("task %s: no group after %.0fs; dropped (timeout)", tid, s.group_timeout_s)
                    self.acct.resolve(tid, "timeout")
                    outcomes["timeout"] = outcomes.get("timeout", 0) + 1
                    self._on_resolved(quota, "timeout")
            entry = self._retry(lambda: self.reader.next(block_ms=500), "reading groups")
            if entry is None:
                self._resync()
                self.waiting.tick(f"step {self.step}: waiting for groups, {len(kept)} of {quota.need} kept, "
                                  f"{self.acct.n_in_flight - len(kept)} task(s) in flight")  # fmt: skip
                continue
            self.waiting.done()
            record = entry.message
            if record is None or record.eval:
                self.reader.ack_now(entry.entry_id)  # unreadable, or an eval group nobody awaits any more
                continue
            if record.kind == VALUE_KIND:  # a value group whose step is over (see vine.py)
                self.value_books.late += 1
                self.reader.ack_now(entry.entry_id)
                continue
            facts = facts_of(record, self.zero_variance_on, self.algo.reward_clip, steps=self.algo.credit == "process")
            verdict = "duplicate" if record.group_id in kept_ids else triage(
                facts, self.acct, self.version, s.max_staleness, self.algo.skip_zero_variance, self.algo.group_size
            )  # fmt: skip
            outcomes[verdict] = outcomes.get(verdict, 0) + 1
            if verdict == "duplicate":
                self.acct.duplicates += 1
                self.reader.ack_now(entry.entry_id)
                continue
            if verdict in ("superseded", "regenerate"):  # made by discarded weights: the task stays in flight
                if verdict == "regenerate":
                    self._republish(record.group_id)
                self.acct.superseded += 1
                self.reader.ack_now(entry.entry_id)
                continue
            if record.status == "ok":
                sampled.append(record)
            if verdict == "train":
                kept.append((entry.entry_id, record))
                kept_ids.add(record.group_id)
                staleness.append(lineage_staleness(self.version, facts.weight_version, self.acct.version_aliases) or 0)
            else:
                if verdict == "failed":
                    self.failures[failure_reason(record, self.algo.group_size)] += 1
                self.acct.resolve(record.group_id, verdict)
                self.reader.defer_ack(entry.entry_id)
            self._on_resolved(quota, verdict)
        resolved = sum(v for k, v in outcomes.items() if k not in ("duplicate", "superseded", "regenerate"))
        # rollout/* describe what the policy sampled this step, not the subset the filters kept for the update.
        metrics = group_metrics(sampled)
        # Every verdict every step (0 when none): a Prometheus gauge keeps its last value, and a count from an
        # earlier step would read as this step's.
        metrics.update({f"groups/{k}": float(outcomes.get(k, 0)) for k in GROUP_VERDICTS})
        metrics["groups/zero_variance_fraction"] = outcomes.get("zero_variance", 0) / max(resolved, 1)
        metrics["groups/refills"] = float(quota.refills)
        if staleness:
            metrics["staleness/mean"] = sum(staleness) / len(staleness)
            metrics["staleness/max"] = float(max(staleness))
        return kept, metrics

    def _judge_failures(self) -> None:
        """Say why the step's groups failed (the rollout's reasons); end the run when every group keeps failing."""
        if self.failures:
            log.warning("step %d: %d of %d group(s) failed: %s", self.step, sum(self.failures.values()),
                        resolved_groups(self.outcomes), describe_failures(self.failures))  # fmt: skip
        self.failed_streak.add(self.outcomes, self.failures)

    def _retry(self, call: Callable[[], T], what: str) -> T:
        """Ride out a Redis outage of up to redis_outage_s (then fail the run: reported, never hung)."""
        policy = replace(REDIS_RETRY, deadline_s=self.s.redis_outage_s)
        try:
            return retry(call, what, policy, on=QueueUnavailable, stop=self.control.stop_event, logger=log,
                         describe=lambda exc: f"Redis unavailable: {exc}")  # fmt: skip
        except QueueUnavailable as exc:
            why = "stopping" if self.control.stopping else f"for {self.s.redis_outage_s:.0f}s"
            raise RuntimeError(f"Redis unavailable while {what} ({why})") from exc

    def _republish(self, tid: str) -> None:
        self._retry(lambda: self.publisher.republish(tid, self.version, self.acct), "republishing a task")

    def _on_resolved(self, quota: StepQuota, outcome: str) -> None:
        if quota.on_resolved(outcome):  # DAPO dynamic sampling: replace the zero-variance group
            self._retry(lambda: self.publisher.publish(1, self.version, self.step, self.acct), "publishing a refill")

    # ---- update ---------------------------------------------------------------------------------
    def _train(self, kept: Kept) -> dict[str, float]:
        """One update on the kept groups; then they count as trained and their acks wait for a checkpoint."""
        if not kept:
            verdicts = ", ".join(f"{verdict} {n}" for verdict, n in sorted(self.outcomes.items()) if n)
            log.warning("step %d: every group was dropped (%s); no update", self.step, verdicts or "none came")
            return {}
        g = self.algo.group_size
        rewards = torch.tensor([s.reward for _, r in kept for s in r.samples], dtype=torch.float32)
        advantages = group_advantages(rewards, g, **self.algo.advantage_kwargs()).tolist()
        records = [record for _, record in kept]
        vine = self._vine_credit(records) if self.algo.credit == "vineppo" else None
        samples = []
        for i, record in enumerate(records):
            outcome = advantages[i * g : (i + 1) * g]
            per_token = process_credit(record, outcome, self.algo) if self.algo.credit == "process" else None
            samples += to_samples(record, outcome, vine[i] if vine is not None else per_token)
        metrics = self.learner.step(samples)
        if self.algo.credit == "process":
            metrics.update(step_metrics(records))
        out = {f"train/{k}": v for k, v in metrics.items()}
        if vine is not None:  # the value rollouts' books and cost
            out.update(self.value_books.metrics(sum(len(s.completion.token_ids) for r in records for s in r.samples)))
        for entry_id, record in kept:
            self.acct.resolve(record.group_id, "trained")
            self.reader.defer_ack(entry_id)
        return out

    def _vine_credit(self, records: list[queue_pb2.GroupRecord]) -> list[list[list[float]]]:
        """VinePPO: value tasks at each completion's split points, their groups awaited (others held back for
        later steps), then per-token advantages for every sample of every group (see vine.py)."""
        algo, books = self.algo, self.value_books
        plan: dict[str, tuple[int, int, int]] = {}  # value task id -> (group, sample, split point)
        tasks = []
        splits: list[list[list[int]]] = []
        for gi, record in enumerate(records):
            splits.append([])
            for si, sample in enumerate(record.samples):
                ids = list(sample.completion.token_ids)
                points = split_points(list(sample.step_token_ends), len(ids), algo.vine_max_splits)
                splits[-1].append(points)
                for b in points:
                    tid = value_task_id(record.group_id, si, b, self.version)
                    plan[tid] = (gi, si, b)
                    tasks.append(self.publisher.value_task(record.group_id, tid, ids[:b], self.version, algo.vine_k))
        if tasks:
            self._retry(lambda: self.queue.publish_tasks(tasks), "publishing value tasks")
            books.published += len(tasks)
        values = self._await_values(plan)
        out = []
        for gi, record in enumerate(records):
            rewards = [s.reward for s in record.samples]
            prompt_value = sum(rewards) / len(rewards)  # the group is the prompt's Monte Carlo sample
            out.append([
                sample_credit(splits[gi][si], values.get((gi, si), {}), prompt_value, s.reward,
                              len(s.completion.token_ids))
                for si, s in enumerate(record.samples)
            ])  # fmt: skip
        return out

    def _await_values(self, plan: dict[str, tuple[int, int, int]]) -> dict[tuple[int, int], dict[int, float]]:
        """Read groups until every planned value group came or group_timeout_s passed; other groups wait in the
        reader's buffer, in order, for the steps they belong to."""
        books = self.value_books
        values: dict[tuple[int, int], dict[int, float]] = {}
        pending, held = set(plan), []
        started = time.monotonic()
        try:
            while pending and time.monotonic() < started + self.s.group_timeout_s and not self.control.stopping:
                entry = self._retry(lambda: self.reader.next(block_ms=500), "reading value groups")
                if entry is None:
                    self.waiting.tick(f"step {self.step}: waiting for value groups, {len(pending)} of "
                                      f"{len(plan)} missing")  # fmt: skip
                    continue
                self.waiting.done()
                record = entry.message
                if record is None or record.kind != VALUE_KIND:
                    held.append(entry)  # a group for a later step (or an evaluation)
                    continue
                self.reader.ack_now(entry.entry_id)
                if record.group_id not in pending:
                    books.late += 1
                    continue
                pending.discard(record.group_id)
                books.continuation_tokens += sum(len(s.completion.token_ids) for s in record.samples)
                rewards = [s.reward for s in record.samples if s.HasField("reward")]
                if record.status != "ok" or not record.samples:
                    books.dropped["failed"] += 1
                elif len(rewards) != len(record.samples):
                    books.dropped["unscored"] += 1
                else:
                    gi, si, b = plan[record.group_id]
                    values.setdefault((gi, si), {})[b] = sum(rewards) / len(rewards)
                    books.used += 1
        finally:
            self.reader.buffer.extendleft(reversed(held))
        if pending:
            reason = "stopped" if self.control.stopping else "timeout"
            log.warning("%d value group(s) missing (%s); their split points are left out", len(pending), reason)
            books.dropped[reason] += len(pending)
        books.wait_s += time.monotonic() - started
        books.check()
        return values

    # ---- checkpoints, evaluation, status -------------------------------------------------------
    def _checkpoint(self) -> str:
        # The step's whole ledger segment goes into the checkpoint and to the ledger after it (save_checkpoint):
        # a crash at any point leaves the ledger as the surviving checkpoint has it, each task once.
        step, earlier = self.segment
        outcomes = (earlier if step == self.step else []) + self.acct.recent
        path = self.learner.save(
            self.ckpt_root, step=self.step, data_cursor=self.publisher.cursor.to_state(),
            inflight=self.acct.to_state(time.monotonic()), keep_last=self.s.keep_checkpoints,
            outcomes=outcomes, ledger_root=self.ledger_root,
        )  # fmt: skip
        self.segment, self.acct.recent = (self.step, outcomes), []
        self.last_checkpoint_step = self.step
        # Only now is every consumed group's outcome durable: release them in Redis. A failed ack is tried
        # again at the next checkpoint; a trainer restarted before that re-reads them as duplicates.
        try:
            self.reader.ack_deferred()
        except QueueUnavailable as exc:
            log.warning("could not ack consumed groups after the checkpoint: %s", exc)
        return str(path)

    def _serve_checkpoint_requests(self) -> None:
        for fut in self.control.take_checkpoint_requests():
            try:
                fut.set_result((self._checkpoint(), self.step))
            except Exception as exc:
                fut.set_exception(exc)

    def _evaluate(self) -> dict[str, float]:
        """Evaluate the current weights for self.step; a stop cuts it short and leaves that step's evaluation owed."""
        # The status names the step and version being evaluated, and the books as that step left them.
        self.control.update(phase="eval", step=self.step, policy_version=self.version, **self._books())
        try:
            metrics = evaluate(
                self.reader, self.eval_rows, self.spec, run_id=self.s.run_id,
                round_id=f"{self.step}x{uuid.uuid4().hex[:6]}", policy_version=self.version,
                temperature=self.s.eval_temperature, timeout_s=self.s.eval_timeout_s,
                should_stop=lambda: self.control.stopping, sync_replicas=self._resync,
            )  # fmt: skip
        finally:
            self.control.update(phase="grpo")
        self.eval_owed = metrics.get("eval/stopped", 0.0) > 0
        if "eval/accuracy" in metrics:  # finished (one a stop cut short keeps the previous last_eval)
            history = (*self.control.status().eval_history, (self.step, metrics["eval/accuracy"]))
            self.control.update(eval_history=history, last_eval=eval_result({"step": self.step, **metrics}))
        return metrics

    def _evaluate_owed(self) -> None:
        """Evaluate the weights of the step the run starts at and log its row: the baseline, or (resumed) an
        evaluation a stop cut short or a crash lost after the step's checkpoint. The step keeps one row: the
        old one's training metrics, when it was logged, with the new evaluation."""
        old = {k: v for k, v in (self.resumed_row or {}).items() if k not in ("step", "time")}
        if self.step > 0 and not old:
            log.warning("run %r: step %d's metrics and evaluation were lost with the trainer that did it (killed "
                        "after the step's checkpoint); evaluating its checkpoint again, the step's training "
                        "metrics stay lost", self.s.run_id, self.step)  # fmt: skip
        elif old:
            log.warning("run %r: step %d's evaluation was cut short by a stop; evaluating its checkpoint again",
                        self.s.run_id, self.step)  # fmt: skip
        if self.control.stopping:  # stopped before it began: the row stays as it was, the next start evaluates
            if old:
                self.sink.log(self.step, old)
            return
        metrics = {k: v for k, v in old.items() if not k.startswith("eval/")}
        self.sink.log(self.step, {**metrics, **self._evaluate()})

    def _save_final(self) -> None:
        self.learner.save_final(self.s.output_dir / "final")

    def _publish_status(self, metrics: dict[str, float]) -> None:
        now = time.time()
        replicas = tuple(
            ReplicaView(r.replica_id, r.address, r.weight_version, max(0.0, now - r.heartbeat), r.tasks_done)
            for r in self._live()
        )
        self.control.update(
            step=self.step, policy_version=self.version, replicas=replicas, **self._books(),
            metrics={k: float(v) for k, v in metrics.items() if isinstance(v, int | float)},
        )  # fmt: skip

    def _books(self) -> dict[str, Any]:
        """The task books for the status: published = trained + Σ dropped + in_flight. Duplicates and superseded
        groups settle no task, so they are counted beside the books, never in `dropped`."""
        a = self.acct
        return {"tasks_published": a.published, "groups_trained": a.trained, "dropped": dict(a.dropped),
                "in_flight": a.n_in_flight, "duplicates": a.duplicates, "superseded": a.superseded}  # fmt: skip


def eval_result(row: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """(step, eval/* metrics) of a metrics row that holds a finished evaluation: the status's last_eval."""
    return int(row["step"]), {k: float(v) for k, v in row.items() if k.startswith("eval/")}


def check_replica_caps(live: list[ReplicaInfo], max_new_tokens: int, longest_prompt: int = 0) -> None:
    """RunError naming each replica that would refuse tasks: the run's max_new_tokens over its cap, or the longest
    prompt with max_new_tokens past its engine's context (vLLM's --max-model-len may be below the model's). Said
    at start-up, not after `max_failed_steps` steps of failed groups. (0: a replica that does not say.)"""
    short = [f"{r.replica_id} (cap {r.max_new_tokens_cap})" for r in live if 0 < r.max_new_tokens_cap < max_new_tokens]
    if short:
        raise RunError(
            f"max_new_tokens {max_new_tokens} is over what rollout replica(s) {', '.join(short)} generate: lower "
            "max_new_tokens, or start the rollout service with a larger --max-new-tokens-cap"
        )
    need = longest_prompt + max_new_tokens
    small = [f"{r.replica_id} ({r.max_context})" for r in live if 0 < r.max_context < need]
    if small:
        raise RunError(
            f"the longest prompt ({longest_prompt} tokens) with max_new_tokens {max_new_tokens} needs a context of "
            f"{need} tokens, more than rollout replica(s) {', '.join(small)} hold: raise the rollout's context "
            "(vLLM: --vllm-max-model-len), lower max_new_tokens, or leave long prompts out (overlong_prompts: drop "
            "drops only those past the model's own context)"
        )


def nothing_trained(steps: int, dropped: dict[str, int]) -> str:
    """Why a run that updated the policy on no group is a failure, not a finished run with its starting weights."""
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(dropped.items()) if n) or "none"
    hint = ""
    if dropped.get("zero_variance", 0) * 2 > sum(dropped.values()):
        hint = (": every sample of a group got the same reward, so no group had an advantage. Start from a model "
                "that sometimes solves the task (an SFT stage, as the demo's), or check that the reward varies")  # fmt: skip
    return f"{steps} steps trained on no group (tasks dropped: {reasons}){hint}; no final model was written"
