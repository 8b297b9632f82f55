"""The demo's closing line says how many evaluations "after" pooled: the summary's count, not a fixed "three"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo.cli.main import accuracy_line


def _eval_row(step: int, accuracy: float) -> dict[str, object]:
    return {"step": step, "eval/accuracy": accuracy, "eval/judged": 100, "eval/unjudged": 0, "eval/failed": 0,
            "eval/missing": 0, "rollout/reward_mean": 1.0}  # fmt: skip


@pytest.mark.parametrize(
    ("eval_steps", "pooled"),
    [
        ([20, 40], "(mean of the last 2 evaluations)"),  # --quick: 40 steps, eval_every 20
        ([2], "(the last evaluation)"),  # --steps 2: only the final evaluation
        ([20, 40, 60, 80], "(mean of the last 3 evaluations)"),  # the default run pools three
    ],
)
def test_the_headline_names_the_evaluations_the_summary_pooled(
    tmp_path: Path, eval_steps: list[int], pooled: str
) -> None:
    """The summary comes from the demo's own report code over a metrics file, as at the end of `grpo demo`."""
    from grpo.demo.demo import demo_report

    rows = [_eval_row(0, 0.4)] + [_eval_row(step, 0.5) for step in eval_steps]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = demo_report(tmp_path, wall_seconds=12.0, extra={"run_id": "r"})
    line = accuracy_line(summary)
    steps = eval_steps[-1]
    assert line == f"held-out accuracy: 40.0 % after SFT → 50.0 % after {steps} GRPO steps {pooled}; 12 s in all"


def test_a_run_without_an_evaluation_after_grpo_says_so() -> None:
    summary = {"eval_accuracy_before": 0.4, "eval_accuracy_after": None, "eval_after_evaluations": 0,
               "grpo_steps": 1, "wall_seconds": 3.0}  # fmt: skip
    assert accuracy_line(summary) == (
        "held-out accuracy: 40.0 % after SFT → n/a after 1 GRPO steps (no evaluation after GRPO); 3 s in all"
    )
