"""Start Redis, the reward service, rollout replicas and the trainer as separate processes on free ports.

Each service gets its own config file (its own field names) under `<run_dir>/config/` and is
started as `python -m grpo.<service> --config FILE`; the stack fills in the addresses that tie
them together (Redis URL, reward address, run name, ports). Used by `grpo demo` and `grpo up`.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import logging
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from grpo.common.net import free_port
from grpo.common.tiny_model import TINY_NAMES, ModelNotFound, check_model
from grpo.local.preflight import hub_problem, redis_problem
from grpo.local.procs import PORT_ATTEMPTS, PORT_CLASH, Child, ChildFailed, Supervisor, http_ok, port_clash, port_open
from grpo.local.redis_server import find_redis_server

log = logging.getLogger(__name__)
STATE_FILE = "stack.json"
# Each service's settings class, imported only to check a section (the trainer's pulls in torch).
SETTINGS = {
    "grpo.reward": ("grpo.reward.settings", "RewardSettings"),
    "grpo.rollout": ("grpo.rollout.settings", "RolloutSettings"),
    "grpo.trainer": ("grpo.trainer.config", "TrainerSettings"),
}


# The sections whose service loads a model (`model`, and the trainer's stages); each checks it at start-up.
MODEL_SECTIONS = ("rollout", "trainer")
# A stage's `model: base` (the run's model) or `previous` (an earlier stage's final model): grpo.trainer.stages.
STAGE_REFERENCES = ("base", "previous")


class LaunchError(ValueError):
    """A stack config that cannot be used; the message says what to change. Raised before anything starts."""


@dataclass
class StackSpec:
    """What to start; the service dicts are those services' own settings (ports are filled in when absent)."""

    run_id: str
    run_dir: Path
    redis_url: str | None = None
    reward: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    trainer: dict[str, Any] | None = None
    start_timeout_s: float = 180.0
    colocate: bool = False  # the trainer hosts a replica in its own process, with the rollout section's settings


@dataclass
class StackState:
    """What was started: written to `<run_dir>/stack.json` for `grpo status` / `grpo down`."""

    run_id: str
    run_dir: str
    redis_url: str
    reward_addr: str
    reward_http: int
    trainer_http: int | None
    processes: list[dict[str, Any]]
    trainer_output_dir: str | None = None

    def save(self) -> Path:
        path = Path(self.run_dir) / STATE_FILE
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, path: Path) -> StackState:
        return cls(**json.loads(path.read_text()))


def _write_config(run_dir: Path, name: str, values: dict[str, Any]) -> Path:
    path = run_dir / "config" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({k: str(v) if isinstance(v, Path) else v for k, v in values.items()}))
    return path


@dataclass
class Planned:
    """One service to start: its section of the stack config, and the settings file it gets."""

    name: str
    section: str
    module: str
    values: dict[str, Any]

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.values['http_port']}/healthz"


def _ports(values: dict[str, Any], taken: set[int]) -> dict[str, Any]:
    """`values` with the ports not given filled in: free now, and none picked twice in one plan (`taken` grows)."""
    out = dict(values)
    for key in ("grpc_port", "http_port"):
        while not out.get(key) or (not values.get(key) and int(out[key]) in taken):
            out[key] = free_port()
        taken.add(int(out[key]))
    return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


def plan_services(
    spec: StackSpec, redis_url: str, *, with_trainer: bool = True, taken: set[int] | None = None
) -> list[Planned]:
    """The settings each service will get (ports filled in, none of `taken`, addresses tying them together)."""
    taken = set(taken or ())
    reward = _ports({"host": "127.0.0.1", "workers": 1, **spec.reward}, taken)
    planned = [Planned("reward", "reward", "grpo.reward", reward)]
    reward_addr = f"127.0.0.1:{reward['grpc_port']}"
    for i in range(spec.replicas):
        values = _ports({"engine": "hf", "torch_threads": 1, "host": "127.0.0.1", "advertise_host": "127.0.0.1",
                         "weights_data_port": 0, **spec.rollout, "redis_url": redis_url, "reward_addr": reward_addr, "run": spec.run_id,
                         "replica_id": f"{spec.run_id}-rollout-{i}"}, taken)  # fmt: skip
        planned.append(Planned(f"rollout-{i}", "rollout", "grpo.rollout", values))
    if with_trainer and spec.trainer is not None:
        trainer = {"host": "127.0.0.1", **spec.trainer, "redis_url": redis_url, "run_id": spec.run_id}
        if spec.colocate:  # the rollout section without what the trainer sets (its model, run and Redis)
            rollout = {k: v for k, v in spec.rollout.items() if k not in ("model", "run", "redis_url")}
            trainer["colocate"] = {"host": "127.0.0.1", "advertise_host": "127.0.0.1", **rollout,
                                   "reward_addr": reward_addr}  # fmt: skip
        values = _ports(trainer, taken)
        planned.append(Planned("trainer", "trainer", "grpo.trainer", values))
    return planned


