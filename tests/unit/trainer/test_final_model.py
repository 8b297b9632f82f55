"""The final model: written whole or not at all, and written on restart when a trainer stopped before it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import pytest
import torch
from prometheus_client import CollectorRegistry

from grpo.common.net import free_port
from grpo.trainer.assemble import build_learner
from grpo.trainer.checkpoint import list_checkpoints, save_checkpoint
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.export import save_final_model
from grpo.trainer.service import finished_run, run_mode


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def settings(tmp_path: Path, mode: Literal["grpo", "sft"]) -> TrainerSettings:
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "What is 1 + 1?", "gold": "2", "response": "2"}) + "\n")
    return TrainerSettings(
        mode=mode, train_data=data, eval_data=data, output_dir=tmp_path / "run", steps=2, prompts_per_step=1,
        checkpoint_every=1, redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_outage_s=1,
    )  # fmt: skip


def run(s: TrainerSettings) -> str:
    control = RunControl(s.run_id, s.steps)
    run_mode(s, control, CollectorRegistry())
    return control.status().phase


def test_an_sft_run_stopped_before_its_final_model_writes_it_on_restart(tmp_path: Path) -> None:
    s = settings(tmp_path, "sft")
    assert run(s) == "done"
    final, checkpoints = s.output_dir / "final", s.output_dir / "checkpoints"
    weights = (final / "model.safetensors").read_bytes()
    shutil.rmtree(final)  # killed after the checkpoint of the last step, before final/ was complete
    metrics, kept = (s.output_dir / "metrics.jsonl").read_text(), sorted(checkpoints.iterdir())
    assert finished_run(s) is None
    assert run(s) == "done"
    assert (final / "model.safetensors").read_bytes() == weights  # the last checkpoint's weights
    assert (final / "tokenizer.json").is_file()
    assert sorted(checkpoints.iterdir()) == kept and (s.output_dir / "metrics.jsonl").read_text() == metrics
    assert finished_run(s) is not None  # now it is finished


def test_a_grpo_run_stopped_after_its_final_evaluation_writes_its_final_model_without_redis(tmp_path: Path) -> None:
    """The last step's row (its final evaluation) is logged: no Redis or replica is needed to write final/. (Its
    row missing, the evaluation is redone on replicas: test_trainer_service.py.)"""
    s = settings(tmp_path, "grpo")
    save_checkpoint(s.output_dir / "checkpoints", build_learner(s), step=s.steps, data_cursor={}, inflight={})
    (s.output_dir / "metrics.jsonl").write_text(json.dumps({"step": s.steps, "eval/accuracy": 0.5}) + "\n")
    assert run(s) == "done"  # the Redis URL points at a port nobody listens on
    assert (s.output_dir / "final" / "model.safetensors").is_file()
    assert finished_run(s) is not None


def test_an_sft_run_started_afresh_sets_the_old_runs_checkpoints_aside(tmp_path: Path) -> None:
    """--resume never (or an older checkpoint) in SFT: the later checkpoints are the old lineage's, and the next
    --resume auto must not pick them up (GRPO does the same: test_checkpoint.py)."""
    s = settings(tmp_path, "sft")
    assert run(s) == "done"
    root = s.output_dir / "checkpoints"
    assert [p.name for p in list_checkpoints(root)] == ["step-00000001", "step-00000002"]
    assert run(s.model_copy(update={"resume": str(root / "step-00000001")})) == "done"  # step 2 trained again
    assert [p.name for p in list_checkpoints(root)] == ["step-00000001", "step-00000002"]
    assert (root / "abandoned-step-00000002" / "trainer_state.json").is_file()  # set aside, not overwritten
    assert run(s.model_copy(update={"resume": "never", "steps": 1})) == "done"
    assert [p.name for p in list_checkpoints(root)] == ["step-00000001"]  # written afresh: no step 2 to resume
    assert (root / "abandoned-step-00000001").is_dir() and (root / "abandoned-step-00000002-2").is_dir()


def test_a_final_model_cut_short_leaves_no_final_folder(tmp_path: Path) -> None:
    learner = build_learner(settings(tmp_path, "sft"))
    final = tmp_path / "final"
    no_tokenizer = tmp_path / "empty"
    no_tokenizer.mkdir()
    with pytest.raises(ValueError):
        save_final_model(learner, str(no_tokenizer), final)  # fails after the weights were written
    assert not final.exists()  # so the run does not count as finished
    save_final_model(learner, "tiny", final)
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "final", "train.jsonl"]  # no .partial left
