"""SFT (R1's cold start) on the same trainer: (prompt, response) rows, loss on the response tokens only."""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry

from grpo.common import prompts
from grpo.trainer.assemble import build_learner
from grpo.trainer.checkpoint import latest_checkpoint, set_aside_after
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.data import PromptRow, load_sources
from grpo.trainer.export import load_tokenizer
from grpo.trainer.learner import SftPair
from grpo.trainer.metrics import MetricsSink
from grpo.trainer.order import DataCursor, Mixture, mixture_of, take
from grpo.trainer.ranks import RankDriver
from grpo.trainer.sources import data_sources

log = logging.getLogger(__name__)


def encode_prompt(tokenizer: Any, row: PromptRow, apply_chat_template: bool) -> list[int]:
    """Token ids exactly as the rollout service encodes the same prompt (so SFT and RL see one format)."""
    prompt = row.prompt if isinstance(row.prompt, str) else (row.messages() or [])
    return prompts.encode_prompt(tokenizer, prompt, apply_chat_template)


def to_pair(tokenizer: Any, row: PromptRow, apply_chat_template: bool) -> SftPair:
    """The row's prompt and response as token ids. A tool episode's segments are encoded one by one and joined (as
    the rollout appends a tool's result as its own tokens), its tool segments masked out of the loss."""
    segments = [("assistant", row.response or "")] if isinstance(row.response, str | None) else list(row.response)
    response: list[int] = []
    mask: list[int] = []
    for role, content in segments:
        ids = list(tokenizer.encode(content, add_special_tokens=False))
        response += ids
        mask += [int(role == "assistant")] * len(ids)
    eos = tokenizer.eos_token_id
    if eos is not None and response[-1:] != [int(eos)]:  # the model must learn to stop (once, if the data has it)
        response.append(int(eos))
        mask.append(1)
    episode = not isinstance(row.response, str | None)
    return SftPair(encode_prompt(tokenizer, row, apply_chat_template), response, mask if episode else None)


def run_sft(
    settings: TrainerSettings, control: RunControl, prometheus_registry: CollectorRegistry | None = None
) -> None:
    """`steps` SFT updates of `prompts_per_step` pairs each; checkpoints and resume as in GRPO."""
    tokenizer = load_tokenizer(settings.model)
    sources = data_sources(settings)
    rows = load_sources([s.path for s in sources], need_response=True, tokenizer=tokenizer)
    mixture = mixture_of(rows, sources, settings.task_weights)
    learner = RankDriver(build_learner(settings), settings.model)
    try:
        _train(settings, control, learner, [to_pair(tokenizer, r, settings.apply_chat_template) for r in rows],
               mixture, prometheus_registry)  # fmt: skip
    finally:
        learner.close()  # releases the follower ranks, also after a failure


def _train(
    s: TrainerSettings,
    control: RunControl,
    learner: RankDriver,
    pairs: list[SftPair],
    mixture: Mixture | None,
    registry: CollectorRegistry | None,
) -> None:
    root = s.output_dir / "checkpoints"
    cursor, step = DataCursor(seed=s.seed), 0
    path = None if s.resume == "never" else latest_checkpoint(root) if s.resume == "auto" else s.resume
    if path is not None:
        info = learner.load(path)
        cursor, step = DataCursor.from_state(info.data_cursor), info.step
        log.info("resumed at step %d from %s", step, path)
    set_aside_after(root, step if path is not None else -1)  # as GRPO's `rewind`; SFT keeps no ledger
    control.update(phase="sft", total_steps=s.steps, step=step)
    sink = MetricsSink(tensorboard_dir=s.output_dir / "tensorboard", jsonl_path=s.output_dir / "metrics.jsonl",
                       prometheus_registry=registry, wandb_project=s.wandb_project, wandb_run_name=s.run_id,
                       run_config=s.run_record(),
                       start_step=step if path is not None else -1)  # fmt: skip

    def checkpoint() -> str:
        return str(learner.save(root, step=step, data_cursor=cursor.to_state(), keep_last=s.keep_checkpoints))

    try:
        while step < s.steps and not control.stopping:
            for fut in control.take_checkpoint_requests():
                fut.set_result((checkpoint(), step))
            picks, cursor = take(cursor, len(pairs), s.prompts_per_step, mixture)
            metrics = {f"sft/{k}": v for k, v in learner.sft_step([pairs[i] for _, i in picks]).items()}
            step += 1
            sink.log(step, metrics)
            control.update(step=step, metrics=metrics)
            if step % s.checkpoint_every == 0:
                checkpoint()
            if step % 10 == 0:
                log.info("sft step %d/%d loss %.4f", step, s.steps, metrics["sft/sft_loss"])
        if step % s.checkpoint_every != 0:
            checkpoint()
        if step >= s.steps:
            learner.save_final(s.output_dir / "final")
    finally:
        sink.close()
    control.fail_pending_requests("the run ended")
    control.update(phase="done" if step >= s.steps else "stopped")
