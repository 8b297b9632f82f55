"""What `grpo` shows a person: the closing lines of a run (`grpo demo`, `grpo up`) and the short `grpo status`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _num(x: Any, spec: str = ".3f") -> str:
    return format(x, spec) if isinstance(x, int | float) else "–"


def pooled_evaluations(count: int) -> str:
    """What `eval_accuracy_after` pooled, in words: the report pools up to three evaluations, fewer in a short run."""
    if count <= 0:
        return "no evaluation after GRPO"
    return "the last evaluation" if count == 1 else f"mean of the last {count} evaluations"


def accuracy_line(summary: dict[str, Any]) -> str:
    """The demo's closing headline from its summary.json: before (after SFT) → after, and what "after" pooled.

    The count comes from the summary, not a fixed "three": `--quick` pools two evaluations and `--steps 2` one.
    """
    pooled = pooled_evaluations(int(summary.get("eval_after_evaluations") or 0))
    return (
        f"held-out accuracy: {_pct(summary['eval_accuracy_before'])} after SFT → {_pct(summary['eval_accuracy_after'])} "
        f"after {summary['grpo_steps']} GRPO steps ({pooled}); {summary['wall_seconds']:.0f} s in all"
    )


def has_accuracies(summary: dict[str, Any]) -> bool:
    """A summary with a GRPO result (an SFT-only run's has its stages alone)."""
    return all(k in summary for k in ("eval_accuracy_before", "eval_accuracy_after", "grpo_steps", "wall_seconds"))


def closing_lines(run_dir: Path) -> str:
    """The lines a finished run ends with: the accuracies and where summary.json, report.md and TensorBoard's logs
    are; a run without a summary (a plain run before the trainer wrote one) names its metrics and model instead."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    lines = []
    if isinstance(summary, dict):
        if has_accuracies(summary):
            lines.append(accuracy_line(summary))
        lines.append(f"summary:     {run_dir / 'summary.json'}")
    if (run_dir / "report.md").is_file():
        lines.append(f"report:      {run_dir / 'report.md'} (PNG plots beside it)")
    if not isinstance(summary, dict):
        if (run_dir / "metrics.jsonl").is_file():
            lines.append(f"metrics:     {run_dir / 'metrics.jsonl'}")
        if (run_dir / "final").is_dir():
            lines.append(f"model:       {run_dir / 'final'}")
    if (run_dir / "tensorboard").is_dir():
        lines.append(f"tensorboard: tensorboard --logdir {run_dir / 'tensorboard'}")
    elif any(run_dir.glob("stage-*/tensorboard")):  # a staged run's: one per stage, which TensorBoard finds
        lines.append(f"tensorboard: tensorboard --logdir {run_dir}")
    return "\n".join(lines or [f"run folder:  {run_dir}"]) + "\n"


def status_view(shown: dict[str, Any]) -> str:
    """`grpo status` for a person: a dozen lines of one stack (`--json` has everything)."""
    rows: list[tuple[str, str]] = [("run", f"{shown['run_id']}  {shown['run_dir']}")]
    rows.append(("processes", ", ".join(f"{p['name']} {'up' if p['alive'] else 'gone'}" for p in shown["processes"])))
    trainer = shown.get("trainer")
    if trainer is not None:
        rows += trainer_rows(trainer, shown.get("last_metrics") or {})
        rows += doctor_rows(shown.get("doctor") or [], alive=bool(trainer.get("alive")))
    summary = shown.get("summary")
    if summary is not None:
        if has_accuracies(summary):
            rows.append(("result", accuracy_line(summary)))
        rows.append(("summary", str(summary["path"])))
    rows += redis_rows(shown)
    if trainer is not None and trainer.get("error"):
        rows.append(("error", str(trainer["error"])))
        if trainer.get("log"):
            rows.append(("log", str(trainer["log"])))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows) + "\n"


def trainer_rows(trainer: dict[str, Any], metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """Phase, stage and step; reward and accuracy of the last step; the last evaluation; the books and drops."""
    step = f"step {trainer.get('step') or 0}" + (f" / {trainer['total_steps']}" if trainer.get("total_steps") else "")
    stage = f"stage {trainer['stage']}   " if trainer.get("stage") else ""
    rows = [("phase", f"{trainer.get('phase') or 'unknown'}   {stage}{step}")]
    if "rollout/reward_mean" in metrics or "rollout/accuracy" in metrics:
        rows.append(("reward", f"{_num(metrics.get('rollout/reward_mean'))} (mean of the last step's groups), "
                               f"train accuracy {_num(metrics.get('rollout/accuracy'))}"))  # fmt: skip
    history = trainer.get("eval_history") or []
    if history:
        last, first = history[-1], history[0]
        before = f" (before GRPO: {_num(first.get('accuracy'))})" if first.get("step") == 0 and len(history) > 1 else ""
        rows.append(("last eval", f"step {last.get('step')}: accuracy {_num(last.get('accuracy'))}{before}"))
    elif "eval/accuracy" in metrics:
        rows.append(("last eval", f"step {metrics.get('step', '?')}: accuracy {_num(metrics['eval/accuracy'])}"))
    if trainer.get("tasks_published") is not None:
        dropped = trainer.get("dropped") or {}
        drops = ", ".join(f"{reason} {n}" for reason, n in sorted(dropped.items())) or "none"
        rows.append(("tasks", f"{trainer['tasks_published']} published, {trainer.get('groups_trained')} trained, "
                              f"{trainer.get('in_flight')} in flight; dropped: {drops}"))  # fmt: skip
    return rows


def doctor_rows(findings: list[dict[str, str]], *, alive: bool) -> list[tuple[str, str]]:
    """One line per symptom the trainer's live doctor reports: its rule, the symptom and the remedy (the evidence,
    the metric and its numbers, is in `--json` and in `grpo doctor RUN_DIR`). Of a trainer that has exited, the
    findings it last reported."""
    last = "" if alive else "(last reported) "
    return [("doctor", f"{last}{f.get('rule')}: {f.get('symptom')}; remedy: {f.get('remedy')}") for f in findings]


def redis_rows(shown: dict[str, Any]) -> list[tuple[str, str]]:
    """The live replicas and the queues' backlog, or why Redis could not say."""
    if "redis_error" in shown:
        return [("redis", f"{shown['redis_url']}: {shown['redis_error']}")]
    replicas = ", ".join(f"{r['replica_id']} (weights v{r['weight_version']}, {r['tasks_done']} tasks, "
                         f"{r['tasks_failed']} failed)" for r in shown.get("replicas", []))  # fmt: skip
    queues = shown.get("queues", {})
    backlog = ", ".join(f"{name} {q.get('lag', 0)} waiting, {q.get('pending', 0)} taken" for name, q in queues.items())
    return [("replicas", replicas or "none live"), ("queues", backlog or "–")]
