"""`grpo up` / `grpo status` / `grpo down`: the three services and Redis from one config file, no containers.

The config file has one section per service, in that service's own field names:

    run_id: myrun            # namespaces Redis keys; the run folder is <runs_dir>/<run_id>
    redis_url: null          # null: start a private redis-server
    replicas: 1
    reward: {workers: 2}
    rollout: {model: tiny, engine: hf}
    trainer: {model: tiny, train_data: data/train.jsonl, steps: 100}   # optional

PIDs and ports go to <runs_dir>/<run_id>/stack.json; `down` stops exactly those processes
(checking each PID still has the start time we recorded, so a recycled PID is never hit).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml

from grpo.local.procs import Supervisor, same_process, stop_pid
from grpo.local.stack import STATE_FILE, LaunchError, StackSpec, StackState, start_services

log = logging.getLogger(__name__)
KNOWN_KEYS = {"run_id", "runs_dir", "redis_url", "replicas", "reward", "rollout", "trainer", "start_timeout_s"}
TRAINER_FIELDS = ("phase", "step", "total_steps", "policy_version", "tasks_published", "groups_trained", "dropped",
                  "in_flight", "error")  # fmt: skip
LAST_TRAINER_STATUS = "trainer_status.json"  # what `grpo status` last heard from the trainer, for after it exits


def read_stack_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise LaunchError(f"config file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: must be a mapping with sections reward, rollout, trainer")
    unknown = sorted(set(data) - KNOWN_KEYS)
    if unknown:
        raise LaunchError(f"{path}: unknown key(s) {unknown}; known: {sorted(KNOWN_KEYS)}")
    for section in ("reward", "rollout", "trainer"):
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise LaunchError(f"{path}: '{section}' must be a mapping of {section} settings")
    return data


def spec_from_config(data: dict[str, Any], runs_dir: Path) -> StackSpec:
    run_id = str(data.get("run_id") or "default")
    base = Path(data.get("runs_dir") or runs_dir)
    trainer = dict(data["trainer"]) if data.get("trainer") else None
    run_dir = (base / run_id).resolve()
    if trainer is not None:
        trainer.setdefault("output_dir", str(run_dir))
    return StackSpec(
        run_id=run_id, run_dir=run_dir, redis_url=data.get("redis_url"), reward=dict(data.get("reward") or {}),
        rollout=dict(data.get("rollout") or {}), replicas=int(data.get("replicas", 1)), trainer=trainer,
        start_timeout_s=float(data.get("start_timeout_s", 180.0)),
    )  # fmt: skip


def up(config: Path, runs_dir: Path, detach: bool) -> StackState:
    """Start the stack; attached, supervise until Ctrl-C or the trainer ends, then stop everything."""
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
        trainer = next((c for c in sup.children if c.name == "trainer"), None)
        while True:
            sup.check([c.name for c in sup.children if c.name != "trainer"])
            if trainer is not None and not trainer.alive():
                log.info("the trainer exited with code %s", trainer.proc.returncode)
                break
            time.sleep(1.0)
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
