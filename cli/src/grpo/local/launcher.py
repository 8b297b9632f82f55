"""`grpo up` / `grpo status` / `grpo down`: the three services and Redis from one config file, no containers.

The config file has one section per service, in that service's own field names:

    run_id: myrun            # namespaces Redis keys; the run folder is <runs_dir>/<run_id>
    redis_url: null          # null: start a private redis-server
    replicas: 1              # rollout processes; >= 1 with a trainer section
    start_timeout_s: 180     # how long each service may take to become healthy
    reward: {workers: 2}
    rollout: {model: tiny, engine: hf}
    trainer: {model: tiny, train_data: data/train.jsonl, steps: 100}   # optional

PIDs and ports go to <runs_dir>/<run_id>/stack.json; `down` stops exactly those processes
(checking each PID still has the start time we recorded, so a recycled PID is never hit).
"""

from __future__ import annotations

import difflib
import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from grpo.local.procs import ChildFailed, Supervisor, same_process, stop_pid
from grpo.local.stack import STATE_FILE, LaunchError, StackSpec, StackState, start_services

log = logging.getLogger(__name__)
TRAINER_FIELDS = ("phase", "stage", "step", "total_steps", "policy_version", "tasks_published", "groups_trained",
                  "dropped", "in_flight", "duplicates", "superseded", "error")  # fmt: skip
LAST_TRAINER_STATUS = "trainer_status.json"  # what `grpo status` last heard from the trainer, for after it exits


class StackConfig(BaseModel):
    """The top-level keys of a `grpo up` config; each service section is checked later by that service's own
    settings class (stack.settings_problems)."""

    # YAML reads `run_id: 7` as an int: it still names run 7.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    run_id: str | None = None
    """Namespaces the Redis keys; the run folder is <runs_dir>/<run_id>. Empty or null: `default`."""
    runs_dir: Path | None = None
    """Where the run folder goes; null: `--runs-dir`."""
    redis_url: str | None = None
    """A running Redis; null starts a private redis-server."""
    replicas: int = Field(1, strict=True)  # strict: YAML reads `replicas: yes` as true, which is no count
    """Rollout replicas, one process each; at least 1 when there is a trainer section."""
    start_timeout_s: float = Field(180.0, gt=0, strict=True, allow_inf_nan=False)
    """How long each service may take to become healthy."""
    reward: dict[str, Any] | None = None
    rollout: dict[str, Any] | None = None
    trainer: dict[str, Any] | None = None
    """Optional: without it only Redis, reward and the replicas start."""

    @field_validator("run_id")
    @classmethod
    def _run_id_value(cls, value: str | None) -> str | None:
        # It names a folder under runs_dir: a separator or a leading dot would put the run somewhere else.
        if value and (value.startswith(".") or any(c in value for c in "/\\{}: \n")):
            raise ValueError(f"{value!r} must not start with a dot nor hold slashes, braces, colons or spaces")
        return value

    @model_validator(mode="after")
    def _replicas_value(self) -> StackConfig:
        # Without a replica the trainer would wait replica_wait_s (default 5 minutes) and only then fail.
        if self.trainer and self.replicas < 1:
            raise ValueError(f"replicas: must be >= 1 with a trainer section (got {self.replicas})")
        if self.replicas < 0:
            raise ValueError(f"replicas: must be >= 0 (got {self.replicas})")
        return self


def read_stack_config(path: Path) -> StackConfig:
    """The config file checked key by key; LaunchError naming every problem, before anything starts."""
    if not path.is_file():
        raise LaunchError(f"config file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: must be a mapping with sections reward, rollout, trainer")
    known = sorted(StackConfig.model_fields)
    unknown = sorted(str(key) for key in set(data) - set(known))
    if unknown:
        close = [f"{key} → {match[0]}" for key in unknown if (match := difflib.get_close_matches(key, known, n=1))]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise LaunchError(f"{path}: unknown key(s) {unknown}{hint}; known: {known}")
    for section in ("reward", "rollout", "trainer"):
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise LaunchError(f"{path}: '{section}' must be a mapping of {section} settings")
    try:
        return StackConfig.model_validate(data)
    except ValidationError as exc:
        raise LaunchError(f"{path}: {'; '.join(config_problems(exc))}") from None


def config_problems(exc: ValidationError) -> list[str]:
    """One `key: message` per error (a check across keys names them in its message)."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        # pydantic prefixes a validator's own message with "Value error, "; ours already says it all.
        message = str(error["ctx"]["error"]) if error["type"] == "value_error" else error["msg"]
        problems.append(f"{where}: {message}" if where else message)
    return problems


def spec_from_config(config: StackConfig, runs_dir: Path) -> StackSpec:
    run_id = config.run_id or "default"
    run_dir = ((config.runs_dir or runs_dir) / run_id).resolve()
    trainer = dict(config.trainer) if config.trainer else None
    if trainer is not None:
        trainer.setdefault("output_dir", str(run_dir))
    return StackSpec(
        run_id=run_id, run_dir=run_dir, redis_url=config.redis_url, reward=dict(config.reward or {}),
        rollout=dict(config.rollout or {}), replicas=config.replicas, trainer=trainer,
        start_timeout_s=config.start_timeout_s,
    )  # fmt: skip


class TrainerFailed(ChildFailed):
    """The trainer exited with an error after it started; `grpo up` exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def supervise(sup: Supervisor, poll_s: float = 1.0) -> None:
    """Return once the trainer exits 0 (its run ended); ChildFailed as soon as another child exits, TrainerFailed
    when the trainer exits with an error. Without a trainer it runs until interrupted."""
    trainer = next((c for c in sup.children if c.name == "trainer"), None)
    while True:
        sup.check([c.name for c in sup.children if c.name != "trainer"])
        if trainer is not None and not trainer.alive():
            code = trainer.proc.returncode
            if code == 0:
                log.info("the trainer exited with code 0")
                return
            # Killed by a signal (negative code): the shell's convention, 128 + the signal number.
            exit_code = code if code > 0 else 128 - code
            raise TrainerFailed(str(trainer.failure(f"exited with code {code}")), exit_code)
        time.sleep(poll_s)


