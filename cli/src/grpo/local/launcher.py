"""`grpo up` / `grpo status` / `grpo down`: the three services and Redis from one config file, no containers.

The config file has one section per service, in that service's own field names:

    run_id: myrun            # namespaces Redis keys; the run folder is <runs_dir>/<run_id>
    redis_url: null          # null: start a private redis-server
    replicas: 1              # rollout processes; >= 1 with a trainer section, unless colocated
    colocate: false          # true: the trainer hosts a replica on its own model (docs/colocated.md)
    start_timeout_s: 180     # how long each service may take to become healthy
    reward: {workers: 2}
    rollout: {model: tiny, engine: hf}
    trainer: {model: tiny, train_data: data/train.jsonl, steps: 100}   # optional

PIDs and ports go to <runs_dir>/<run_id>/stack.json; `down` stops exactly those processes
(checking each PID still has the start time we recorded, so a recycled PID is never hit).
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from grpo.common.settings import InvalidSettings, read_config_file
from grpo.local.preflight import redis_url_problem
from grpo.local.procs import ChildFailed, Supervisor, stop_pid
from grpo.local.stack import STATE_FILE, LaunchError, StackSpec, StackState, start_services
from grpo.local.status import process_table

log = logging.getLogger(__name__)


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
    replicas: int | None = Field(None, strict=True)  # strict: YAML reads `replicas: yes` as true, which is no count
    """Rollout replicas, one process each; at least 1 when there is a trainer section and no colocated replica.
    Unset: 1, or 0 when colocated."""
    colocate: bool = Field(False, strict=True)
    """The trainer hosts a rollout replica in its own process, generating from the policy it trains (one model in
    memory, no weight transfer; the `rollout` section configures it): for one box or one GPU (docs/colocated.md)."""
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

    @field_validator("redis_url")
    @classmethod
    def _redis_url_value(cls, value: str | None) -> str | None:
        # Checked once here: each section's own check said it again, in its own words.
        problem = redis_url_problem(value) if value else None
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _replicas_value(self) -> StackConfig:
        # Without a replica the trainer would wait replica_wait_s (default 5 minutes) and only then fail.
        if self.replicas is None:
            self.replicas = 0 if self.colocate else 1
        if self.trainer and self.replicas < 1 and not self.colocate:
            raise ValueError(f"replicas: must be >= 1 with a trainer section, unless colocate: true (got "
                             f"{self.replicas})")  # fmt: skip
        if self.colocate and not self.trainer:
            raise ValueError("colocate: true needs a trainer section: the trainer hosts the replica")
        if self.replicas < 0:
            raise ValueError(f"replicas: must be >= 0 (got {self.replicas})")
        return self


def read_stack_config(path: Path) -> StackConfig:
    """The config file checked key by key; LaunchError naming every problem, before anything starts."""
    if not path.is_file():
        raise LaunchError(f"config file not found: {path}")
    try:  # the services' own reader: YAML and UTF-8 errors are one line, with the line and column
        data = read_config_file(path)
    except InvalidSettings as exc:
        raise LaunchError(str(exc)) from None
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
        rollout=dict(config.rollout or {}), replicas=config.replicas or 0, trainer=trainer,
        start_timeout_s=config.start_timeout_s, colocate=config.colocate,
    )  # fmt: skip


class TrainerFailed(ChildFailed):
    """The trainer exited with an error after it started; `grpo up` exits with `exit_code` (its own)."""


def supervise(sup: Supervisor, poll_s: float = 1.0, on_poll: Callable[[], None] = lambda: None) -> None:
    """Return once the trainer exits 0 (its run ended); ChildFailed as soon as another child exits, TrainerFailed
    when the trainer exits with an error. Without a trainer it runs until interrupted. `on_poll` runs each poll."""
    trainer = next((c for c in sup.children if c.name == "trainer"), None)
    while True:
        sup.check([c.name for c in sup.children if c.name != "trainer"])
        if trainer is not None and not trainer.alive():
            code = trainer.proc.returncode
            if code == 0:
                log.info("the trainer's run has ended; stopping the stack")
                return
            # Killed by a signal (negative code): the shell's convention, 128 + the signal number.
            exit_code = code if code > 0 else 128 - code
            raise TrainerFailed(str(trainer.failure(f"exited with code {code}")), exit_code)
        on_poll()
        time.sleep(poll_s)


def follow(sup: Supervisor, state: StackState, live_view: bool = True) -> None:
    """supervise, showing the trainer's progress as the demo does (its live table, or a line every 10 s)."""
    from grpo.demo import live

    port = state.trainer_http
    if port is None:
        supervise(sup)
        return
    view = live.ViewState()
    with live.progress(view, f"grpo up: {state.run_id}", log, live_view) as refresh:

        def poll() -> None:
            status = live.fetch_status(port)
            if status is not None:
                view.update(status)
            refresh()

        supervise(sup, on_poll=poll)


def up(config: Path, runs_dir: Path, detach: bool, live_view: bool = True) -> StackState:
    """Start the stack; attached, follow it until Ctrl-C or the trainer ends, then stop everything (TrainerFailed
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
        follow(sup, state, live_view)
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
