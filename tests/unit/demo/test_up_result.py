"""The closing lines of `grpo up` and `grpo demo`, from whatever the run folder holds (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

from grpo.cli.main import closing_lines


def test_a_run_with_a_summary_ends_with_the_accuracy_and_the_files(tmp_path: Path) -> None:
    summary = {"eval_accuracy_before": 0.4, "eval_accuracy_after": 0.5, "eval_after_evaluations": 1,
               "grpo_steps": 2, "wall_seconds": 3.0}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "report.md").write_text("# report")
    text = closing_lines(tmp_path)
    assert "held-out accuracy: 40.0 % after SFT → 50.0 % after 2 GRPO steps (the last evaluation)" in text
    assert f"summary:     {tmp_path / 'summary.json'}" in text
    assert f"report:      {tmp_path / 'report.md'} (PNG plots beside it)" in text


def test_a_run_without_a_summary_still_says_where_its_results_are(tmp_path: Path) -> None:
    """A plain (non-staged) run wrote no summary.json until the trainer learned to: no accuracy, no failure."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "final").mkdir()
    text = closing_lines(tmp_path)
    assert "held-out accuracy" not in text and "summary:" not in text
    assert f"metrics:     {tmp_path / 'metrics.jsonl'}" in text and f"model:       {tmp_path / 'final'}" in text


def test_an_sft_only_summary_has_no_accuracy_line(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"run_id": "r", "stages": [{"index": 1, "mode": "sft"}]}))
    text = closing_lines(tmp_path)
    assert "held-out accuracy" not in text and f"summary:     {tmp_path / 'summary.json'}" in text
