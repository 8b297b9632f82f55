"""A staged run (R1: cold-start SFT, then GRPO) in one trainer process, resumable between and within stages.

Stage i runs as an ordinary sft or grpo run (or a rejection_sampling stage, which writes SFT rows instead of a model)
in output_dir/stage-<i>-<mode>, on the previous stage's final model unless it names its own (`base`: the run's
model). A finished stage leaves stage.json (its outcome) beside its final/ model (a rejection_sampling stage: beside
its data.jsonl, which later stages name as `previous` or `stage:<N>`); a restarted trainer skips those stages and
resumes the current one from its checkpoints. The run's summary.json and report.md (with plots) go to output_dir after every stage; a run without
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

from pydantic import ValidationError

from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.report import read_metrics, summarize, write_report
from grpo.trainer.sources import is_reference

log = logging.getLogger(__name__)
OUTCOME_FILE = "stage.json"
RS_DATA_FILE = "data.jsonl"  # what a rejection_sampling stage writes into its folder (SFT rows)
# Settings of the whole run, which a stage may not set: its folders, its name and its servers.
STAGE_FIXED = ("stages", "output_dir", "run_id", "resume", "when_done", "host", "grpc_port", "http_port")
STAGE_MODES = ("sft", "grpo", "rejection_sampling")


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
    """Each stage's settings, its model and data references resolved: `model` base (the run's model) or previous
    (the default: the final model of the latest earlier sft or grpo stage; the run's model when there is none), and
    train_data items `previous` or `stage:<N>` (the data.jsonl an earlier rejection_sampling stage writes)."""
    stages: list[Stage] = []
    for i, raw in enumerate(settings.stages, 1):
        values = dict(raw)
        values["model"] = stage_model(settings, stages, values.get("model"), i)
        if "train_data" in values:
            values["train_data"] = stage_data(stages, values["train_data"], i)
        stages.append(Stage(i, stage_settings(settings, values, i)))
    return stages


def stage_settings(base: TrainerSettings, stage: dict[str, Any], index: int) -> TrainerSettings:
    """Stage `index` (1-based): `base` overridden by the stage's own values, writing to its own folder. Its model and
    data references (`base`, `previous`, `stage:<N>`) must have been resolved (plan_stages does)."""
    if stage.get("mode") not in STAGE_MODES:
        raise ValueError(f"stages[{index}]: needs mode: sft, grpo or rejection_sampling (got {stage.get('mode')!r})")
    fixed = sorted(set(stage) & set(STAGE_FIXED))
    if fixed:
        raise ValueError(f"stages[{index}]: {fixed} are set for the whole run, not per stage")
    if "stage" in stage:
        raise ValueError(f"stages[{index}]: `stage` is set by the run (the stage's index), not by you")
    values = {**base.model_dump(exclude={"stages"}), **stage}
    values["output_dir"] = base.output_dir / f"stage-{index}-{stage['mode']}"
    values["stage"] = index
    try:
        return TrainerSettings.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"stages[{index}] ({stage['mode']}): {problems}") from None


def stage_model(settings: TrainerSettings, earlier: list[Stage], model: Any, index: int) -> Any:
    """A stage's model with `base` and `previous` resolved (a rejection_sampling stage trains none: the stage after
    it continues from the model before it)."""
    if model == "base":
        return settings.model
    if model is not None and model != "previous":
        return model  # a path, hub id or tiny (or a wrong type, which the stage's validation names)
    if index == 1 and model == "previous":
        raise ValueError("stages[1]: model: previous, but stage 1 has no earlier stage; use base (the run's model), "
                         "or leave model out")  # fmt: skip
    trained = [stage for stage in earlier if stage.mode in ("sft", "grpo")]
    return str(trained[-1].folder / "final") if trained else settings.model


def stage_data(earlier: list[Stage], value: Any, index: int) -> Any:
    """A stage's train_data with its references to earlier rejection_sampling stages' data resolved to their files;
    ValueError naming the stage for a reference to no such stage."""
    if isinstance(value, str | Path):
        return resolve_reference(earlier, str(value), index) if is_reference(value) else value
    if not isinstance(value, list):
        return value  # the stage's validation names what is wrong with it
    out: list[Any] = []
    for item in value:
        if isinstance(item, str | Path) and is_reference(item):
            out.append(resolve_reference(earlier, str(item), index))
        elif isinstance(item, dict) and isinstance(item.get("data"), str | Path) and is_reference(item["data"]):
            out.append({**item, "data": resolve_reference(earlier, str(item["data"]), index)})
        else:
            out.append(item)
    return out


def resolve_reference(earlier: list[Stage], reference: str, index: int) -> str:
    """`previous` or `stage:<N>` → the producing rejection_sampling stage's <folder>/data.jsonl."""
    producers = [stage for stage in earlier if stage.mode == "rejection_sampling"]
    if reference == "previous":
        if not producers:
            raise ValueError(f"stages[{index}]: train_data previous names the data of the latest earlier "
                             "rejection_sampling stage, and no stage before it is one")  # fmt: skip
        return str(producers[-1].folder / RS_DATA_FILE)
    number = reference.removeprefix("stage:").strip()
    if not number.isdigit() or int(number) < 1:
        raise ValueError(f"stages[{index}]: train_data {reference!r}: write stage:<N>, N an earlier stage's number "
                         "(from 1)")  # fmt: skip
    n = int(number)
    if n >= index:
        raise ValueError(f"stages[{index}]: train_data {reference!r}: stage {n} is not earlier than stage {index}; "
                         "a stage can only train on data an earlier stage wrote")  # fmt: skip
    if earlier[n - 1].mode != "rejection_sampling":
        raise ValueError(f"stages[{index}]: train_data {reference!r}: stage {n} is a {earlier[n - 1].mode} stage, "
                         "which writes no data; only a rejection_sampling stage does")  # fmt: skip
    return str(earlier[n - 1].folder / RS_DATA_FILE)


def produced_by(stages: list[Stage], path: Path) -> Stage | None:
    """The rejection_sampling stage of this run whose output `path` is, if any."""
    return next((s for s in stages if s.mode == "rejection_sampling" and s.folder / RS_DATA_FILE == path), None)


def read_outcome(stage: Stage) -> dict[str, Any] | None:
    """The finished stage's outcome, or None while it is not finished: no stage.json, or no final model (sft, grpo)
    or no data.jsonl (rejection_sampling, which trains no model)."""
    path = stage.folder / OUTCOME_FILE
    product = RS_DATA_FILE if stage.mode == "rejection_sampling" else "final/config.json"
    if not (path.is_file() and (stage.folder / product).is_file()):
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
    if stage.mode == "rejection_sampling":
        from grpo.trainer.rejection import rs_outcome

        return {**out, **rs_outcome(stage.folder, seconds)}
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