@dataclass
class Hub:
    """Whether the model hub can be reached, asked at most once per start and only when a section names a hub id."""

    asked: bool = False
    problem: str | None = None

    def unreachable(self) -> str | None:
        """None when the hub answers (or HF_HUB_OFFLINE says not to ask it); else why it cannot be reached."""
        if not self.asked:
            self.asked, self.problem = True, hub_problem()
        return self.problem


def settings_problems(planned: list[Planned], hub: Hub | None = None) -> list[str]:
    """Every bad key or value of every section, one `section.field: message` each (replicas share a section), and
    every model a section names that its service's start-up check would refuse."""
    hub = hub or Hub()
    problems: list[str] = []
    checked: set[str] = set()
    for service in planned:
        if service.section in checked:
            continue
        checked.add(service.section)
        module, name = SETTINGS[service.module]
        settings_cls = getattr(importlib.import_module(module), name)
        try:
            settings_cls.model_validate(service.values)
        except ValidationError as exc:
            for error in exc.errors():
                field_name = ".".join(str(p) for p in error["loc"])
                message = error["msg"]
                if error["type"] == "extra_forbidden":
                    close = difflib.get_close_matches(field_name, settings_cls.model_fields, n=1)
                    message = f"unknown setting{f' (did you mean {close[0]}?)' if close else ''}"
                problems.append(f"{service.section}{'.' + field_name if field_name else ''}: {message}")
        if service.section in MODEL_SECTIONS:
            problems += model_problems(service.section, service.values, hub)
    return problems


def models_to_load(values: dict[str, Any]) -> list[tuple[str, str]]:
    """(setting, model) for every model a rollout or trainer section names: `model`, and each stage's own.

    Read from the raw section, not the validated settings, so a bad model is reported beside the section's other
    problems; a value that is not text is left to the settings class, which names it already.
    """
    models = [("model", values["model"])] if isinstance(values.get("model"), str) else []
    stages = values.get("stages")
    for i, stage in enumerate(stages if isinstance(stages, list) else [], 1):  # 1-based, as the trainer names stages
        # `base` and `previous` name another model of the run (the trainer resolves them), not one to look for.
        if isinstance(stage, dict) and isinstance(stage.get("model"), str) and stage["model"] not in STAGE_REFERENCES:
            models.append((f"stages[{i}].model", stage["model"]))
    return models


def model_problems(section: str, values: dict[str, Any], hub: Hub | None = None) -> list[str]:
    """The service's own model check (it runs it first thing, grpo.common.tiny_model.check_model) done here too, so
    a missing folder or an unknown hub id stops `grpo up` before anything starts instead of one service after all
    the others are up. The built-in tiny model is skipped: it cannot be missing (the service builds it), and
    building it here would load torch in the launcher. A hub id while the hub cannot be reached is looked for in
    the cache alone (check_model would retry the hub for 54 s first)."""
    hub = hub or Hub()
    problems = []
    for name, model in models_to_load(values):
        if model in TINY_NAMES:
            continue
        try:
            unreachable = hub.unreachable() if is_hub_id(model) else None
            if unreachable is None:
                check_model(model)
            else:
                check_cached(model, unreachable)
        except ModelNotFound as exc:
            problems.append(f"{section}.{name}: {exc}")
    return problems


def is_hub_id(model: str) -> bool:
    """Whether check_model would ask the hub for `model`: nothing of that name here, and a valid `owner/name`."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if Path(model).expanduser().exists() or model.startswith((".", "/", "~")):
        return False
    try:
        validate_repo_id(model)
    except HFValidationError:
        return False
    return True


def check_cached(model: str, unreachable: str) -> None:
    """ModelNotFound unless the hub cache holds `model`'s config.json (as HF_HUB_OFFLINE=1 would load it)."""
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return
    raise ModelNotFound(
        f"{model!r} is not a local folder nor in the hub cache ({constants.HF_HUB_CACHE}), and {unreachable}: give "
        "the path of a local folder holding the model (its config.json and weights), or download it where there is "
        "a network; HF_HUB_OFFLINE=1 then loads it from the cache without asking the hub"
    )


