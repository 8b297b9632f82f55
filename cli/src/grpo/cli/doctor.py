"""`grpo doctor RUN_DIR`: the debugging checklist (grpo.common.doctor's rules) run on a run folder's metrics.jsonl.

Exit codes: 0 no symptom found, 1 findings, 2 a folder that cannot be read as a run (said in one line).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from grpo.common.doctor import Finding, RunSettings, diagnose

log = logging.getLogger("grpo.cli")
# A staged run's stage folder (grpo.trainer.stages): its settings are the run's config with its stage's values.
STAGE_FOLDER = re.compile(r"stage-(\d+)-(sft|grpo)")


class BadRunFolder(Exception):
    """RUN_DIR is not a run folder the doctor can read; the message says why in one line."""


def find_metrics(run_dir: Path) -> Path:
    """RUN_DIR/metrics.jsonl, or BadRunFolder naming what is there instead."""
    if not run_dir.is_dir():
        raise BadRunFolder(f"no run folder {run_dir}")
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        return path
    stages = sorted(p.parent.name for p in run_dir.glob("stage-*/metrics.jsonl"))
    if stages:
        raise BadRunFolder(f"{run_dir} is a staged run: give one stage's folder ({', '.join(stages)})")
    raise BadRunFolder(f"no metrics.jsonl in {run_dir} (the trainer writes it there at its first step)")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The metrics rows; a line that does not parse is skipped (a crash may cut the last one)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    if not rows:
        raise BadRunFolder(f"{path} holds no metrics row")
    return rows


def trainer_values(run_dir: Path) -> dict[str, Any] | None:
    """The settings the trainer was given (`config/trainer.yaml`, written by `grpo up` and the demo), with a
    stage's own values laid over them for a stage folder; None when the folder does not hold them."""
    stage = STAGE_FOLDER.fullmatch(run_dir.name)
    folder = run_dir.parent if stage else run_dir
    try:
        values = yaml.safe_load((folder / "config" / "trainer.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(values, dict):
        return None
    stages = values.get("stages") or []
    if stage and int(stage[1]) <= len(stages) and isinstance(stages[int(stage[1]) - 1], dict):
        values = {**values, **stages[int(stage[1]) - 1]}
    return values


def run_settings(run_dir: Path) -> RunSettings:
    """β, the reference refresh, G, max_staleness and refills as the run resolved them (a setting not given is its
    preset's); RunSettings() when the folder has no trainer config or the trainer's package is not installed."""
    values = trainer_values(run_dir)
    if values is None:
        return RunSettings()
    try:
        # The trainer's settings module is pure data (no torch); its presets are the one place the defaults live.
        from grpo.trainer.config import ALGO_FIELDS, ALGO_PRESETS, TrainerSettings
    except ImportError:
        return RunSettings()
    preset = ALGO_PRESETS.get(values.get("preset") or TrainerSettings.model_fields["preset"].default)
    if preset is None:
        return RunSettings()
    algo = preset.with_overrides(**{k: values[k] for k in ALGO_FIELDS if values.get(k) is not None})
    return RunSettings(
        beta=algo.beta,
        ref_refresh_steps=algo.ref_refresh_steps or 0,
        group_size=algo.group_size,
        max_staleness=int(values.get("max_staleness", TrainerSettings.model_fields["max_staleness"].default)),
        refill_zero_variance=algo.refill_zero_variance,
    )


def finding_text(f: Finding) -> str:
    return f"{f.rule}: {f.symptom}\n  evidence: {f.evidence}\n  remedy:   {f.remedy}\n"


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run every rule on RUN_DIR (or --runs-dir/RUN_DIR) and print the findings; 0 healthy, 1 findings, 2 bad."""
    run_dir: Path = args.run_dir
    if not run_dir.is_dir() and (args.runs_dir / run_dir).is_dir():
        run_dir = args.runs_dir / run_dir  # a run id, as `grpo status --run-id` takes
    try:
        rows = read_rows(find_metrics(run_dir))
    except (BadRunFolder, OSError) as exc:
        log.error("grpo doctor: %s", exc)
        return 2
    settings = run_settings(run_dir)
    findings = diagnose(rows, settings)
    steps = sorted(row["step"] for row in rows)
    if args.json:
        out = {"run_dir": str(run_dir), "steps": [steps[0], steps[-1]], "settings": asdict(settings),
               "findings": [asdict(f) for f in findings]}  # fmt: skip
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
    else:
        verdict = f"{len(findings)} symptom(s)" if findings else "no symptom found"
        sys.stdout.write(f"grpo doctor: {run_dir}, steps {steps[0]}–{steps[-1]}: {verdict}\n")
        sys.stdout.write("".join(finding_text(f) for f in findings))
    return 1 if findings else 0
