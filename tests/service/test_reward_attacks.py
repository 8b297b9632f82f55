"""Attacks on the running reward service through its HTTP API; each must be contained and leave the service healthy."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.reward.helpers import host_processes_with

# Set before the session's service starts, so the service inherits it: the sandbox must never see it.
SECRET = f"grpo-attack-secret-{uuid.uuid4().hex}"
os.environ["GRPO_ATTACK_SECRET"] = SECRET
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def api(reward_service: Any) -> Iterator[httpx.Client]:
    """An HTTP client; after each attack the service must still answer /healthz."""
    with httpx.Client(base_url=reward_service.http_url, timeout=60.0) as client:
        yield client
        health = client.get("/healthz")
        assert health.status_code == 200, health.text
        assert reward_service.proc.poll() is None


def execute(api: httpx.Client, code: str, **extra: Any) -> dict[str, Any]:
    response = api.post("/v1/execute", json={"language": "python", "code": code, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_infinite_loop_times_out(api: httpx.Client) -> None:
    started = time.monotonic()
    result = execute(api, "while True:\n    pass", timeout_s=1.0)
    assert result["status"] == "timeout"
    assert time.monotonic() - started < 4.0


def test_long_sleep_times_out(api: httpx.Client) -> None:
    assert execute(api, "import time\ntime.sleep(120)", timeout_s=1.0)["status"] == "timeout"


def test_fork_bomb_is_contained(api: httpx.Client) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    assert execute(api, bomb, timeout_s=1.5)["status"] == "timeout"
    assert execute(api, "print('after')")["stdout"] == "after\n"


def test_memory_bomb_is_memory_limit(api: httpx.Client) -> None:
    bomb = "x = []\nwhile True:\n    x.append(bytearray(50 << 20))"
    assert execute(api, bomb, timeout_s=5.0, memory_mb=256)["status"] == "memory_limit"


def test_cannot_reach_the_services_own_ports(api: httpx.Client, reward_service: Any) -> None:
    ports = [int(reward_service.http_url.rsplit(":", 1)[1]), int(reward_service.grpc_addr.rsplit(":", 1)[1])]
    code = (
        "import socket\n"
        f"for port in {ports}:\n"
        "    try:\n        socket.create_connection(('127.0.0.1', port), timeout=1)\n        print('connected', port)\n"
        "    except OSError:\n        print('blocked', port)\n"
        "try:\n    socket.create_connection(('8.8.8.8', 53), timeout=1)\n    print('internet')\n"
        "except OSError:\n    print('no internet')\n"
    )
    result = execute(api, code, timeout_s=5.0)
    assert result["stdout"] == f"blocked {ports[0]}\nblocked {ports[1]}\nno internet\n"


def test_cannot_read_the_services_environment(api: httpx.Client, reward_service: Any) -> None:
    service_env = Path(f"/proc/{reward_service.proc.pid}/environ").read_bytes()
    assert SECRET.encode() in service_env  # the attack is meaningful: the service holds the secret
    code = (
        "import os\nprint(dict(os.environ))\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()] + ['1']:\n"
        "    try:\n        print(open(f'/proc/{pid}/environ', 'rb').read())\n    except OSError:\n        pass\n"
        f"print(os.path.exists('/proc/{reward_service.proc.pid}/cmdline'))\n"
    )
    result = execute(api, code)
    assert result["status"] == "ok"
    assert SECRET not in result["stdout"] and "GRPO_ATTACK_SECRET" not in result["stdout"]
    assert result["stdout"].rstrip().endswith("False")


@pytest.mark.parametrize(
    ("target", "inside"),
    [("/etc/grpo-attack", "denied"), ("REPO", "denied"), ("/grpo-attack", "denied"), ("/tmp/grpo-attack", "wrote")],
)
def test_cannot_write_outside_scratch(api: httpx.Client, target: str, inside: str) -> None:
    """/tmp inside the sandbox is the run's own scratch: writing there works and the host's /tmp sees nothing."""
    path = str(REPO / "grpo-attack.txt") if target == "REPO" else target
    code = f"try:\n    open({path!r}, 'w').write('x')\n    print('wrote')\nexcept OSError:\n    print('denied')"
    assert execute(api, code)["stdout"] == inside + "\n"
    assert not Path(path).exists()


def test_cannot_read_the_services_files(api: httpx.Client) -> None:
    code = f"import os\nprint([p for p in ({str(REPO)!r}, '/root', '/home', '/work') if os.path.exists(p)])"
    assert execute(api, code)["stdout"] == "[]\n"


def test_orphan_processes_do_not_survive(api: httpx.Client) -> None:
    marker = f"grpo-orphan-{uuid.uuid4().hex}"
    sleeper = f"import time; time.sleep(60)  # {marker}"
    code = (
        "import os, subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True)\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', {sleeper!r}])\n    os._exit(0)\n"
        "print('spawned')\n"
    )
    assert execute(api, code)["stdout"] == "spawned\n"
    assert host_processes_with(marker) == []


def test_huge_output_is_output_limit(api: httpx.Client) -> None:
    result = execute(api, "while True:\n    print('x' * 10000)", timeout_s=5.0)
    assert result["status"] == "output_limit"
    assert len(result["stdout"]) <= 16 << 20  # the default max_output_bytes


@pytest.mark.parametrize("escape", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit(0)"])
def test_exit_before_the_tests_does_not_pass(api: httpx.Client, escape: str) -> None:
    body = {
        "language": "python",
        "code": f"```python\ndef add(a, b):\n    return a - b\n{escape}\n```",
        "tests": [{"assert": "def check(f):\n    assert f(1, 2) == 3\n\ncheck(add)\n"}],
    }
    response = api.post("/v1/verify/code", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert (result["passed"], result["total"]) == (0, 1)
    assert result["tests"][0]["verdict"] == "fail"
