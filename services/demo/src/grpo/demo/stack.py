"""Start Redis, the reward service, rollout replicas and the trainer as separate processes on free ports.

Each service gets its own config file (its own field names) under `<run_dir>/config/` and is
started as `python -m grpo.<service> --config FILE`; the stack fills in the addresses that tie
them together (Redis URL, reward address, run name, ports). Used by `grpo demo` and `grpo up`.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo.common.net import free_port
from grpo.common.redis_server import find_redis_server
from grpo.demo.procs import Child, Supervisor, http_ok, port_open

log = logging.getLogger(__name__)
STATE_FILE = "stack.json"


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


def _service(sup: Supervisor, name: str, module: str, run_dir: Path, values: dict[str, Any]) -> Child:
    config = _write_config(run_dir, name, values)
    ports = {k: int(v) for k, v in values.items() if k.endswith("_port")}
    # Unbuffered so a crash's last lines reach the log file.
    return sup.start(
        name, [sys.executable, "-u", "-m", module, "--config", str(config)], env={"PYTHONUNBUFFERED": "1"}, **ports
    )


def _ports(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for key in ("grpc_port", "http_port"):
        if not out.get(key):
            out[key] = free_port()
    return out


def start_redis(sup: Supervisor, run_dir: Path) -> tuple[Child, str]:
    port = free_port()
    data = run_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    cmd = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", "",
           "--appendonly", "no", "--protected-mode", "yes"]  # fmt: skip
    child = sup.start("redis", cmd, port=port)
    return child, f"redis://127.0.0.1:{port}/0"


def start_services(sup: Supervisor, spec: StackSpec, *, with_trainer: bool = True) -> StackState:
    """Start everything in spec (Redis when no URL); returns when each is healthy. ChildFailed otherwise."""
    run_dir, timeout = spec.run_dir, spec.start_timeout_s
    run_dir.mkdir(parents=True, exist_ok=True)
    waits: list[tuple[Child, Any]] = []
    redis_url = spec.redis_url
    if redis_url is None:
        redis, redis_url = start_redis(sup, run_dir)
        sup.wait_ready(redis, lambda: port_open(redis.ports["port"]), 30.0)
    reward = _ports({"host": "127.0.0.1", "workers": 1, **spec.reward})
    reward_child = _service(sup, "reward", "grpo.reward", run_dir, reward)
    waits.append((reward_child, f"http://127.0.0.1:{reward['http_port']}/healthz"))
    reward_addr = f"127.0.0.1:{reward['grpc_port']}"
    for i in range(spec.replicas):
        values = _ports({"engine": "hf", "torch_threads": 1, "host": "127.0.0.1", "advertise_host": "127.0.0.1",
                         "weights_data_port": 0, **spec.rollout, "redis_url": redis_url, "reward_addr": reward_addr, "run": spec.run_id,
                         "replica_id": f"{spec.run_id}-rollout-{i}"})  # fmt: skip
        child = _service(sup, f"rollout-{i}", "grpo.rollout", run_dir, values)
        waits.append((child, f"http://127.0.0.1:{values['http_port']}/healthz"))
    trainer_http = None
    if with_trainer and spec.trainer is not None:
        values = _ports({"host": "127.0.0.1", **spec.trainer, "redis_url": redis_url, "run_id": spec.run_id})
        child = _service(sup, "trainer", "grpo.trainer", run_dir, values)
        trainer_http = int(values["http_port"])
        waits.append((child, f"http://127.0.0.1:{trainer_http}/healthz"))
    for child, url in waits:
        sup.wait_ready(child, functools.partial(http_ok, url), timeout)
    state = StackState(
        run_id=spec.run_id, run_dir=str(run_dir), redis_url=redis_url, reward_addr=reward_addr,
        reward_http=int(reward["http_port"]), trainer_http=trainer_http,
        processes=[{"name": c.name, "pid": c.pid, "create_time": c.create_time, "cmd": c.cmd, "ports": c.ports,
                    "log": str(c.log_path)} for c in sup.children],
    )  # fmt: skip
    return state
