"""Build a GRPO run's parts from its settings, and resume them from the latest checkpoint: everything the loop
(run.py) runs on, made before it starts, so the loop can be handed parts a caller chose (a test's credit, ...).

What a resume restores, and where: the learner's weights and version (the checkpoint), the data cursor and the
tasks in flight (accounting.py), the difficulty buckets (difficulty.py), the ledger segment of the checkpoint's step
(ledger.py), and whether that step still owes its evaluation (a stop or a crash took it; metrics.jsonl says).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from grpo.algo import LossConfig
from grpo.common.queue import RunQueue, connect
from grpo.common.readiness import redis_check
from grpo.common.registry import ReplicaRegistry
from grpo.common.weights.broadcast import WeightBroadcaster
from grpo.trainer.accounting import Accounting
from grpo.trainer.assemble import build_learner, load_grpo_data, resolve_algo, task_spec
from grpo.trainer.checkpoint import Outcomes, latest_checkpoint, rewind
from grpo.trainer.config import TrainerSettings
from grpo.trainer.consumer import GroupReader
from grpo.trainer.control import RunControl
from grpo.trainer.credit import Credit, CreditParts, make_credit
from grpo.trainer.data import PromptRow
from grpo.trainer.difficulty import BucketRules, DifficultyTracker
from grpo.trainer.ledger import read_segment
from grpo.trainer.metrics import MetricsSink
from grpo.trainer.order import DataCursor
from grpo.trainer.publisher import Publisher, TaskSpec
from grpo.trainer.ranks import RankDriver
from grpo.trainer.redis_retry import RedisRetry, Retry
from grpo.trainer.replica_sync import ReplicaSync
from grpo.trainer.report import evaluated, last_row_at, read_metrics
from grpo.trainer.vine import ValueBooks, ValueRollouts
from grpo.trainer.waiting import WaitReporter

log = logging.getLogger(__name__)
CONSUMER = "trainer"  # one stable consumer name per run: a restarted trainer finds its pending list under it


@dataclass
class Resumed:
    """Where the loop starts: step 0 of a fresh run, or the checkpoint's step and what it owes."""

    step: int = 0
    version: int | None = None  # the restored weights' version (None: a fresh run)
    segment: tuple[int, Outcomes] = (-1, [])  # the ledger segment of the last checkpoint's step
    eval_owed: bool = False  # the start step's evaluation is still to do (the baseline, or one cut short)
    row: dict[str, Any] | None = None  # that step's logged row, when its evaluation is owed
    last_checkpoint_step: int = -1
    difficulty: dict[str, Any] | None = None  # the difficulty buckets' records the checkpoint kept


@dataclass
class RunParts:
    """Everything the GRPO loop runs on. build_run makes them from the settings; a test may swap one."""

    algo: LossConfig
    zero_variance_on: str  # what the zero-variance filter compares (algo's `auto` resolved)
    spec: TaskSpec
    rows: list[PromptRow]
    eval_rows: list[PromptRow]
    longest_prompt: int  # tokens: what every replica's context must hold
    queue: RunQueue
    retry: Retry  # every Redis call of the loop goes through it
    replicas: ReplicaSync
    waiting: WaitReporter
    reader: GroupReader
    learner: RankDriver
    acct: Accounting
    publisher: Publisher
    value_books: ValueBooks
    credit: Credit
    sink: MetricsSink
    resumed: Resumed


