"""A GRPO run's summary.json, PNG plots and report.md, from the trainer's metrics.jsonl (pure I/O, no services).

`eval_accuracy_after` is the accuracy over the last three evaluations (no cherry-picked peak), each weighted by
the problems it judged (pooled correct / judged); `eval_accuracy_before` is the evaluation of the starting model
(e.g. after SFT) before the first GRPO update: the trainer's own step-0 evaluation (`eval_before_train`), or given
by the caller. Each says how many problems were judged out of how many were asked (`eval_*_judged`,
`eval_*_problems`): accuracy is correct / judged, and failed, missing or unjudged problems are not in it.

A multi-task run (its data hold several task types) also logs task/<type>/* every step and eval/<type>/* at each
evaluation; `per_task` in summary.json gives, per type, the last step's values and the held-out numbers before and
after (pooled the same way), and report.md a table of them.
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


def evaluated(row: dict[str, Any] | None) -> bool:
    """Whether a metrics row holds a finished evaluation: one cut short by a stop (eval/stopped), or never logged
    (the trainer was killed in it), has no eval/accuracy, and the run evaluates that step again on resume."""
    return row is not None and "eval/accuracy" in row


def last_row_at(path: Path, step: int) -> dict[str, Any] | None:
    """The last metrics row logged for `step`, None when there is none."""
    return next((r for r in reversed(read_metrics(path)) if r["step"] == step), None)


def series(rows: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) for every row that has a finite numeric `key`."""
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and math.isfinite(v):
            out.append((int(r["step"]), float(v)))
    return out


def eval_counts(row: dict[str, Any]) -> tuple[int | None, int | None]:
    """(problems judged, problems asked) of an evaluation row; None where the row predates those counts."""
    counts = [row.get(f"eval/{k}") for k in ("judged", "unjudged", "failed", "missing")]
    if not all(isinstance(c, int | float) for c in counts):
        return None, None
    return int(counts[0]), int(sum(counts))  # type: ignore[arg-type]


def pooled_accuracy(rows: Sequence[dict[str, Any]]) -> float | None:
    """Accuracy over several evaluations, each weighted by the problems it judged (correct / judged, pooled): an
    evaluation that judged half its problems counts half. The plain mean where a row lacks eval/judged."""
    accs = [float(r["eval/accuracy"]) for r in rows]
    judged = [eval_counts(r)[0] for r in rows]
    if not accs:
        return None
    if any(j is None for j in judged):
        return mean(accs)
    total = sum(j for j in judged if j is not None)
    return sum(a * (j or 0) for a, j in zip(accs, judged, strict=True)) / total if total else None


