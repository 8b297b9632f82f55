"""A staged run (R1: cold-start SFT, then GRPO) in one trainer process, resumable between and within stages.

Stage i runs as an ordinary sft or grpo run in output_dir/stage-<i>-<mode>, on the previous stage's
final model unless it names its own. A finished stage leaves stage.json (its outcome) beside its
final/ model; a restarted trainer skips those stages and resumes the current one from its
checkpoints. The run's summary.json and report.md (with plots) go to output_dir after every stage; a run without
stages writes the same files at its end, as a run of one stage (`write_single_report`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.trainer.config import TrainerSettings, stage_settings
from grpo.trainer.control import RunControl
from grpo.trainer.report import read_metrics, summarize, write_report

log = logging.getLogger(__name__)
OUTCOME_FILE = "stage.json"


@dataclass(frozen=True)
class Stage:
    index: int  # 1-based
    settings: TrainerSettings

    @property
    def mode(self) -> str:
        return self.settings.mode

    @property
    def folder(self) -> Path:
        return self.settings.output_dir


def plan_stages(settings: TrainerSettings) -> list[Stage]:
    """Each stage's settings; a stage without `model` starts from the previous stage's final model."""
    stages: list[Stage] = []
    for i, raw in enumerate(settings.stages, 1):
        values = dict(raw)
        if i > 1 and "model" not in values:
            values["model"] = str(stages[-1].folder / "final")
        stages.append(Stage(i, stage_settings(settings, values, i)))
    return stages


def read_outcome(stage: Stage) -> dict[str, Any] | None:
    """The finished stage's outcome, or None while it is not finished (no final model or no stage.json)."""
    path = stage.folder / OUTCOME_FILE
    if not (path.is_file() and (stage.folder / "final" / "config.json").is_file()):
        return None
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def stage_outcome(stage: Stage, seconds: float) -> dict[str, Any]:
    """What a finished stage achieved, from its metrics.jsonl."""
    rows = read_metrics(stage.folder / "metrics.jsonl")
    times = [r["time"] for r in rows if isinstance(r.get("time"), int | float)]
    if len(times) > 1:  # the stage's whole span, across restarts (`seconds` is this process's share)
        seconds = max(seconds, times[-1] - times[0])
    out: dict[str, Any] = {"index": stage.index, "mode": stage.mode, "steps": stage.settings.steps,
                           "seconds": round(seconds, 1), "folder": str(stage.folder)}  # fmt: skip
    if stage.mode == "sft":
        losses = [r["sft/sft_loss"] for r in rows if isinstance(r.get("sft/sft_loss"), int | float)]
        out["sft_loss_first"], out["sft_loss_last"] = (losses[0], losses[-1]) if losses else (None, None)
        out["outcome"] = f"SFT loss {_fmt(out['sft_loss_first'])} → {_fmt(out['sft_loss_last'])}"
    else:
        summary = summarize(rows, eval_before=None, wall_seconds=seconds)
        for key in ("eval_accuracy_before", "eval_accuracy_after", "eval_accuracy_gain", "eval_history"):
            out[key] = summary[key]
        out["outcome"] = (
            f"held-out accuracy {_pct(summary['eval_accuracy_before'])} → {_pct(summary['eval_accuracy_after'])}"
        )
    return out


def run_stages(settings: TrainerSettings, control: RunControl, run_one: Callable[[TrainerSettings], None]) -> None:
    """Run the stages not finished yet, in order; stops early (resumable) when the run is asked to stop."""
    stages = plan_stages(settings)
    outcomes: list[dict[str, Any]] = []
    for stage in stages:
        done = read_outcome(stage)
        if done is not None:
            log.info("stage %d (%s) finished earlier: %s", stage.index, stage.mode, done.get("outcome"))
            outcomes.append(done)
            continue
        log.info("stage %d/%d (%s) → %s, model %s", stage.index, len(stages), stage.mode, stage.folder,
                 stage.settings.model)  # fmt: skip
        control.update(stage=f"{stage.index}/{len(stages)} {stage.mode}", stages=tuple(outcomes))
        began = time.monotonic()
        run_one(stage.settings)
        if control.status().phase != "done":
            return  # stopped (or failed) inside the stage: a restart resumes it from its checkpoints
        outcome = stage_outcome(stage, time.monotonic() - began)
        (stage.folder / OUTCOME_FILE).write_text(json.dumps(outcome, indent=1))
        log.info("stage %d (%s) done: %s", stage.index, stage.mode, outcome["outcome"])
        outcomes.append(outcome)
        control.update(stages=tuple(outcomes))
        write_run_report(settings, stages, outcomes, sum(o["seconds"] for o in outcomes))
    control.update(phase="done", stages=tuple(outcomes))  # also when every stage had finished before


def write_run_report(
    settings: TrainerSettings, stages: list[Stage], outcomes: list[dict[str, Any]], seconds: float
) -> None:
    """summary.json + report.md (plots from the last GRPO stage's metrics) in the run's output_dir."""
    last_grpo = next((s for s in reversed(stages[: len(outcomes)]) if s.mode == "grpo"), None)
    extra = {"run_id": settings.run_id, "stages": outcomes}
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    if last_grpo is None:
        (settings.output_dir / "summary.json").write_text(json.dumps(extra, indent=1))
        return
    write_report(last_grpo.folder, eval_before=None, wall_seconds=seconds, extra=extra, out_dir=settings.output_dir)


def write_single_report(settings: TrainerSettings, seconds: float) -> None:
    """A run without stages ends as a one-stage run does: summary.json with its outcome as the one stage and, for
    GRPO, report.md with the plots, in output_dir (it was the only kind of run that left no report)."""
    stage = Stage(1, settings)
    outcome = stage_outcome(stage, seconds)
    write_run_report(settings, [stage], [outcome], outcome["seconds"])
    log.info("run %s done: %s; summary in %s", settings.run_id, outcome["outcome"], settings.output_dir)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