def offline_env(hub: Hub) -> dict[str, str]:
    """HF_HUB_OFFLINE=1 for the services when the hub cannot be reached (their models are in the cache, or the
    check would have stopped us): else each service's own check retries the hub for 54 s first."""
    if hub.asked and hub.problem is not None:
        log.warning("%s: the services load their models from the hub cache (HF_HUB_OFFLINE=1)", hub.problem)
        return {"HF_HUB_OFFLINE": "1"}
    return {}


def _service(sup: Supervisor, run_dir: Path, service: Planned, env: dict[str, str]) -> Child:
    config = _write_config(run_dir, service.name, service.values)
    ports = {k: int(v) for k, v in service.values.items() if k.endswith("_port")}
    # Unbuffered so a crash's last lines reach the log file.
    cmd = [sys.executable, "-u", "-m", service.module, "--config", str(config)]
    return sup.start(service.name, cmd, env={"PYTHONUNBUFFERED": "1", **env}, **ports)


def start_redis(sup: Supervisor, run_dir: Path, port: int) -> Child:
    data = run_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    cmd = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", "",
           "--appendonly", "no", "--protected-mode", "yes"]  # fmt: skip
    return sup.start("redis", cmd, port=port)


def _retry_on_fresh_ports(exc: ChildFailed, spec: StackSpec) -> bool:
    """Was a port we picked (not one the stack file gives, which a fresh plan would give again) taken before its
    service bound it? Our services name the port; a bind error from deeper down does not, and is retried."""
    if not port_clash(exc):
        return False
    named = re.search(r"port (\d+) \(", str(exc))
    given = {int(v) for section in (spec.reward, spec.rollout, spec.trainer or {})
             for k, v in section.items() if k.endswith("_port") and v}  # fmt: skip
    return named is None or int(named.group(1)) not in given


def start_services(sup: Supervisor, spec: StackSpec, *, with_trainer: bool = True) -> StackState:
    """Check that the Redis given answers, and every section's settings (LaunchError naming each problem, nothing
    started), then start everything in spec (Redis when no URL); returns when each is healthy. ChildFailed
    otherwise."""
    redis_port = free_port() if spec.redis_url is None else 0
    redis_url = spec.redis_url or f"redis://127.0.0.1:{redis_port}/0"
    # First (it takes milliseconds, the sections' checks seconds): the services would find out themselves only
    # after their outage retries, the trainer's taking minutes.
    unreachable = redis_problem(spec.redis_url, spec.run_id) if spec.redis_url is not None else None
    if unreachable is not None:
        raise LaunchError(f"{unreachable}; nothing started")
    planned = plan_services(spec, redis_url, with_trainer=with_trainer, taken={redis_port})
    hub = Hub()
    problems = settings_problems(planned, hub)
    if problems:
        raise LaunchError(f"{len(problems)} invalid setting(s), nothing started:\n  " + "\n  ".join(problems))
    env = offline_env(hub)
    run_dir, timeout = spec.run_dir, spec.start_timeout_s
    run_dir.mkdir(parents=True, exist_ok=True)
    if spec.redis_url is None:
        redis = start_redis(sup, run_dir, redis_port)
        sup.wait_ready(redis, lambda: port_open(redis_port), 30.0)
    first = len(sup.children)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            children = [(_service(sup, run_dir, service, env), service) for service in planned]
            for child, service in children:
                sup.wait_ready(child, functools.partial(http_ok, service.health_url), timeout)
            break
        except ChildFailed as exc:
            if attempt == PORT_ATTEMPTS or not _retry_on_fresh_ports(exc, spec):
                raise
            # The ports tie the services together (the reward's address is in every other's settings): all of
            # them start again, on a new plan. Nothing has trained yet; Redis keeps its port.
            clash = next(line for line in str(exc).splitlines() if any(c in line for c in PORT_CLASH))
            log.warning("%s: %s; starting the services again on fresh ports", str(exc).split(" ", 1)[0], clash)
            sup.stop_since(first)
            planned = plan_services(spec, redis_url, with_trainer=with_trainer, taken={redis_port})
    reward = planned[0].values
    trainer = next((s.values for s in planned if s.section == "trainer"), None)
    return StackState(
        run_id=spec.run_id, run_dir=str(run_dir), redis_url=redis_url, reward_addr=f"127.0.0.1:{reward['grpc_port']}",
        reward_http=int(reward["http_port"]), trainer_http=int(trainer["http_port"]) if trainer else None,
        processes=[{"name": c.name, "pid": c.pid, "create_time": c.create_time, "cmd": c.cmd, "ports": c.ports,
                    "log": str(c.log_path)} for c in sup.children],
        trainer_output_dir=str(trainer["output_dir"]) if trainer and trainer.get("output_dir") else None,
    )  # fmt: skip
