"""Staged runs (R1: SFT, then GRPO): each stage's settings, folders and model chain, and their outcomes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from grpo.trainer.config import TrainerSettings
from grpo.trainer.stages import plan_stages, read_outcome, stage_outcome


def settings(tmp_path: Path, stages: list[dict[str, object]], **extra: object) -> TrainerSettings:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "gold": "2"}\n')
    return TrainerSettings(train_data=data, output_dir=tmp_path / "run", stages=stages, **extra)  # type: ignore[arg-type]


def test_each_stage_overrides_the_run_and_chains_the_models(tmp_path: Path) -> None:
    s = settings(
        tmp_path,
        [{"mode": "sft", "steps": 30, "lr": 2e-3, "train_data": str(tmp_path / "sft.jsonl")}, {"mode": "grpo"}],
        steps=200, lr=2e-4, model="tiny",
    )  # fmt: skip
    sft, grpo = plan_stages(s)
    assert (sft.mode, sft.settings.steps, sft.settings.lr, sft.settings.model) == ("sft", 30, 2e-3, "tiny")
    assert sft.folder == tmp_path / "run" / "stage-1-sft" and sft.settings.train_data == tmp_path / "sft.jsonl"
    assert (grpo.mode, grpo.settings.steps, grpo.settings.lr) == ("grpo", 200, 2e-4)
    assert grpo.settings.model == str(sft.folder / "final")  # GRPO starts from the SFT model
    assert grpo.folder == tmp_path / "run" / "stage-2-grpo" and grpo.settings.train_data == tmp_path / "train.jsonl"
    own = plan_stages(settings(tmp_path, [{"mode": "sft"}, {"mode": "grpo", "model": "some/hub-id"}]))
    assert own[1].settings.model == "some/hub-id"


@pytest.mark.parametrize(
    ("stages", "needle"),
    [
        ([{"steps": 3}], "stages[1]: needs mode"),
        ([{"mode": "sft"}, {"mode": "dpo"}], "stages[2]: needs mode"),
        ([{"mode": "sft", "output_dir": "/x"}], "['output_dir'] are set for the whole run"),
        ([{"mode": "sft"}, {"mode": "grpo", "lr": -1}], "stages[2] (grpo): lr"),
        ([{"mode": "sft", "no_such_knob": 1}], "stages[1] (sft): no_such_knob"),
    ],
)
def test_a_bad_stage_fails_at_start_naming_it(tmp_path: Path, stages: list[dict[str, object]], needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        settings(tmp_path, stages)
    assert needle in str(err.value)


def test_outcomes_come_from_the_stage_metrics(tmp_path: Path) -> None:
    sft, grpo = plan_stages(settings(tmp_path, [{"mode": "sft", "steps": 3}, {"mode": "grpo", "steps": 40}]))
    assert read_outcome(sft) is None  # nothing run yet
    sft.folder.mkdir(parents=True)
    rows = [{"step": i, "sft/sft_loss": loss} for i, loss in enumerate([2.0, 1.0, 0.5], 1)]
    (sft.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = stage_outcome(sft, 12.0)
    assert (out["sft_loss_first"], out["sft_loss_last"], out["seconds"]) == (2.0, 0.5, 12.0)
    (sft.folder / "stage.json").write_text(json.dumps(out))
    assert read_outcome(sft) is None  # an outcome without the final model is not a finished stage
    (sft.folder / "final").mkdir()
    (sft.folder / "final" / "config.json").write_text("{}")
    assert read_outcome(sft) == out

    grpo.folder.mkdir(parents=True)
    evals = [(0, 0.4), (10, 0.5), (20, 0.7), (30, 0.8), (40, 0.9)]
    (grpo.folder / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "eval/accuracy": a}) + "\n" for s, a in evals)
    )
    out = stage_outcome(grpo, 60.0)
    assert out["eval_accuracy_before"] == 0.4  # the step-0 evaluation
    assert out["eval_accuracy_after"] == pytest.approx((0.7 + 0.8 + 0.9) / 3)  # the last three, not the best
    assert out["eval_accuracy_gain"] == pytest.approx(0.4)