def build_run(
    settings: TrainerSettings,
    control: RunControl,
    prometheus_registry: CollectorRegistry | None = None,
    *,
    make_learner: Callable[[TrainerSettings, LossConfig], RankDriver] | None = None,
) -> RunParts:
    """Load the data and the model, connect to Redis (waiting out an outage), resume from the checkpoint
    `settings.resume` names, and open the metrics files; `control` gets the readiness check and the evaluations
    a resumed run already did. `make_learner`: what holds the weights instead of a trainable learner (a
    rejection-sampling stage's, which only pushes them: rejection_run.py)."""
    s = settings
    algo = resolve_algo(s)
    zero_variance_on = algo.zero_variance_basis()  # resolved (and checked) once, before anything loads
    spec = task_spec(s, algo)
    data = load_grpo_data(s, algo, spec, s.model)
    client = connect(s.redis_url)
    queue = RunQueue(client, s.run_id)
    control.readiness.add("redis", redis_check(s.redis_url))
    retry = RedisRetry(s.redis_outage_s, control)
    # A pod can start before Redis (or its DNS name) answers: wait for it as for any outage.
    retry(queue.ensure_groups, "creating the run's consumer groups")
    registry = ReplicaRegistry(client, s.run_id)
    broadcaster = (
        WeightBroadcaster(s.broadcast_address, s.broadcast_backend, s.broadcast_timeout_s)
        if s.weight_transport == "broadcast"
        else None
    )
    replicas = ReplicaSync(s, registry, retry, broadcaster)
    waiting = WaitReporter(queue, registry, s.redis_url)  # says what a long wait is for
    reader = GroupReader(queue, CONSUMER)
    learner = RankDriver(build_learner(s, algo), s.model) if make_learner is None else make_learner(s, algo)
    acct, cursor, resumed = resume(s, learner)
    if s.colocate is not None and make_learner is None:  # after the resume: the replica joins with those weights
        from grpo.trainer.colocated import colocate

        learner = replicas.colocated = colocate(s, learner)
    publisher = Publisher(queue, data.rows, spec, s.run_id, cursor, mixture=data.mixture, stage=s.stage,
                          difficulty=difficulty_tracker(s, resumed.difficulty, algo.group_size))  # fmt: skip
    s.output_dir.mkdir(parents=True, exist_ok=True)
    sink = open_metrics(s, control, resumed, bool(data.eval_rows), prometheus_registry)
    value_books = ValueBooks()
    values = ValueRollouts(
        publisher, reader, waiting, retry, value_books, should_stop=lambda: control.stopping,
        timeout_s=s.group_timeout_s, k=algo.vine_k, max_splits=algo.vine_max_splits,
    )  # fmt: skip
    return RunParts(
        algo=algo, zero_variance_on=zero_variance_on, spec=spec, rows=data.rows, eval_rows=data.eval_rows,
        longest_prompt=data.longest_prompt, queue=queue, retry=retry, replicas=replicas, waiting=waiting,
        reader=reader, learner=learner, acct=acct, publisher=publisher, value_books=value_books,
        credit=make_credit(algo, CreditParts(values)), sink=sink, resumed=resumed,
    )  # fmt: skip


def resume(s: TrainerSettings, learner: RankDriver) -> tuple[Accounting, DataCursor, Resumed]:
    """Load the checkpoint to resume from into `learner` (none: a fresh run) and rewind the ledger and the
    checkpoints to it; the books, the data cursor and where the loop starts."""
    ckpt_root, ledger_root = s.output_dir / "checkpoints", s.output_dir / "ledger"
    path = None if s.resume == "never" else latest_checkpoint(ckpt_root) if s.resume == "auto" else s.resume
    info = None if path is None else learner.load(path)
    # The ledger and checkpoints follow the one resumed from (a fresh run: a fresh ledger, no checkpoints).
    rewind(ckpt_root, ledger_root, info)
    if info is None:
        return Accounting(), DataCursor(seed=s.seed), Resumed()
    # A checkpoint from before checkpoints carried their segment: the ledger's copy is the one there is.
    outcomes = read_segment(ledger_root, info.step) if info.outcomes is None else info.outcomes
    acct = Accounting.from_state(info.inflight, time.monotonic())
    log.info("resumed at step %d, version %d, %d task(s) in flight", info.step, learner.version,
             acct.n_in_flight)  # fmt: skip
    resumed = Resumed(step=info.step, version=learner.version, segment=(info.step, outcomes),
                      last_checkpoint_step=info.step, difficulty=info.difficulty)  # fmt: skip
    return acct, DataCursor.from_state(info.data_cursor), resumed


