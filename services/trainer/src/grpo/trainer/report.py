"""A GRPO run's summary.json, PNG plots and report.md, from the trainer's metrics.jsonl (pure I/O, no services).

`eval_accuracy_after` is the mean of the last three evaluations (no cherry-picked peak);
`eval_accuracy_before` is the evaluation of the starting model (e.g. after SFT) before the first GRPO
update: given by the caller, or the trainer's own step-0 evaluation (`eval_before_train`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (title, y label, [(metric key, legend)]) for each plot; a plot with no data is skipped.
PLOTS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("reward", "Training reward", "reward (mean over the step's groups)",
     (("rollout/reward_mean", "total"), ("rollout/reward/math_mean", "accuracy (math)"),
      ("rollout/reward/format_mean", "format"))),
    ("accuracy", "Accuracy", "fraction correct",
     (("eval/accuracy", "held-out eval (greedy)"), ("rollout/accuracy", "training samples (T=1)"))),
    ("kl", "KL to the SFT (reference) model", "KL per token (the run's kl_kind estimator)",
     (("train/kl", "KL"),)),
    ("length", "Response length", "tokens", (("rollout/response_len_mean", "mean"), ("rollout/response_len_max", "max"))),
    ("step_time", "Step time split", "seconds per step",
     (("time/wait_rollouts_s", "waiting for rollouts"), ("train/train_s", "update"), ("time/push_s", "weight push"))),
)  # fmt: skip


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The JSONL records (one per step); unreadable lines are skipped (a crash may cut the last one)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def series(rows: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) for every row that has a finite numeric `key`."""
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and math.isfinite(v):
            out.append((int(r["step"]), float(v)))
    return out


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(
    rows: Sequence[dict[str, Any]],
    *,
    eval_before: float | None,
    wall_seconds: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json: before/after accuracy (mean of the last three evals), reward first vs last, history."""
    evals = series(rows, "eval/accuracy")
    if eval_before is None and evals and evals[0][0] == 0:
        eval_before = evals[0][1]
    evals = [(s, v) for s, v in evals if s > 0]
    rewards = [v for _, v in series(rows, "rollout/reward_mean")]
    window = max(1, min(10, len(rewards) // 4))
    after = mean([v for _, v in evals[-3:]])
    history = [{"step": 0, "accuracy": eval_before}] if eval_before is not None else []
    history += [{"step": s, "accuracy": v} for s, v in evals]
    steps = [int(r["step"]) for r in rows]  # a step whose groups were all dropped is a step too
    summary: dict[str, Any] = {
        "eval_accuracy_before": eval_before,
        "eval_accuracy_after": after,
        "eval_accuracy_gain": (after - eval_before) if after is not None and eval_before is not None else None,
        "grpo_steps": max(steps, default=0),
        "wall_seconds": round(wall_seconds, 1),
        "reward_first_steps": mean(rewards[:window]),
        "reward_last_steps": mean(rewards[-window:]),
        "reward_window_steps": window,
        "eval_history": history,
    }
    summary.update(extra or {})
    return summary


def plot_all(rows: Sequence[dict[str, Any]], out_dir: Path, eval_before: float | None = None) -> list[Path]:
    """One PNG per entry of PLOTS that has data; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, title, ylabel, keys in PLOTS:
        lines = [(label, series(rows, key)) for key, label in keys]
        if name == "accuracy" and eval_before is not None:
            lines[0] = (lines[0][0], [(0, eval_before), *[pt for pt in lines[0][1] if pt[0] > 0]])
        lines = [(label, pts) for label, pts in lines if pts]
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        for label, pts in lines:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, marker="o" if len(pts) < 30 else None)
        ax.set(title=title, xlabel="GRPO step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def report_markdown(summary: dict[str, Any], plots: Sequence[Path]) -> str:
    """report.md: the headline numbers, what they mean, then the plots."""
    lines = [
        f"# GRPO report — {summary.get('run_id', '')}",
        "",
        f"* held-out accuracy before GRPO (after SFT): **{_pct(summary['eval_accuracy_before'])}**",
        f"* held-out accuracy after GRPO (mean of the last three evaluations): **{_pct(summary['eval_accuracy_after'])}**",
        f"* GRPO steps: {summary['grpo_steps']}, wall time: {summary['wall_seconds']:.0f} s",
        f"* mean training reward, first {summary['reward_window_steps']} steps → last "
        f"{summary['reward_window_steps']}: {_num(summary['reward_first_steps'])} → {_num(summary['reward_last_steps'])}",
        "",
        "The only learning signal during GRPO is the verifiable reward (the reward service's components).",
        "Evaluation decodes held-out prompts that never appear in training (greedy unless eval_temperature > 0).",
        "",
    ]
    if summary.get("stages"):
        lines += ["## Stages", "", "| stage | mode | steps | seconds | outcome |", "|---|---|---|---|---|"]
        for st in summary["stages"]:
            lines.append(f"| {st['index']} | {st['mode']} | {st['steps']} | {st['seconds']:.0f} | {st['outcome']} |")
        lines.append("")
    for path in plots:
        lines += [f"## {path.stem.replace('_', ' ')}", "", f"![{path.stem}]({path.name})", ""]
    return "\n".join(lines)


def write_report(
    run_dir: Path,
    *,
    eval_before: float | None,
    wall_seconds: float,
    extra: dict[str, Any] | None = None,
    out_dir: Path | None = None,
) -> dict[str, Any]:
    """From run_dir's metrics.jsonl, write summary.json, the PNGs and report.md into out_dir (default run_dir)."""
    out_dir = out_dir or run_dir
    rows = read_metrics(run_dir / "metrics.jsonl")
    summary = summarize(rows, eval_before=eval_before, wall_seconds=wall_seconds, extra=extra)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    plots = plot_all(rows, out_dir, summary["eval_accuracy_before"])
    (out_dir / "report.md").write_text(report_markdown(summary, plots))
    return summary
