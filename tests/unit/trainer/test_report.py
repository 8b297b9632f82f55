"""summary.json, plots and report.md from a metrics JSONL written the way the trainer's MetricsSink writes it."""

from __future__ import annotations

import json
from pathlib import Path

from grpo.trainer.report import read_metrics, summarize, write_report


def _metrics_file(run_dir: Path, steps: int = 40) -> None:
    lines = []
    for step in range(1, steps + 1):
        row = {"step": step, "time": 1.0, "rollout/reward_mean": 1.0 + step / steps, "rollout/accuracy": step / steps / 2,
               "rollout/response_len_mean": 16.0, "rollout/response_len_max": 18.0, "train/kl": 1e-4 * step,
               "time/wait_rollouts_s": 0.5, "train/train_s": 0.3, "time/push_s": 0.05, "train/loss": 0.1}  # fmt: skip
        if step % 10 == 0:
            row["eval/accuracy"] = {10: 0.40, 20: 0.50, 30: 0.60, 40: 0.70}[step]
        lines.append(json.dumps(row))
    lines.append('{"step": 41, "rollout/reward_me')  # a line cut by a crash is skipped
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_after_is_the_mean_of_the_last_three_evals(tmp_path: Path) -> None:
    _metrics_file(tmp_path)
    s = summarize(read_metrics(tmp_path / "metrics.jsonl"), eval_before=0.3, wall_seconds=12.34)
    assert abs(s["eval_accuracy_after"] - 0.6) < 1e-9  # (0.5 + 0.6 + 0.7) / 3, not the 0.7 peak
    assert abs(s["eval_accuracy_gain"] - 0.3) < 1e-9
    assert s["grpo_steps"] == 40 and s["wall_seconds"] == 12.3
    assert s["eval_history"][0] == {"step": 0, "accuracy": 0.3} and len(s["eval_history"]) == 5
    assert s["reward_last_steps"] > s["reward_first_steps"]


def test_write_report_makes_summary_plots_and_markdown(tmp_path: Path) -> None:
    _metrics_file(tmp_path)
    summary = write_report(tmp_path, eval_before=0.3, wall_seconds=60.0, extra={"run_id": "r1"})
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    for name in ("reward", "accuracy", "kl", "length", "step_time"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    md = (tmp_path / "report.md").read_text()
    assert "30.0 %" in md and "60.0 %" in md and "![kl](kl.png)" in md


def test_no_metrics_gives_an_empty_but_valid_summary(tmp_path: Path) -> None:
    summary = write_report(tmp_path, eval_before=0.2, wall_seconds=1.0)
    assert summary["eval_accuracy_after"] is None and summary["grpo_steps"] == 0
    assert [p.name for p in tmp_path.glob("*.png")] == ["accuracy.png"]  # just the before-GRPO point