def difficulty_tracker(
    s: TrainerSettings, state: dict[str, Any] | None, group_size: int = 0
) -> DifficultyTracker | None:
    """The difficulty buckets of a run that sets aside easy or hard prompts (or weighs buckets), with the records a
    checkpoint kept; None when no rule is on (no records are kept, none are written)."""
    rules = BucketRules(s.skip_solved_after, s.set_aside_after, s.revisit_after_epochs,
                        tuple(sorted(s.bucket_weights.items())), s.skip_flat_above, s.probe_size, s.probe_all,
                        group_size)  # fmt: skip
    if not rules.active:
        if state and state.get("records"):
            log.warning("the checkpoint holds difficulty buckets, but skip_solved_after, set_aside_after, "
                        "skip_flat_above, bucket_weights and probe_size are unset: no prompt is skipped or probed, and "
                        "the records are not kept")  # fmt: skip
        return None
    tracker = DifficultyTracker.from_state(rules, state, s.seed)
    log.info("difficulty buckets: skip after %d all-solved group(s), set aside after %d unsolved, or when a flat "
             "group is %.0f %% likely (0: off), back after %d epoch(s), weights %s, probe %d (%s); %d row(s) on "
             "record", rules.skip_solved_after, rules.set_aside_after, 100 * rules.skip_flat_above,
             rules.revisit_after_epochs, dict(rules.weights) or "none", rules.probe_size,
             "every task" if rules.probe_all else "where the record says it pays", len(tracker.records))  # fmt: skip
    return tracker


def open_metrics(
    s: TrainerSettings,
    control: RunControl,
    resumed: Resumed,
    has_eval: bool,
    prometheus_registry: CollectorRegistry | None,
) -> MetricsSink:
    """The metrics files, continued at the resumed step, and the evaluations already done (for the status).

    Sets whether the start step still owes its evaluation: due there and no eval/accuracy in its row (stopped
    mid-evaluation, or killed in it). The owed step's row is written again with the evaluation: the old one
    (and its TensorBoard events) is dropped so that step has one row."""
    metrics_path = s.output_dir / "metrics.jsonl"
    is_resume = resumed.version is not None
    row = last_row_at(metrics_path, resumed.step) if is_resume else None
    resumed.eval_owed = has_eval and evaluation_due(resumed.step, s) and not evaluated(row)
    resumed.row = row if resumed.eval_owed else None
    start_step = (resumed.step - 1 if resumed.eval_owed else resumed.step) if is_resume else -1
    sink = MetricsSink(
        tensorboard_dir=s.output_dir / "tensorboard",
        jsonl_path=metrics_path,
        prometheus_registry=prometheus_registry,
        wandb_project=s.wandb_project,
        wandb_run_name=s.run_id,
        run_config=s.run_record(),
        start_step=start_step,  # a fresh run (-1) starts fresh files, as the ledger
    )
    evaluations = [r for r in read_metrics(metrics_path) if "eval/accuracy" in r and r["step"] <= resumed.step]
    control.update(
        eval_history=tuple((r["step"], r["eval/accuracy"]) for r in evaluations),
        last_eval=eval_result(evaluations[-1]) if evaluations else None,  # a resumed run's, until its next one
    )
    return sink


def evaluation_due(step: int, s: TrainerSettings) -> bool:
    """Whether the run evaluates at `step` (given eval data): the baseline at 0, every eval_every, the last."""
    if step == 0:
        return s.eval_before_train
    return bool(s.eval_every and step % s.eval_every == 0) or step == s.steps


def eval_result(row: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """(step, eval/* metrics) of a metrics row that holds a finished evaluation: the status's last_eval."""
    return int(row["step"]), {k: float(v) for k, v in row.items() if k.startswith("eval/")}