def up(config: Path, runs_dir: Path, detach: bool) -> StackState:
    """Start the stack; attached, supervise until Ctrl-C or the trainer ends, then stop everything (TrainerFailed
    when it ended with an error)."""
    spec = spec_from_config(read_stack_config(config), runs_dir)
    if (spec.run_dir / STATE_FILE).exists() and any(
        p["alive"] for p in process_table(StackState.load(spec.run_dir / STATE_FILE))
    ):
        raise LaunchError(f"run {spec.run_id!r} is already up ({spec.run_dir / STATE_FILE}); `grpo down` first")
    sup = Supervisor(spec.run_dir / "logs", detach=detach)
    try:
        state = start_services(sup, spec)
    except BaseException:
        sup.stop_all()
        raise
    state.save()
    if detach:
        return state
    try:
        supervise(sup)
    finally:
        sup.stop_all()
        (spec.run_dir / STATE_FILE).unlink(missing_ok=True)
    return state


def find_states(runs_dir: Path, run_id: str | None, *, live_only: bool = False) -> list[Path]:
    """State files of one run or of all runs (oldest first); live_only skips those with no process left."""
    paths = [runs_dir / run_id / STATE_FILE] if run_id is not None else list(runs_dir.glob(f"*/{STATE_FILE}"))
    paths = sorted((p for p in paths if p.exists()), key=lambda p: p.stat().st_mtime)
    if live_only:
        paths = [p for p in paths if any(row["alive"] for row in process_table(StackState.load(p)))]
    return paths


def process_table(state: StackState) -> list[dict[str, Any]]:
    """The recorded processes, each with `alive`: its PID still runs the process we started (same start time)."""
    return [{**p, "alive": same_process(int(p["pid"]), float(p["create_time"]))} for p in state.processes]


def down(state_path: Path, grace_s: float = 15.0) -> list[str]:
    """Stop every recorded process that is still ours, last started first; returns their names."""
    state = StackState.load(state_path)
    stopped = []
    for p in reversed(process_table(state)):
        if p["alive"]:
            stop_pid(int(p["pid"]), grace_s)
            stopped.append(p["name"])
    state_path.unlink(missing_ok=True)
    return stopped


def status(state_path: Path) -> dict[str, Any]:
    """Processes, the trainer's run status, queue depths and replicas of one stack."""
    from grpo.demo.live import fetch_status

    state = StackState.load(state_path)
    out: dict[str, Any] = {"run_id": state.run_id, "run_dir": state.run_dir, "redis_url": state.redis_url,
                           "processes": [{k: p[k] for k in ("name", "pid", "ports", "alive")} for p in process_table(state)]}  # fmt: skip
    if state.trainer_http:
        out.update(trainer_status(state, fetch_status(state.trainer_http)))
    try:
        from grpo.common.queue import RunQueue, connect
        from grpo.common.registry import ReplicaRegistry

        client = connect(state.redis_url, socket_timeout_s=2.0, connect_timeout_s=2.0)
        out["queues"] = {key: vars(s) for key, s in RunQueue(client, state.run_id).stats().items()}
        out["replicas"] = [
            {"replica_id": r.replica_id, "address": r.address, "weight_version": r.weight_version,
             "tasks_done": r.tasks_done, "tasks_failed": r.tasks_failed}
            for r in ReplicaRegistry(client, state.run_id).live_replicas()
        ]  # fmt: skip
    except Exception as exc:  # status must still show the processes when Redis is down
        out["redis_error"] = f"{type(exc).__name__}: {exc}"
    return out


def trainer_status(state: StackState, live: dict[str, Any] | None) -> dict[str, Any]:
    """The trainer's section: live from /v1/status while it answers (and remembered in the run folder), else
    the last one heard plus what it left behind (exited, finished, last step), so an ended run still shows."""
    remembered = Path(state.run_dir) / LAST_TRAINER_STATUS
    if live is not None:
        section = {"trainer": {k: live.get(k) for k in TRAINER_FIELDS}, "last_metrics": live.get("metrics", {})}
        remembered.write_text(json.dumps(section))
        return section
    try:
        section = json.loads(remembered.read_text())
    except (OSError, ValueError):
        section = {"trainer": {}, "last_metrics": {}}
    row = next((p for p in process_table(state) if p["name"] == "trainer"), None)
    trainer = section["trainer"]
    trainer["alive"] = bool(row and row["alive"])
    if not trainer["alive"]:
        trainer["phase"] = "exited"
    if state.trainer_output_dir:
        output = Path(state.trainer_output_dir)
        trainer["finished"] = (output / "final").is_dir()  # the trainer saves final/ only after its last step
        rows = _metrics_rows(output / "metrics.jsonl")
        if rows:
            trainer["step"] = max(int(trainer.get("step") or 0), int(rows[-1].get("step", 0)))
            section["last_metrics"] = section["last_metrics"] or rows[-1]
    return section


def _metrics_rows(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []
