"""`grpo status` on a staged run's output folder: which stages count as finished."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo.local.status import progress

STAGES: list[dict[str, Any]] = [{"mode": "sft"}, {"mode": "grpo"}, {"mode": "rejection_sampling"}]


def _finish(folder: Path, made: str) -> None:
    (folder / made).parent.mkdir(parents=True, exist_ok=True)
    (folder / made).write_text("{}")
    (folder / "stage.json").write_text("{}")


def test_a_rejection_sampling_stage_is_finished_by_its_data_not_a_model(tmp_path: Path) -> None:
    _finish(tmp_path / "stage-1-sft", "final/config.json")
    _finish(tmp_path / "stage-2-grpo", "final/config.json")
    rs = tmp_path / "stage-3-rejection_sampling"
    rs.mkdir()
    (rs / "stage.json").write_text("{}")  # its outcome without its data: not finished
    trainer: dict[str, Any] = {}
    progress(trainer, tmp_path, {"stages": STAGES})
    assert (trainer["finished"], trainer["stage"]) == (False, "3/3 rejection_sampling")
    (rs / "data.jsonl").write_text("")
    trainer = {}
    progress(trainer, tmp_path, {"stages": STAGES})
    assert trainer["finished"] is True


def test_a_model_stage_without_its_final_model_is_not_finished(tmp_path: Path) -> None:
    _finish(tmp_path / "stage-1-sft", "data.jsonl")  # an SFT stage's data.jsonl is not its model
    trainer: dict[str, Any] = {}
    progress(trainer, tmp_path, {"stages": STAGES[:1]})
    assert trainer["finished"] is False
