"""SFT (R1's cold start) on the same trainer: (prompt, response) rows, loss on the response tokens only."""

from __future__ import annotations

import logging
from typing import Any

from grpo.trainer.assemble import learner_config, require_single_process, resolve_algo
from grpo.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.data import DataCursor, PromptRow, load_rows, take
from grpo.trainer.export import load_tokenizer, save_final_model
from grpo.trainer.learner import Learner, SftPair
from grpo.trainer.metrics import MetricsSink

log = logging.getLogger(__name__)


def encode_prompt(tokenizer: Any, row: PromptRow, apply_chat_template: bool) -> list[int]:
    """Token ids exactly as the rollout service encodes the same prompt (so SFT and RL see one format)."""
    messages = row.messages()
    if isinstance(row.prompt, str):
        if not apply_chat_template:
            return list(tokenizer.encode(row.prompt, add_special_tokens=False))
        messages = [{"role": "user", "content": row.prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def to_pair(tokenizer: Any, row: PromptRow, apply_chat_template: bool) -> SftPair:
    response = list(tokenizer.encode(row.response or "", add_special_tokens=False))
    if tokenizer.eos_token_id is not None:
        response.append(int(tokenizer.eos_token_id))  # the model must learn to stop
    return SftPair(encode_prompt(tokenizer, row, apply_chat_template), response)


def run_sft(settings: TrainerSettings, control: RunControl, prometheus_registry: Any = None) -> None:
    """`steps` SFT updates of `prompts_per_step` pairs each; checkpoints and resume as in GRPO."""
    s = settings
    assert s.train_data is not None
    rows = load_rows(s.train_data, need_response=True)
    tokenizer = load_tokenizer(s.model)
    learner = Learner(learner_config(s, resolve_algo(s).with_overrides(beta=0.0)))
    require_single_process(learner)
    root = s.output_dir / "checkpoints"
    cursor, step = DataCursor(seed=s.seed), 0
    path = None if s.resume == "never" else latest_checkpoint(root) if s.resume == "auto" else s.resume
    if path is not None:
        info = load_checkpoint(path, learner)
        cursor, step = DataCursor.from_state(info.data_cursor), info.step
    control.update(phase="sft", total_steps=s.steps, step=step)
    sink = MetricsSink(tensorboard_dir=s.output_dir / "tensorboard", jsonl_path=s.output_dir / "metrics.jsonl",
                       prometheus_registry=prometheus_registry)  # fmt: skip

    def checkpoint() -> str:
        return str(save_checkpoint(root, learner, step=step, data_cursor=cursor.to_state(),
                                   keep_last=s.keep_checkpoints))  # fmt: skip

    while step < s.steps and not control.stopping:
        for fut in control.take_checkpoint_requests():
            fut.set_result((checkpoint(), step))
        picks, cursor = take(cursor, len(rows), s.prompts_per_step)
        metrics = learner.sft_step([to_pair(tokenizer, rows[i], s.apply_chat_template) for _, i in picks])
        step += 1
        metrics = {f"sft/{k}": v for k, v in metrics.items()}
        sink.log(step, metrics)
        control.update(step=step, metrics=metrics)
        if step % s.checkpoint_every == 0:
            checkpoint()
        if step % 10 == 0:
            log.info("sft step %d/%d loss %.4f", step, s.steps, metrics["sft/sft_loss"])
    checkpoint()
    if step >= s.steps:
        save_final_model(learner, s.model, s.output_dir / "final")
    control.fail_pending_requests("the run ended")
    control.update(phase="done" if step >= s.steps else "stopped")
    sink.close()