def _sum(values: Sequence[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(
    rows: Sequence[dict[str, Any]],
    *,
    eval_before: float | None,
    wall_seconds: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json: before/after accuracy (the last three evals, pooled) with the problems each judged, reward
    first vs last, history. `eval_before` (the caller's own measure of the starting model) replaces the step-0
    evaluation; its judged count is then unknown (None)."""
    evals = [r for r in rows if isinstance(r.get("eval/accuracy"), int | float) and math.isfinite(r["eval/accuracy"])]
    before_row = evals[0] if evals and int(evals[0]["step"]) == 0 and eval_before is None else None
    if before_row is not None:
        eval_before = float(before_row["eval/accuracy"])
    before_judged, before_problems = eval_counts(before_row) if before_row is not None else (None, None)
    evals = [r for r in evals if int(r["step"]) > 0]
    rewards = [v for _, v in series(rows, "rollout/reward_mean")]
    window = max(1, min(10, len(rewards) // 4))
    last = evals[-3:]
    after = pooled_accuracy(last)
    history = [{"step": 0, "accuracy": eval_before, "judged": before_judged, "problems": before_problems}]
    history = history if eval_before is not None else []
    history += [{"step": int(r["step"]), "accuracy": float(r["eval/accuracy"]), "judged": eval_counts(r)[0],
                 "problems": eval_counts(r)[1]} for r in evals]  # fmt: skip
    steps = [int(r["step"]) for r in rows]  # a step whose groups were all dropped is a step too
    summary: dict[str, Any] = {
        "eval_accuracy_before": eval_before,
        "eval_accuracy_after": after,
        "eval_accuracy_gain": (after - eval_before) if after is not None and eval_before is not None else None,
        "eval_before_judged": before_judged,
        "eval_before_problems": before_problems,
        "eval_after_judged": _sum([eval_counts(r)[0] for r in last]),
        "eval_after_problems": _sum([eval_counts(r)[1] for r in last]),
        "eval_after_evaluations": len(last),
        "grpo_steps": max(steps, default=0),
        "wall_seconds": round(wall_seconds, 1),
        "reward_first_steps": mean(rewards[:window]),
        "reward_last_steps": mean(rewards[-window:]),
        "reward_window_steps": window,
        "eval_history": history,
    }
    tasks = per_task(rows)
    if tasks:
        summary["per_task"] = tasks
    summary.update(extra or {})
    return summary


TASK_KEYS = ("groups", "reward_mean", "accuracy", "zero_variance_fraction")  # task/<type>/<key>, every step
EVAL_TASK_KEYS = ("accuracy", "reward_mean")  # eval/<type>/<key>, with eval/<type>/judged and /problems


def task_plots(types: Sequence[str]) -> tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...]:
    """A multi-task run's plots, as PLOTS: each type's training reward, and its held-out accuracy or reward."""
    if not types:
        return ()
    return (
        ("task_reward", "Training reward per task", "reward (mean over the step's samples)",
         tuple((f"task/{t}/reward_mean", t) for t in types)),
        ("task_eval", "Held-out per task", "accuracy, or reward mean (rows without a correctness component)",
         tuple((f"eval/{t}/{k}", f"{t} ({k.replace('_', ' ')})") for t in types for k in EVAL_TASK_KEYS)),
    )  # fmt: skip


def task_types(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The task types a multi-task run logged (task/<type>/groups each step, eval/<type>/problems each evaluation)."""
    found = set()
    for row in rows:
        for key in row:
            if key.startswith("task/") and key.endswith("/groups"):
                found.add(key[len("task/") : -len("/groups")])
            elif key.startswith("eval/") and key.endswith("/problems"):
                found.add(key[len("eval/") : -len("/problems")])
    return sorted(found)


def pooled(rows: Sequence[dict[str, Any]], key: str, judged_key: str) -> float | None:
    """`key` over the rows that have it, each weighted by its `judged_key` count (as pooled_accuracy)."""
    pairs = [(float(r[key]), float(r.get(judged_key) or 0)) for r in rows if isinstance(r.get(key), int | float)]
    total = sum(j for _, j in pairs)
    return sum(v * j for v, j in pairs) / total if total else None


def per_task(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task type: the last logged task/<type>/* values and the groups settled over the run; the held-out
    accuracy (rows with a correctness component) and reward mean (rows without one) of the step-0 evaluation
    ("before") and of the last three evaluations after it pooled by problems judged ("after", as the overall
    accuracy), with their judged counts. An evaluation a stop cut short (eval/stopped) counts for neither."""
    finished = [r for r in rows if r.get("eval/stopped") == 0]
    before = next((r for r in finished if int(r["step"]) == 0), None)
    last_evals = [r for r in finished if int(r["step"]) > 0][-3:]
    out: dict[str, dict[str, Any]] = {}
    for task_type in task_types(rows):
        task, ev = f"task/{task_type}", f"eval/{task_type}"
        entry: dict[str, Any] = {f"last_{k}": last_value(rows, f"{task}/{k}") for k in TASK_KEYS}
        entry["groups_total"] = int(sum(v for _, v in series(rows, f"{task}/groups")))
        for k in EVAL_TASK_KEYS:
            entry[f"eval_{k}_before"] = pooled([before], f"{ev}/{k}", f"{ev}/judged") if before else None
            entry[f"eval_{k}_after"] = pooled(last_evals, f"{ev}/{k}", f"{ev}/judged")
        entry["eval_before_judged"] = _count(before, f"{ev}/judged") if before else None
        entry["eval_after_judged"] = _sum([_count(r, f"{ev}/judged") for r in last_evals])
        entry["eval_problems"] = _count(last_evals[-1] if last_evals else before, f"{ev}/problems")
        out[task_type] = entry
    return out


def last_value(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    """The value of the last row that has a finite `key`, None when none has."""
    points = series(rows, key)
    return points[-1][1] if points else None


def _count(row: dict[str, Any] | None, key: str) -> int | None:
    value = (row or {}).get(key)
    return int(value) if isinstance(value, int | float) else None


def plot_all(rows: Sequence[dict[str, Any]], out_dir: Path, eval_before: float | None = None) -> list[Path]:
    """One PNG per entry of PLOTS that has data; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, title, ylabel, keys in (*PLOTS, *task_plots(task_types(rows))):
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


def _judged(judged: int | None, problems: int | None, evaluations: int = 1) -> str:
    if judged is None or problems is None:
        return ""
    over = f" over {evaluations} evaluations" if evaluations > 1 else ""
    return f" ({judged} of {problems} problems judged{over})"


def report_markdown(summary: dict[str, Any], plots: Sequence[Path]) -> str:
    """report.md: the headline numbers, what they mean, then the plots."""
    lines = [
        f"# GRPO report — {summary.get('run_id', '')}",
        "",
        f"* held-out accuracy before GRPO (after SFT): **{_pct(summary['eval_accuracy_before'])}**"
        + _judged(summary.get("eval_before_judged"), summary.get("eval_before_problems")),
        f"* held-out accuracy after GRPO (the last three evaluations or fewer, pooled): "
        f"**{_pct(summary['eval_accuracy_after'])}**"
        + _judged(
            summary.get("eval_after_judged"),
            summary.get("eval_after_problems"),
            summary.get("eval_after_evaluations", 1),
        ),
        f"* GRPO steps: {summary['grpo_steps']}, wall time: {summary['wall_seconds']:.0f} s",
        f"* mean training reward, first {summary['reward_window_steps']} steps → last "
        f"{summary['reward_window_steps']}: {_num(summary['reward_first_steps'])} → {_num(summary['reward_last_steps'])}",
        "",
        "The only learning signal during GRPO is the verifiable reward (the reward service's components).",
        "Evaluation decodes held-out prompts that never appear in training (greedy unless eval_temperature > 0).",
        "Accuracy is correct / judged: a problem whose group failed, never came or could not be judged is left out",
        "of it (an infrastructure fault, not a wrong answer), and the counts above say how many were.",
        "",
    ]
    if summary.get("per_task"):
        lines += task_table(summary["per_task"])
    if summary.get("stages"):
        lines += ["## Stages", "", "| stage | mode | steps | seconds | outcome |", "|---|---|---|---|---|"]
        for st in summary["stages"]:
            lines.append(f"| {st['index']} | {st['mode']} | {st['steps']} | {st['seconds']:.0f} | {st['outcome']} |")
        lines.append("")
    for path in plots:
        lines += [f"## {path.stem.replace('_', ' ')}", "", f"![{path.stem}]({path.name})", ""]
    return "\n".join(lines)


def task_table(tasks: dict[str, dict[str, Any]]) -> list[str]:
    """report.md's per-task section: the last step's training numbers and held-out before → after per task type."""
    lines = [
        "## Per task", "",
        "| task type | groups (all steps) | reward (last step) | accuracy (last step) | zero-variance (last step) "
        "| held-out before → after |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for task_type, t in tasks.items():
        held_out = []
        if t["eval_accuracy_before"] is not None or t["eval_accuracy_after"] is not None:
            held_out.append(f"accuracy {_pct(t['eval_accuracy_before'])} → {_pct(t['eval_accuracy_after'])}")
        if t["eval_reward_mean_before"] is not None or t["eval_reward_mean_after"] is not None:
            held_out.append(f"reward {_num(t['eval_reward_mean_before'])} → {_num(t['eval_reward_mean_after'])}")
        judged = f" ({t['eval_after_judged']} judged)" if held_out and t["eval_after_judged"] is not None else ""
        zero = t["last_zero_variance_fraction"]
        lines.append(
            f"| {task_type} | {t['groups_total']} | {_num(t['last_reward_mean'])} | {_pct(t['last_accuracy'])} "
            f"| {_pct(zero)} | {'; '.join(held_out) or 'n/a'}{judged} |"
        )
    lines += [
        "",
        "Accuracy is the share of samples whose correctness component (math or code) is 1; rows without one (e.g.",
        "scored by a reward model) have the held-out reward mean instead. Zero-variance: the share of the step's",
        "groups of that type whose samples all got the same reward (no learning signal).",
        "",
    ]
    return lines


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
