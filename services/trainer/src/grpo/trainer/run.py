"""The GRPO loop: admit batches, collect and triage groups, update, push weights, checkpoint, evaluate.

The invariants this loop keeps, and where: task accounting and resume (accounting.py), admission
control (`batches_to_publish`), deferred acks after checkpoints (consumer.GroupReader), bounded
waits everywhere (group timeout, push timeout, Redis socket timeouts: redis_retry.py).

Its parts are built before it starts (build.py: the data, the model, Redis, a resume); the replicas' copy of the
weights is replica_sync.py's, and how kept groups get their advantages is the credit registry's (credit.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from grpo.algo import group_advantages
from grpo.common.queue import QueueUnavailable
from grpo.common.registry import ReplicaInfo, ReplicaRegistry
from grpo.common.weights.broadcast import WeightBroadcaster
from grpo.trainer.accounting import (
    GROUP_VERDICTS,
    FailureStreak,
    StepQuota,
    batches_to_publish,
    describe_failures,
    lineage_staleness,
    resolved_groups,
    triage,
)
from grpo.trainer.build import RunParts, build_run, eval_result, evaluation_due
from grpo.trainer.config import TrainerSettings
from grpo.trainer.consumer import (
    Settled,
    correctness,
    facts_of,
    failure_reason,
    group_metrics,
    group_spread,
    spend_metrics,
    task_metrics,
    to_samples,
    unscored_reason,
)
from grpo.trainer.control import ReplicaView, RunControl
from grpo.trainer.difficulty import SOLVED, bucket_metrics
from grpo.trainer.errors import RunError
from grpo.trainer.evaluation import evaluate
from grpo.trainer.live_doctor import LiveDoctor
from grpo.trainer.publisher import position_of
from grpo.trainer.replica_sync import check_replica_caps
from grpo.trainer.vine import VALUE_KIND
from grpo.v1 import queue_pb2

log = logging.getLogger(__name__)
Kept = list[tuple[str, queue_pb2.GroupRecord]]
# A step's push counts when it pushed nothing: logged every step, as the triage counts (see _collect).
NO_PUSHES = {"push/ok": 0.0, "push/failed": 0.0, "push/bytes_sent": 0.0}


class GrpoRun:
    """One GRPO run; `run()` blocks until the last step, a stop request or a fatal error."""

    phase = "grpo"  # what the status says the run is doing between evaluations

    def __init__(
        self,
        settings: TrainerSettings,
        control: RunControl,
        prometheus_registry: CollectorRegistry | None = None,
        *,
        parts: RunParts | None = None,
    ) -> None:
        """`parts`: what the loop runs on; by default build_run builds them from the settings (and resumes)."""
        self.s = settings
        self.control = control
        p = build_run(settings, control, prometheus_registry) if parts is None else parts
        self.algo = p.algo
        self.zero_variance_on = p.zero_variance_on
        self.spec, self.rows, self.eval_rows, self.longest_prompt = p.spec, p.rows, p.eval_rows, p.longest_prompt
        # The task types of a multi-task run (task/<type>/* and eval/<type>/* metrics); () when the data hold one.
        types = sorted({row.task_type for row in self.rows})
        self.task_types: tuple[str, ...] = tuple(types) if len(types) > 1 else ()
        self.queue, self._retry, self.replicas, self.waiting = p.queue, p.retry, p.replicas, p.waiting
        self.reader, self.learner, self.acct, self.publisher = p.reader, p.learner, p.acct, p.publisher
        self.value_books, self.credit, self.sink = p.value_books, p.credit, p.sink
        self.failed_streak = FailureStreak(settings.max_failed_steps)
        self.doctor = LiveDoctor(self.algo, settings.max_staleness)  # grpo doctor's rules, as warnings
        # The last _collect's triage verdicts (verdict -> groups) and its failed groups' reasons (reason -> groups).
        self.outcomes: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.unscored: Counter[str] = Counter()  # the last _collect's unscored groups' reasons (reason -> groups)
        self.last_unscored: Counter[str] = Counter()  # the reasons of the last step that had any (the end's error)
        r = p.resumed
        self.step, self.resumed_version, self.segment = r.step, r.version, r.segment
        self.eval_owed, self.resumed_row, self.last_checkpoint_step = r.eval_owed, r.row, r.last_checkpoint_step
        self.ckpt_root = settings.output_dir / "checkpoints"
        self.ledger_root = settings.output_dir / "ledger"

    @property
    def version(self) -> int:
        """The policy version: the learner's, which is also the version pushed to the replicas."""
        return self.learner.version

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        s = self.s
        self.control.update(phase=self.phase, total_steps=s.steps, step=self.step, policy_version=self.version)
        if self.step < s.steps or self.eval_owed:
            self._start_replicas()
            self._publish_status({})  # the replicas in /v1/status from the start, not from the first step on
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
            push_stats = self.replicas.take_stats()
            metrics = {**collect_metrics, **train_metrics, **self.acct.summary(), **NO_PUSHES, **push_stats}
            metrics.update({"time/wait_rollouts_s": wait_s, "time/push_s": push_s, "policy_version": self.version})
            metrics["time/step_s"] = time.monotonic() - started
            if self.step % s.checkpoint_every == 0:
                self._checkpoint()
            if self.eval_rows and evaluation_due(self.step, s):
                metrics.update(self._evaluate())
            self.sink.log(self.step, metrics)
            self.doctor.observe(self.step, metrics)
            self._publish_status(metrics)
        if self.last_checkpoint_step != self.step or self.acct.recent:
            self._checkpoint()
        # A final evaluation cut short is owed, not done: no final/, so the next start evaluates again
        # (service.final_evaluation_lost) before the run counts as finished.
        done = self.step >= s.steps and not self.eval_owed
        if done and self.acct.trained == 0:
            raise RunError(nothing_trained(self.step, self.acct.dropped, self.last_unscored))
        if done:
            self._save_final()
        self._serve_checkpoint_requests()
        self.control.update(phase="done" if done else "stopped")

    def close(self) -> None:
        """Release the follower ranks and the metrics files (idempotent; also after a failure)."""
        self.learner.close()
        self.sink.close()
        self.replicas.close()

    # ---- replicas (replica_sync.py) -------------------------------------------------------------
    @property
    def registry(self) -> ReplicaRegistry:
        return self.replicas.registry

    @property
    def broadcaster(self) -> WeightBroadcaster | None:
        return self.replicas.broadcaster

    @property
    def confirmed(self) -> dict[str, int]:
        """Replica id -> the version it confirmed (push reply)."""
        return self.replicas.confirmed

    @property
    def push_stats(self) -> dict[str, float]:
        return self.replicas.push_stats

    def _live(self) -> list[ReplicaInfo]:
        return self.replicas.live()

    def _start_replicas(self) -> None:
        """Wait for replicas, then push our weights under a version newer than any they hold."""
        live = self.replicas.await_replicas(self.control, self.waiting)
        if live is None:
            return
        check_replica_caps(
            live, self.s.max_new_tokens, self.longest_prompt, self.s.episode_tokens() if self.s.tools else 0
        )
        new_version = self.replicas.fresh_version(live, self.version)
        if self.resumed_version is not None:
            # The restored weights get a fresh version; versions in between belong to the lost lineage.
            self.acct.version_aliases.append((self.resumed_version, new_version))
        self.learner.set_version(new_version)
        self._sync_replicas(live)

    def _sync_replicas(self, live: list[ReplicaInfo] | None = None) -> float:
        """Push the current weights to every live replica that does not hold them yet; seconds spent."""
        return self.replicas.push(self.version, self.learner.push_tensors, live)

    def _resync(self) -> None:
        """While groups are awaited, push to replicas that joined or restarted since the step began (every
        replica_sync.RESYNC_S)."""
        if self.replicas.resync_due():
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
        self.outcomes, self.failures, self.unscored = outcomes, Counter(), Counter()
        staleness: list[int] = []
        settled: list[tuple[str, str, queue_pb2.GroupRecord | None]] = []  # (task id, verdict, group): task/<type>/*
        judged: list[tuple[str, float, float | None]] = []  # difficulty buckets: (bucket, reward, accuracy) per group
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
                    settled.append((tid, "timeout", None))
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
            facts = facts_of(record, self.zero_variance_on, self.algo.reward_clip, steps=self.credit.steps)
            verdict = "duplicate" if record.group_id in kept_ids else triage(
                facts, self.acct, self.version, s.max_staleness, self.algo.skip_zero_variance, self.algo.group_size,
                s.probe_size,
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
                    self.failures[failure_reason(record, self.algo.group_size, s.probe_size)] += 1
                if verdict == "unscored":
                    self.unscored[unscored_reason(record, self.credit.steps)] += 1
                self.acct.resolve(record.group_id, verdict)
                self.reader.defer_ack(entry.entry_id)
            settled.append((record.group_id, verdict, record))
            if verdict in ("train", "zero_variance"):
                judged += self._judge_difficulty(record)
            self._on_resolved(quota, verdict)
        resolved = sum(v for k, v in outcomes.items() if k not in ("duplicate", "superseded", "regenerate"))
        # rollout/* describe what the policy sampled this step, not the subset the filters kept for the update.
        metrics = {**group_metrics(sampled), **group_spread(sampled, s.probe_size)}
        # Every verdict every step (0 when none): a Prometheus gauge keeps its last value, and a count from an
        # earlier step would read as this step's.
        metrics.update({f"groups/{k}": float(outcomes.get(k, 0)) for k in GROUP_VERDICTS})
        metrics["groups/zero_variance_fraction"] = outcomes.get("zero_variance", 0) / max(resolved, 1)
        metrics["groups/refills"] = float(quota.refills)
        metrics.update(spend_metrics(settled, s.probe_size))
        if s.probe_size:
            metrics["tasks/probed"] = float(self.publisher.take_probed())
        if staleness:
            metrics["staleness/mean"] = sum(staleness) / len(staleness)
            metrics["staleness/max"] = float(max(staleness))
        if self.task_types:
            metrics.update(self._task_metrics(settled))
        if self.publisher.difficulty is not None:
            tracker, n_rows = self.publisher.difficulty, len(self.rows)
            metrics.update(bucket_metrics(tracker, n_rows, self.publisher.take_skipped(), judged))
        return kept, metrics

    def _judge_difficulty(self, record: queue_pb2.GroupRecord) -> list[tuple[str, float, float | None]]:
        """Record a sampled group in the difficulty buckets (none kept: []); its (bucket before, mean reward, mean
        correctness or None) for the step's buckets/<bucket>/* metrics."""
        tracker = self.publisher.difficulty
        if tracker is None or not record.samples:
            return []
        scores = [correctness(sample) for sample in record.samples]
        bucket = tracker.observe(self.publisher.row_index(record.group_id), position_of(record.group_id)[0],
                                 self.step, scores)  # fmt: skip
        judged = [c for c in scores if c is not None]  # solved as rollout/accuracy counts it: a correctness of 1
        accuracy = sum(c >= SOLVED for c in judged) / len(judged) if len(judged) == len(scores) else None
        return [(bucket, sum(sample.reward for sample in record.samples) / len(record.samples), accuracy)]

    def _task_metrics(self, settled: list[tuple[str, str, queue_pb2.GroupRecord | None]]) -> dict[str, float]:
        """task/<type>/* of the step's settled tasks, each typed by the row its task id was made from."""
        typed: list[Settled] = [(self.publisher.row(tid).task_type, verdict, rec) for tid, verdict, rec in settled]
        return task_metrics(self.task_types, typed, zero_variance_on=self.zero_variance_on,
                            reward_clip=self.algo.reward_clip, steps=self.credit.steps)  # fmt: skip

    def _judge_failures(self) -> None:
        """Say why the step's groups failed (the rollout's reasons) or came back unscored (the reward service's);
        end the run when every group keeps failing."""
        if self.failures:
            log.warning("step %d: %d of %d group(s) failed: %s", self.step, sum(self.failures.values()),
                        resolved_groups(self.outcomes), describe_failures(self.failures))  # fmt: skip
        if self.unscored:
            self.last_unscored = self.unscored
            log.warning("step %d: %d of %d group(s) unscored, a sample had no reward (dropped, never trained on a "
                        "guess): %s", self.step, sum(self.unscored.values()), resolved_groups(self.outcomes),
                        describe_failures(self.unscored))  # fmt: skip
        self.failed_streak.add(self.outcomes, self.failures)

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
        outcome = [advantages[i * g : (i + 1) * g] for i in range(len(records))]
        per_token = self.credit.token_advantages(records, outcome, self.version, self.step)  # None: outcome credit
        samples = []
        for record, group_outcome, tokens in zip(records, outcome, per_token, strict=True):
            samples += to_samples(record, group_outcome, tokens)
        metrics = {**self.learner.step(samples), **self.credit.train_metrics(records)}
        out = {f"train/{k}": v for k, v in metrics.items()}
        # What grpo doctor's KL rule weighs a KL against: the β in effect and how old the reference is.
        out["train/beta"] = self.algo.beta
        out["train/steps_since_ref_refresh"] = float(
            steps_since_ref_refresh(self.learner.updates, self.algo.ref_refresh_steps or 0, self.algo.beta)
        )
        out.update(self.credit.metrics(records))  # e.g. VinePPO's value rollouts: their books and cost
        for entry_id, record in kept:
            self.acct.resolve(record.group_id, "trained")
            self.reader.defer_ack(entry_id)
        return out

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
            difficulty=None if self.publisher.difficulty is None else self.publisher.difficulty.to_state(),
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
                should_stop=lambda: self.control.stopping, sync_replicas=self._resync, per_task=bool(self.task_types),
            )  # fmt: skip
        finally:
            self.control.update(phase=self.phase)
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
            metrics={k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}, doctor=self.doctor.view(),
        )  # fmt: skip

    def _books(self) -> dict[str, Any]:
        """The task books for the status: published = trained + Σ dropped + in_flight. Duplicates and superseded
        groups settle no task, so they are counted beside the books, never in `dropped`."""
        a = self.acct
        return {"tasks_published": a.published, "groups_trained": a.trained, "dropped": dict(a.dropped),
                "in_flight": a.n_in_flight, "duplicates": a.duplicates, "superseded": a.superseded}  # fmt: skip


def steps_since_ref_refresh(updates: int, every: int, beta: float) -> int:
    """Updates since the reference model was last set to the policy (Learner._after_update refreshes it every
    `every` updates, and at the start); -1 when it is never refreshed (every 0) or there is none (β 0)."""
    return updates % every if every > 0 and beta > 0 else -1


def nothing_trained(steps: int, dropped: dict[str, int], unscored: Mapping[str, int] | None = None) -> str:
    """Why a run that updated the policy on no group is a failure, not a finished run with its starting weights
    (`unscored`: the reward service's reasons at the last step that had unscored groups)."""
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(dropped.items()) if n) or "none"
    hint = ""
    if dropped.get("zero_variance", 0) * 2 > sum(dropped.values()):
        hint = (": every sample of a group got the same reward, so no group had an advantage. Start from a model "
                "that sometimes solves the task (an SFT stage, as the demo's), or check that the reward varies")  # fmt: skip
    elif dropped.get("unscored", 0) * 2 > sum(dropped.values()) and unscored:
        hint = f": the reward service could not judge the samples ({describe_failures(unscored)})"
    return f"{steps} steps trained on no group (tasks dropped: {reasons}){hint}; no final model was written"
