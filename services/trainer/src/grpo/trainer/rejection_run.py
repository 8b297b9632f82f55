"""The rejection-sampling stage's loop: GrpoRun's publishing, collection, task books and checkpoints, with the update
replaced by "select and append" (the rules are rejection.py's).

What differs from a GRPO run, and why:

* The stage's model is pushed to the replicas once, under a version newer than any they hold, and never changes: a
  `SamplerWeights` holds it instead of a learner (no optimizer, no reference model, nothing to train). DeepSpeed
  follower ranks skip the stage; rank 0 samples alone.
* Groups are never dropped for zero variance (a prompt whose every answer is right is the best data), nothing is
  refilled, nothing is evaluated; G is rs_samples.
* The run has ceil(prompts / prompts_per_step) steps, prompts being rs_prompts or every train_data row once; the
  last step publishes only what is left.
* Each step appends the kept answers of its groups to data.jsonl. A checkpoint stores the file's length and the
  tally with the task books; a resume cuts the file back to that length, and the groups consumed after the
  checkpoint (still unacked in Redis, their tasks in flight in the restored books) are selected again: every
  prompt's rows are in the file once, however the trainer was stopped.
* The end writes rs_summary.json (renamed in last: with data.jsonl it marks the stage finished); no final/ model.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from grpo.common.doctor import Finding
from grpo.trainer.accounting import batches_to_publish
from grpo.trainer.build import build_run
from grpo.trainer.checkpoint import CheckpointInfo, load_checkpoint, save_checkpoint
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.data import DataError, PromptRow
from grpo.trainer.errors import RunError
from grpo.trainer.live_doctor import LiveDoctor
from grpo.trainer.ranks import RankDriver
from grpo.trainer.rejection import (
    DATA_FILE,
    SUMMARY_FILE,
    PluginError,
    Rules,
    Tally,
    candidates,
    required_components,
    rows_problem,
    rs_finished,
    rules_from,
    select,
    sft_row,
)
from grpo.trainer.run import GrpoRun, Kept

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def sampling_settings(settings: TrainerSettings) -> TrainerSettings:
    """The settings GrpoRun's machinery runs the stage under: G = rs_samples, every group kept whatever its variance
    (no probe), no refill, no reference model, outcome credit, no held-out evaluation."""
    return settings.model_copy(
        update={
            "group_size": settings.rs_samples,
            "probe_size": 0,
            "skip_zero_variance": False,
            "refill_zero_variance": False,
            "beta": 0.0,
            "credit": "outcome",
            "eval_data": None,
            "eval_before_train": False,
        }
    )


def prompts_to_sample(settings: TrainerSettings, n_rows: int) -> int:
    """rs_prompts, or every row once."""
    return settings.rs_prompts or n_rows


def stage_steps(prompts: int, prompts_per_step: int) -> int:
    return max(1, math.ceil(prompts / prompts_per_step))


class _OneRank:
    """The backend a checkpoint asks its learner for: one process (followers never take part in this stage)."""

    rank = 0
    world_size = 1

    def barrier(self) -> None:
        return None


class DataBook:
    """data.jsonl and the tally of what went into it; their state is checkpointed together with the task books."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / DATA_FILE
        self.summary_path = folder / SUMMARY_FILE
        self.tally = Tally()
        self.began = time.monotonic()  # this process's share of the stage's wall time starts here

    def start_fresh(self) -> None:
        """A stage started from nothing: an earlier attempt's rows (never checkpointed) and summary go."""
        self.summary_path.unlink(missing_ok=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"")
        self.tally = Tally()

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Write rows at the end of the file (made durable by the next checkpoint's `state`)."""
        if not rows:
            return
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))

    def seconds(self) -> float:
        """The stage's wall time so far: earlier processes' (checkpointed) and this one's."""
        return self.tally.seconds + time.monotonic() - self.began

    def state(self) -> dict[str, Any]:
        """The file's length (flushed to disk first) and the tally, for a checkpoint."""
        self.path.touch(exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        tally = self.tally.to_state()
        tally["seconds"] = self.seconds()
        return {"data_bytes": self.path.stat().st_size, "tally": tally}

    def restore(self, state: dict[str, Any]) -> None:
        """Cut data.jsonl back to the checkpoint's length: the rows written after it come again from the groups
        consumed after it, which Redis still holds for this trainer."""
        size = int(state["data_bytes"])
        have = self.path.stat().st_size if self.path.is_file() else 0
        if have < size:
            raise RunError(
                f"{self.path} holds {have} bytes, but the checkpoint being resumed wrote {size}: the file was changed "
                "or replaced since. Restore it, or start the stage again (resume: never, or another output_dir)"
            )
        with self.path.open("r+b") as f:
            f.truncate(size)
        self.summary_path.unlink(missing_ok=True)  # a summary is only ever of the whole stage
        self.tally = Tally.from_state(state["tally"])
        self.began = time.monotonic()
        if have > size:
            log.info("data.jsonl cut back from %d to %d bytes (the rows after the checkpoint are selected again)", have,
                     size)  # fmt: skip

    def write_summary(self, extra: dict[str, Any]) -> dict[str, Any]:
        """rs_summary.json, written beside and renamed in: it marks the stage finished only once whole."""
        summary = self.tally.summary(self.seconds(), data=str(self.path), **extra)
        tmp = self.summary_path.with_name(SUMMARY_FILE + ".partial")
        tmp.write_text(json.dumps(summary, indent=1, ensure_ascii=False))
        tmp.rename(self.summary_path)
        return summary


class SamplerWeights(RankDriver):
    """The stage's model where a GRPO run has its learner: its weights are pushed to the replicas, never trained.

    Its checkpoints hold no model (the stage's model never changes): the version, and the data file's length and
    tally (DataBook.state)."""

    def __init__(self, model: str, book: DataBook) -> None:  # no learner: RankDriver's is never built
        from grpo.trainer.learner.policy import load_causal_lm, push_state_dict

        self.model = model
        self.world = 1
        self.backend = _OneRank()
        self.book = book
        self._version = 0
        self.weights: dict[str, torch.Tensor] = push_state_dict(load_causal_lm(model).eval())

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = version

    def step(self, samples: Any) -> dict[str, float]:
        raise RuntimeError("a rejection-sampling stage trains nothing")

    def push_tensors(self) -> dict[str, Any]:
        return self.weights

    def save(self, root: Path, **kwargs: Any) -> Path:
        return save_checkpoint(root, self, **kwargs)

    def load(self, path: Path | str) -> CheckpointInfo:
        return load_checkpoint(path, self)

    def save_final(self, folder: Path) -> None:
        raise RuntimeError("a rejection-sampling stage writes data.jsonl, not a model")

    def close(self) -> None:
        self.weights = {}

    # ---- what save_checkpoint / load_checkpoint ask of a learner (checkpoint.Checkpointable) ----
    def save_state(self, directory: Path) -> dict[str, Any]:
        return {"version": self._version, "rejection_sampling": self.book.state()}

    def load_state(self, directory: Path, state: dict[str, Any]) -> None:
        if "rejection_sampling" not in state:
            raise RunError(f"{directory} is not a rejection-sampling checkpoint (no data file state in it); resume a "
                           "rejection-sampling run from its own checkpoints")  # fmt: skip
        self._version = int(state["version"])
        self.book.restore(state["rejection_sampling"])


class _NoDoctor(LiveDoctor):
    """grpo doctor's rules read a training run's trends (a flat reward, no zero-variance groups): a stage that trains
    nothing would set them off for what it is."""

    def observe(self, step: int, metrics: Mapping[str, object]) -> list[Finding]:
        return []


class RejectionRun(GrpoRun):
    """One rejection-sampling run (or stage); `run()` blocks until every prompt was sampled, a stop or an error."""

    phase = "rejection_sampling"

    def __init__(
        self, settings: TrainerSettings, control: RunControl, prometheus_registry: CollectorRegistry | None = None
    ) -> None:
        try:
            self.rules: Rules = rules_from(settings)
        except ValueError as exc:  # a plug-in that cannot be imported
            raise RunError(str(exc)) from None
        self.book = DataBook(settings.output_dir)
        base = sampling_settings(settings)
        parts = build_run(
            base, control, prometheus_registry, make_learner=lambda s, _: SamplerWeights(s.model, self.book)
        )
        self.prompts = prompts_to_sample(settings, len(parts.rows))
        steps = stage_steps(self.prompts, settings.prompts_per_step)
        super().__init__(base.model_copy(update={"steps": steps}), control, prometheus_registry, parts=parts)
        self.doctor = _NoDoctor(self.algo, self.s.max_staleness)
        self.added = {"overlong"} if self.spec.overlong_buffer_tokens > 0 else set()  # build_task adds it
        problem = rows_problem(self.rules, self.rows, self.added)
        if problem:
            self.close()
            raise DataError(problem)
        if self.resumed_version is None:
            self.book.start_fresh()
        self._decode: Any = None
        self._before = (0, 0, 0, 0)
        log.info("rejection sampling: %d prompts × %d samples in %d steps; keep at most %d per prompt -> %s",
                 self.prompts, settings.rs_samples, steps, settings.rs_keep_per_prompt, self.book.path)  # fmt: skip

    # ---- replicas: the stage's model, under a version a restart can vouch for -------------------------------
    def _start_replicas(self) -> None:
        """Push the stage's model, then checkpoint at step 0 once: a trainer killed before its first checkpoint
        would otherwise restart afresh, and every group its push sampled would be stale to the new version (its
        prompts then keep nothing); resumed from this checkpoint, the two versions are known to hold one model."""
        super()._start_replicas()
        if self.version > 0 and self.last_checkpoint_step < 0:
            self._checkpoint()

    # ---- publishing: the last step takes only what is left ----------------------------------------------------
    def _admit(self) -> None:
        s = self.s
        for _ in range(batches_to_publish(self.acct.batches_published, self.step, s.max_staleness, s.steps)):
            k = min(s.prompts_per_step, self.prompts - self.acct.batches_published * s.prompts_per_step)
            if k <= 0:
                return
            publish = partial(self.publisher.publish, k, self.version, self.acct.batches_published, self.acct)
            self._retry(publish, "publishing tasks")
            self.acct.batches_published += 1

    # ---- collection: a dropped group is a prompt with nothing kept --------------------------------------------
    def _collect(self) -> tuple[Kept | None, dict[str, float]]:
        t = self.book.tally
        self._before = (t.prompts, t.sampled, t.kept, t.none_kept)  # the step's rs/* metrics count from here
        mark = len(self.acct.recent)
        kept, metrics = super()._collect()
        for tid, outcome in self.acct.recent[mark:]:  # the tasks the collection dropped (failed, unscored, ...)
            if outcome != "trained":
                self.book.tally.add_dropped(self._row(tid).row_id or tid, self.s.rs_samples, outcome)
        return kept, metrics

    # ---- the "update": select and append ------------------------------------------------------------------------
    def _train(self, kept: Kept) -> dict[str, float]:
        rows: list[dict[str, Any]] = []
        for _, record in kept:
            row = self._row(record.group_id)
            cands = candidates(record, row, self._decoder(record))
            try:
                chosen = select(cands, self.rules, required_components(self.rules, row.components() | self.added))
            except PluginError as exc:
                raise RunError(str(exc)) from exc
            self.book.tally.add(row.row_id or record.group_id, len(cands), len(chosen.kept), chosen.rejected)
            rows += [sft_row(c, model=self.s.model, stage=self.s.stage) for c in chosen.kept]
        self.book.append(rows)
        for entry_id, record in kept:
            self.acct.resolve(record.group_id, "trained")
            self.reader.defer_ack(entry_id)
        t = self.book.tally
        prompts, sampled, kept_n, none = (n - m for n, m in zip((t.prompts, t.sampled, t.kept, t.none_kept),
                                                                self._before, strict=True))  # fmt: skip
        return {
            "rs/prompts": float(prompts),
            "rs/sampled": float(sampled),
            "rs/kept": float(kept_n),
            "rs/prompts_with_none": float(none),
            "rs/keep_rate": kept_n / sampled if sampled else 0.0,
            "rs/kept_total": float(t.kept),
        }

    def _row(self, tid: str) -> PromptRow:
        return self.publisher.row(tid)

    def _decoder(self, record: Any) -> Any:
        """The tokenizer's decode, for an episode's segments (loaded once, when the first episode comes)."""
        if not any(s.token_mask for s in record.samples):
            return None
        if self._decode is None:
            from grpo.trainer.export import load_tokenizer

            tokenizer = load_tokenizer(self.s.model)
            # Special tokens kept: a chat template's markup around a tool's result is encoded back by SFT as it was.
            self._decode = lambda ids: str(tokenizer.decode(ids, skip_special_tokens=False))
        return self._decode

    # ---- the end: the summary instead of a final model --------------------------------------------------------
    def _save_final(self) -> None:
        t = self.book.tally
        if t.kept == 0:
            reasons = ", ".join(f"{reason} {n}" for reason, n in t.rejected.most_common(5)) or "none"
            raise RunError(f"rejection sampling kept none of {t.sampled} samples of {t.prompts} prompts (rejected: "
                           f"{reasons}); no data was written. Check the rs_* filters and rs_pass_score, or start "
                           "from a model that solves some of the prompts")  # fmt: skip
        s = self.s
        summary = self.book.write_summary(
            {
                "model": s.model,
                "stage": s.stage,
                "steps": s.steps,
                "settings": {
                    "rs_samples": s.rs_samples, "rs_prompts": s.rs_prompts, "rs_keep_per_prompt": s.rs_keep_per_prompt,
                    "rs_require": s.rs_require, "rs_pass_score": s.rs_pass_score,
                    "rs_shortest_first": s.rs_shortest_first, "rs_filters": s.rs_filters,
                    "rs_max_tokens": s.rs_max_tokens, "temperature": s.temperature, "top_p": s.top_p,
                    "max_new_tokens": s.max_new_tokens,
                },
            }
        )  # fmt: skip
        log.info("rejection sampling done: kept %d of %d samples (%d of %d prompts with none) -> %s",
                 summary["kept"], summary["sampled"], summary["prompts_with_none"], summary["prompts"],
                 self.book.path)  # fmt: skip


def run_rejection_sampling(
    settings: TrainerSettings, control: RunControl, prometheus_registry: CollectorRegistry | None = None
) -> None:
    """One rejection-sampling run (or stage): resumed, or found finished (its data and summary written)."""
    if settings.resume == "auto" and rs_finished(settings.output_dir):
        log.warning("run %r has finished rejection sampling: %s and %s are written; nothing to do. To sample again "
                    "use --resume never or another --output-dir", settings.run_id, settings.output_dir / DATA_FILE,
                    SUMMARY_FILE)  # fmt: skip
        control.update(phase="done")
        return
    run = RejectionRun(settings, control, prometheus_registry)
    try:
        run.run()
    finally:
        run.close()


def check_rs_data(settings: TrainerSettings, tokenizer_model: str) -> None:
    """Start-up check of a rejection-sampling run's (or stage's) data: the rows as GRPO reads them, and each must
    have something to pass (rows_problem); DataError naming the row. Also resolves the rs_filters plug-ins."""
    from grpo.trainer.assemble import load_grpo_data, resolve_algo, task_spec

    base = sampling_settings(settings)
    algo = resolve_algo(base, warn=False)
    spec = task_spec(base, algo)
    try:
        rules = rules_from(settings)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    data = load_grpo_data(base, algo, spec, tokenizer_model)
    problem = rows_problem(rules, data.rows, {"overlong"} if spec.overlong_buffer_tokens > 0 else ())
    if problem:
        raise DataError(problem)


# ---- DeepSpeed ranks: rank 0 samples alone; the followers wait for it without a collective ----------------------
# A collective would time out (DeepSpeed's process group: 30 min) in a stage that samples for hours, so rank 0 says
# how the stage ended through the process group's key-value store, which the followers poll.
FOLLOWER_POLL_S = 1.0


def _stage_key(stage: int) -> str:
    """Unique per launch: torchrun's restarts share the store, and an earlier attempt's key must not be read."""
    return f"grpo/rejection_sampling/restart-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/stage-{stage}"


def rank_store() -> Any:
    """The process group's store, the group formed first if no earlier stage formed it (every rank calls this)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():  # as DeepSpeedBackend forms it, which a later stage then reuses
        import deepspeed

        from grpo.trainer.learner.backends.deepspeed_backend import skip_shm_comm_build

        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            skip_shm_comm_build()
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    return dist.distributed_c10d._get_default_store()


def tell_followers(stage: int, finished: bool) -> None:
    """Rank 0, when a rejection-sampling stage ends (finished, stopped or failed): release the followers."""
    rank_store().set(_stage_key(stage), "done" if finished else "stopped")


def await_rank0(stage: int) -> bool:
    """A follower rank at a rejection-sampling stage: wait until rank 0 ends it; True when it finished it."""
    store = rank_store()
    key = _stage_key(stage)
    log.info("rank 0 runs rejection-sampling stage %d alone; waiting for it", stage)
    while not store.check([key]):
        time.sleep(FOLLOWER_POLL_S)
    return bool(store.get(key) == b"done")
