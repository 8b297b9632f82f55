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
    # the caller's before (its own measure): how many problems it judged is not known
    assert s["eval_history"][0] == {"step": 0, "accuracy": 0.3, "judged": None, "problems": None}
    assert len(s["eval_history"]) == 5
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


def _eval_row(step: int, accuracy: float, judged: int, missing: int = 0) -> str:
    """An evaluation row as evaluate() logs it, out of 10 problems (the rest failed)."""
    return json.dumps({"step": step, "eval/accuracy": accuracy, "eval/judged": judged, "eval/unjudged": 0,
                       "eval/missing": missing, "eval/failed": 10 - judged - missing})  # fmt: skip


def test_before_and_after_say_how_many_problems_they_judged_and_after_weights_by_them(tmp_path: Path) -> None:
    """eval/accuracy is correct / judged: an evaluation where most groups failed must not count like a full one,
    and the report must say 2 of 10 were judged, not just 100 %."""
    rows = [
        _eval_row(0, 1.0, judged=2, missing=8),
        _eval_row(10, 0.5, 10),
        _eval_row(20, 1.0, 2),
        _eval_row(30, 0.5, 8),
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    summary = write_report(tmp_path, eval_before=None, wall_seconds=1.0)
    assert summary["eval_accuracy_before"] == 1.0
    assert (summary["eval_before_judged"], summary["eval_before_problems"]) == (2, 10)
    assert summary["eval_accuracy_after"] == (5 + 2 + 4) / 20  # pooled correct / judged, not (0.5 + 1 + 0.5) / 3
    assert (summary["eval_after_judged"], summary["eval_after_problems"]) == (20, 30)
    assert summary["eval_history"][1] == {"step": 10, "accuracy": 0.5, "judged": 10, "problems": 10}
    md = (tmp_path / "report.md").read_text()
    assert "100.0 %** (2 of 10 problems judged)" in md and "(20 of 30 problems judged over 3 evaluations)" in md
