"""A taken port stops each service at once: one line naming the port and the flag and variable that move it."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grpo.common.net import free_port
from grpo.local import stack
from grpo.local.procs import ChildFailed, Supervisor
from grpo.local.services import ServiceProc, on_fresh_ports, start_reward
from grpo.local.stack import StackSpec, start_services

SERVICES = {
    "reward": ("grpo.reward", "GRPO_REWARD_", ["--workers", "1"]),
    "rollout": ("grpo.rollout", "GRPO_ROLLOUT_", ["--engine", "hf", "--torch-threads", "1"]),
    "trainer": ("grpo.trainer", "GRPO_TRAINER_", []),
}
CASES = [
    ("reward", "grpc_port"),
    ("reward", "http_port"),
    ("rollout", "grpc_port"),
    ("rollout", "http_port"),
    ("rollout", "weights_data_port"),
    ("trainer", "grpc_port"),
    ("trainer", "http_port"),
]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other process (this test) listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize(("service", "field"), CASES, ids=[f"{s}-{f}" for s, f in CASES])
def test_a_taken_port_is_one_clear_line_and_exit_1(service: str, field: str, taken_port: int, tmp_path: Path) -> None:
    module, env_prefix, extra = SERVICES[service]
    ports = {"grpc_port": free_port(), "http_port": free_port(), "weights_data_port": free_port(), field: taken_port}
    cmd = [sys.executable, "-m", module, "--host", "127.0.0.1"]
    for name in ("grpc_port", "http_port"):
        cmd += [f"--{name.replace('_', '-')}", str(ports[name])]
    if service == "rollout":
        cmd += ["--weights-data-port", str(ports["weights_data_port"])]
    if service == "trainer":
        data = tmp_path / "train.jsonl"
        data.write_text('{"prompt": "1 + 1?", "task_type": "math", "gold": "2"}\n')
        cmd += ["--train-data", str(data), "--output-dir", str(tmp_path / "out")]
    done = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=120)
    flag = f"--{field.replace('_', '-')}"
    expected = (
        f"grpo-{service}: port {taken_port} ({flag} / {env_prefix}{field.upper()}) is in use by another process; "
        f"pick another with {flag} or stop that process"
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == expected, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_a_port_taken_between_pick_and_bind_starts_the_service_again_on_fresh_ports(
    taken_port: int, tmp_path: Path
) -> None:
    """The launcher picks free ports before the child binds them; a port another process takes in between (a
    parallel test, a busy machine) must not fail the start: the service comes up on fresh ports."""

    given: list[int | None] = [taken_port, None]
    tried: list[int] = []

    def start() -> ServiceProc:
        http = given.pop(0) or free_port()
        tried.append(http)
        return start_reward(http_port=http, grpc_port=free_port(), log_path=tmp_path / f"reward-{len(tried)}.log")

    service = on_fresh_ports(start, "reward")
    try:
        assert tried[0] == taken_port and service.http_port == tried[1] != taken_port
        assert "is in use by another process" in (tmp_path / "reward-1.log").read_text()
        assert httpx.get(f"http://127.0.0.1:{service.http_port}/healthz", timeout=5).status_code == 200
    finally:
        service.stop()


def test_grpo_up_starts_the_stack_again_on_fresh_ports_when_a_picked_port_was_taken(
    taken_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`grpo up` and the demo pick every port first and start the services together; a port taken before its
    service binds it (CI saw a replica's HTTP port go while the model loaded) must not fail the start. The picks are
    Redis, reward grpc and http, replica grpc and http: the replica's HTTP port is made the taken one, once."""
    picks = iter([None, None, None, None, taken_port])

    def pick(host: str = "127.0.0.1") -> int:
        return next(picks, None) or free_port(host)

    monkeypatch.setattr(stack, "free_port", pick)
    spec = StackSpec(run_id="ports", run_dir=tmp_path / "run", reward={"workers": 1}, rollout={"torch_threads": 1})
    with Supervisor(tmp_path / "logs") as sup:
        state = start_services(sup, spec, with_trainer=False)
        rollout = next(p for p in state.processes if p["name"] == "rollout-0")
        assert rollout["ports"]["http_port"] != taken_port
        assert httpx.get(f"http://127.0.0.1:{rollout['ports']['http_port']}/healthz", timeout=5).status_code == 200
        assert [c.name for c in sup.children] == ["redis", "reward", "rollout-0"]  # the first try's are gone
    first_try = (tmp_path / "logs" / "rollout-0.log").read_text()
    assert f"port {taken_port} (--http-port / GRPO_ROLLOUT_HTTP_PORT) is in use by another process" in first_try


def test_a_port_the_stack_file_gives_is_not_retried(taken_port: int, tmp_path: Path) -> None:
    """A clash on a port the user set would clash again: one try, and the error names the port."""
    spec = StackSpec(run_id="ports", run_dir=tmp_path / "run", reward={"workers": 1, "http_port": taken_port})
    with Supervisor(tmp_path / "logs") as sup, pytest.raises(ChildFailed, match=f"port {taken_port} "):
        start_services(sup, spec, with_trainer=False)
