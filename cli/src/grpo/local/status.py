"""`grpo status`: what a stack's processes, trainer, queues and replicas are doing, or how its run ended.

While the trainer answers, its /v1/status is the truth (and is remembered in the run folder). Once it has exited,
the run folder says how the run ended: finished (every stage's final model written), or failed with the last error
line of trainer.log; its stage and last step come from the stage folders' metrics, its accuracies from summary.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from grpo.local.procs import same_process
from grpo.local.stack import StackState

TRAINER_FIELDS = ("phase", "stage", "step", "total_steps", "policy_version", "tasks_published", "groups_trained",
                  "dropped", "in_flight", "duplicates", "superseded", "error", "eval_history")  # fmt: skip
# A finding of the trainer's live doctor, as /v1/status reports it (grpo.trainer.live_doctor): every 10 steps it runs
# `grpo doctor`'s rules over the rows so far, and the list holds those that fire now (empty while the run looks healthy).
DOCTOR_FIELDS = ("rule", "symptom", "evidence", "remedy")
LAST_TRAINER_STATUS = "trainer_status.json"  # what `grpo status` last heard from the trainer, for after it exits
SUMMARY_FIELDS = ("eval_accuracy_before", "eval_accuracy_after", "eval_after_evaluations", "grpo_steps",
                  "wall_seconds")  # fmt: skip
# A log record at ERROR or above, as grpo.common.logs writes it: "<date> <time> ERROR <logger>: <message>".
ERROR_RECORD = re.compile(r"^\S+ \S+ (?:ERROR|CRITICAL) [\w.]+: (.+)$")


def process_table(state: StackState) -> list[dict[str, Any]]:
    """The recorded processes, each with `alive`: its PID still runs the process we started (same start time)."""
    return [{**p, "alive": same_process(int(p["pid"]), float(p["create_time"]))} for p in state.processes]


def status(state_path: Path) -> dict[str, Any]:
    """Processes, the trainer's run status (or outcome), the summary, queue depths and replicas of one stack."""
    from grpo.demo.live import fetch_status

    state = StackState.load(state_path)
    table = process_table(state)
    out: dict[str, Any] = {"run_id": state.run_id, "run_dir": state.run_dir, "redis_url": state.redis_url,
                           "processes": [{k: p[k] for k in ("name", "pid", "ports", "alive")} for p in table]}  # fmt: skip
    if state.trainer_http:
        out.update(trainer_status(state, fetch_status(state.trainer_http), table))
    summary = read_summary(Path(state.trainer_output_dir or state.run_dir))
    if summary is not None:
        out["summary"] = summary
    out.update(redis_status(state))
    return out


def redis_status(state: StackState) -> dict[str, Any]:
    """The run's queue depths and live replicas; `redis_error` instead when Redis does not answer."""
    try:
        from grpo.common.queue import RunQueue, connect
        from grpo.common.registry import ReplicaRegistry

        client = connect(state.redis_url, socket_timeout_s=2.0, connect_timeout_s=2.0)
        return {
            "queues": {key: vars(s) for key, s in RunQueue(client, state.run_id).stats().items()},
            "replicas": [
                {"replica_id": r.replica_id, "address": r.address, "weight_version": r.weight_version,
                 "tasks_done": r.tasks_done, "tasks_failed": r.tasks_failed}
                for r in ReplicaRegistry(client, state.run_id).live_replicas()
            ],
        }  # fmt: skip
    except Exception as exc:  # status must still show the processes when Redis is down
        return {"redis_error": f"{type(exc).__name__}: {exc}"}


def trainer_status(state: StackState, live: dict[str, Any] | None, table: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainer's section: live from /v1/status while it answers (and remembered in the run folder), else the
    last one heard, corrected by what the run folder says of how the run ended."""
    remembered = Path(state.run_dir) / LAST_TRAINER_STATUS
    if live is not None:
        section = {"trainer": {k: live.get(k) for k in TRAINER_FIELDS}, "last_metrics": live.get("metrics", {}),
                   "doctor": doctor_findings(live)}  # fmt: skip
        remembered.write_text(json.dumps(section))
        section["trainer"].update(alive=True, finished=live.get("phase") == "done")
        return section
    try:
        section = json.loads(remembered.read_text())
    except (OSError, ValueError):
        section = {"trainer": {}, "last_metrics": {}}
    row = next((p for p in table if p["name"] == "trainer"), None)
    trainer = section["trainer"]
    trainer["alive"] = bool(row and row["alive"])
    if state.trainer_output_dir:
        rows = metrics_rows(progress(trainer, Path(state.trainer_output_dir), trainer_config(state)))
        section["last_metrics"] = rows[-1] if rows else section["last_metrics"]
    if not trainer["alive"]:
        ended(trainer, Path(row["log"]) if row and row.get("log") else None)
    elif not trainer.get("phase"):
        trainer["phase"] = "not answering yet"  # alive, never heard: still loading its model, most likely
    return section


def doctor_findings(live: dict[str, Any]) -> list[dict[str, str]]:
    """The trainer's current doctor findings from its /v1/status (none from a trainer too old to report them)."""
    found = live.get("doctor")
    if not isinstance(found, list):
        return []
    return [{k: str(f.get(k, "")) for k in DOCTOR_FIELDS} for f in found if isinstance(f, dict)]


def trainer_config(state: StackState) -> dict[str, Any]:
    """The settings the trainer was started with (`<run_dir>/config/trainer.yaml`, written by the stack)."""
    try:
        data = yaml.safe_load((Path(state.run_dir) / "config" / "trainer.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def progress(trainer: dict[str, Any], output: Path, config: dict[str, Any]) -> Path:
    """Set the trainer's finished, stage, step and total_steps from its output folder; returns the metrics file
    they came from (a staged run keeps each stage's in output/stage-<i>-<mode>)."""
    stages = config.get("stages") if isinstance(config.get("stages"), list) else None
    folder, total = staged_progress(trainer, output, stages) if stages else (output, config.get("steps"))
    if not stages:
        trainer["finished"] = (output / "final").is_dir()  # the trainer saves final/ only after its last step
    trainer["finished"] = trainer["finished"] or trainer.get("phase") == "done"
    rows = metrics_rows(folder / "metrics.jsonl")
    if rows:
        trainer["step"] = max(int(trainer.get("step") or 0), int(rows[-1].get("step", 0)))
    if trainer.get("total_steps") is None:
        trainer["total_steps"] = total if isinstance(total, int) else config.get("steps")
    return folder / "metrics.jsonl"


def staged_progress(trainer: dict[str, Any], output: Path, stages: list[Any]) -> tuple[Path, Any]:
    """A staged run: finished once every stage is; its stage the last one begun. Returns that stage's folder and
    steps (its own, else the run's: None here)."""
    begun = [(i, s) for i, s in enumerate(stages, 1) if isinstance(s, dict) and stage_dir(output, i, s).is_dir()]
    trainer["finished"] = len(begun) == len(stages) and all(stage_done(stage_dir(output, i, s)) for i, s in begun)
    if not begun:
        return output, None
    index, stage = begun[-1]
    label = f"{index}/{len(stages)} {stage.get('mode')}"
    if trainer.get("stage") != label:  # what was last heard is of an earlier stage
        trainer.update(stage=label, step=0, total_steps=None)
    return stage_dir(output, index, stage), stage.get("steps")


def stage_dir(output: Path, index: int, stage: dict[str, Any]) -> Path:
    return output / f"stage-{index}-{stage.get('mode')}"  # grpo.trainer.stages.stage_settings names it so


def stage_done(folder: Path) -> bool:
    """A stage is finished once its outcome and what it makes are written (grpo.trainer.stages.read_outcome): its
    whole final model, or a rejection-sampling stage's data."""
    made = "data.jsonl" if folder.name.endswith("-rejection_sampling") else "final/config.json"
    return (folder / "stage.json").is_file() and (folder / made).is_file()


def ended(trainer: dict[str, Any], log_path: Path | None) -> None:
    """A trainer that has exited: finished, failed (its error: what it last said, else its log's last error line)
    or stopped (no error: a signal, or killed)."""
    trainer["log"] = str(log_path) if log_path else None
    if trainer.get("finished"):
        trainer["phase"], trainer["error"] = "finished", ""
        return
    trainer["error"] = trainer.get("error") or (last_error(log_path) if log_path else "")
    trainer["phase"] = "failed" if trainer["error"] else "stopped"


def last_error(log_path: Path, lines: int = 400) -> str:
    """The last error of a log: a traceback's exception line or an ERROR record's message, whichever came last."""
    try:
        tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    for i in range(len(tail) - 1, -1, -1):
        record = ERROR_RECORD.match(tail[i])
        if record:
            return record.group(1).strip()
        if tail[i].startswith("Traceback (most recent call last):"):
            # The exception line is the first after the traceback that is not indented (the frames are).
            return next((line.strip() for line in tail[i + 1 :] if line.strip() and not line[0].isspace()), "")
    return ""


def read_summary(output: Path) -> dict[str, Any] | None:
    """What the run's summary.json says of its accuracies and stages (None while there is none)."""
    path = output / "summary.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    summary = {"path": str(path.resolve()), **{k: data[k] for k in SUMMARY_FIELDS if k in data}}
    if isinstance(data.get("stages"), list):
        summary["stages"] = [{k: s.get(k) for k in ("index", "mode", "outcome")} for s in data["stages"]]
    return summary


def metrics_rows(path: Path) -> list[dict[str, Any]]:
    """The metrics.jsonl rows that read (a crash may cut the last one)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
