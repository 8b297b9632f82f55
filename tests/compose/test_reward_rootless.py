"""The reward image with its sandbox rootless, as `docker-compose.rootless.yml` runs it: no root, no capability.

The container gets exactly the options that docker-compose.yml's reward service has once the rootless override
is merged over it (Compose v2's rules: `!reset` empties, `!override` replaces, sequences append, mappings merge).
They are read from the two files here, so the test and the files cannot drift. This machine's docker-compose is v1,
which cannot read those tags, so the test starts the container with `docker run` and the merged options. Then a
subset of the sandbox attack suite (tests/service/test_reward_attacks.py, tests/security/test_sandbox_escapes.py)
runs through /v1/execute inside it, and /v1/verify/code must still judge.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from grpo.common.net import free_port

pytestmark = pytest.mark.compose
REPO = Path(__file__).resolve().parents[2]
TOKEN = "rootless-test-s3cret"
SECRET = f"grpo-attack-secret-{uuid.uuid4().hex}"  # in the service's environment: runs must never see it
AUTH = {"authorization": f"Bearer {TOKEN}"}


class Tagged:
    """A value carrying Compose v2's merge tag (!reset or !override)."""

    def __init__(self, tag: str, value: Any) -> None:
        self.tag, self.value = tag, value


class ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's `!reset` and `!override` tags."""


def _tagged(loader: yaml.SafeLoader, node: yaml.Node) -> Tagged:
    if isinstance(node, yaml.SequenceNode):
        return Tagged(node.tag, loader.construct_sequence(node, deep=True))
    if isinstance(node, yaml.MappingNode):
        return Tagged(node.tag, loader.construct_mapping(node, deep=True))
    return Tagged(node.tag, loader.construct_scalar(node))  # type: ignore[arg-type]


for _tag in ("!reset", "!override"):
    ComposeLoader.add_constructor(_tag, _tagged)


def merged_reward_service() -> dict[str, Any]:
    """docker-compose.yml's reward service with docker-compose.rootless.yml's merged over it."""
    base = yaml.load((REPO / "docker-compose.yml").read_text(), Loader=ComposeLoader)["services"]["reward"]
    override = yaml.load((REPO / "docker-compose.rootless.yml").read_text(), Loader=ComposeLoader)["services"]["reward"]
    service = dict(base)
    for key, value in override.items():
        if isinstance(value, Tagged):
            service[key] = value.value  # !reset [] empties, !override replaces
        elif isinstance(value, dict):
            service[key] = {**service.get(key, {}), **value}
        elif isinstance(value, list):
            service[key] = [*service.get(key, []), *value]
        else:
            service[key] = value
    return service


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with nothing set: the default (this test sets none of them)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def docker_run_options(service: dict[str, Any], secrets: Path) -> list[str]:
    """`docker run` options for what compose would give the container (its volumes: the token and config only)."""
    options = ["--user", str(service["user"])]
    options += [f"--cap-drop={cap}" for cap in dict.fromkeys(service.get("cap_drop", []))]  # v2 drops repeats
    options += [f"--cap-add={cap}" for cap in service.get("cap_add", [])]
    options += [f"--security-opt={interpolate(opt)}" for opt in service.get("security_opt", [])]
    options += ["--read-only"] if service.get("read_only") else []
    options += [f"--tmpfs={path}" for path in service.get("tmpfs", [])]
    options += [f"--env={key}={value}" for key, value in service.get("environment", {}).items()]
    options += ["-v", f"{REPO / 'deploy/compose'}:/etc/grpo:ro", "-v", f"{secrets}:/run/grpo/api:ro", "-v", "/cache"]
    return options


@pytest.fixture(scope="module")
def rootless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The full reward image, started with the merged options; yields its URL, name and options."""
    service = merged_reward_service()
    secrets = tmp_path_factory.mktemp("api")
    (secrets / "token").write_text(TOKEN)
    secrets.chmod(0o755)
    (secrets / "token").chmod(0o644)  # readable by the service's uid, as the compose secrets volume is
    options = docker_run_options(service, secrets)
    port = free_port()
    name = f"grpo-reward-rootless-{port}"
    subprocess.run(
        ["docker", "run", "-d", "--name", name, *options, "-e", f"GRPO_ATTACK_SECRET={SECRET}",
         "-p", f"127.0.0.1:{port}:8002", "grpo-reward:latest", *service["command"]],
        check=True, capture_output=True, timeout=120, cwd=REPO,  # the seccomp profile's path is the repo's
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):
            if time.monotonic() > deadline or not running(name):
                pytest.fail(f"the rootless reward container did not become ready:\n{logs(name)[-3000:]}")
            time.sleep(0.5)
        yield {"url": url, "name": name, "options": options}
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def running(name: str) -> bool:
    state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True)
    return state.stdout.strip() == "true"


def logs(name: str) -> str:
    done = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def in_container(name: str, script: str) -> str:
    done = subprocess.run(["docker", "exec", name, "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def execute(rootless: dict[str, Any], code: str, **extra: Any) -> dict[str, Any]:
    reply = httpx.post(f"{rootless['url']}/v1/execute", headers=AUTH, timeout=60,
                       json={"language": "python", "code": code, **extra})  # fmt: skip
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_the_options_are_rootless(rootless: dict[str, Any]) -> None:
    options = rootless["options"]
    assert "--user" in options and options[options.index("--user") + 1] == "10001:10001", options
    assert "--cap-drop=ALL" in options and not [o for o in options if o.startswith("--cap-add")], options
    assert "--security-opt=seccomp=deploy/seccomp/reward-rootless.json" in options, options
    assert "--security-opt=seccomp:unconfined" not in options and "--env=GRPO_REWARD_SANDBOX_MODE=rootless" in options


def test_the_service_runs_rootless_as_a_user_without_capabilities(rootless: dict[str, Any]) -> None:
    health = httpx.get(f"{rootless['url']}/healthz", timeout=10).json()
    assert "rootless mode" in health["sandbox"], health
    assert "sandbox mode: rootless" in logs(rootless["name"])
    status = dict(line.split(":", 1) for line in in_container(rootless["name"], "cat /proc/1/status").splitlines())
    assert status["Uid"].split() == ["10001"] * 4 and status["Gid"].split() == ["10001"] * 4, status
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, (caps, status[caps])
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2", status  # our profile, filtering
    # Every process of the container, the zygotes and their runs included, is uid 10001 to the host.
    uids = in_container(rootless["name"], "grep -h '^Uid:' /proc/[0-9]*/status | sort -u").split()
    assert set(uids) == {"Uid:", "10001"}, uids


def test_a_correct_answer_still_passes(rootless: dict[str, Any]) -> None:
    for language, code in {
        "python": "print(sum(map(int, input().split())))",
        "c": '#include <stdio.h>\nint main(){ int a, b; scanf("%d %d", &a, &b); printf("%d\\n", a + b); }',
    }.items():
        body = {"language": language, "code": code, "tests": [{"stdin": "2 40", "expected_stdout": "42"}]}
        reply = httpx.post(f"{rootless['url']}/v1/verify/code", json=body, headers=AUTH, timeout=120)
        assert reply.status_code == 200 and reply.json()["passed"] == 1, (language, reply.text)
    wrong = {"language": "python", "code": "print(41)", "tests": [{"stdin": "2 40", "expected_stdout": "42"}]}
    assert httpx.post(f"{rootless['url']}/v1/verify/code", json=wrong, headers=AUTH, timeout=120).json()["passed"] == 0


def test_the_network_is_blocked(rootless: dict[str, Any]) -> None:
    code = (
        "import socket\n"
        "for host, port in (('127.0.0.1', 8002), ('127.0.0.1', 7052), ('1.1.1.1', 53)):\n"
        "    try:\n        socket.create_connection((host, port), timeout=1)\n        print('reached', host, port)\n"
        "    except OSError:\n        print('blocked', host, port)\n"
    )
    result = execute(rootless, code, timeout_s=5.0)
    assert result["stdout"] == "blocked 127.0.0.1 8002\nblocked 127.0.0.1 7052\nblocked 1.1.1.1 53\n", result


def test_cannot_see_the_services_processes_or_environment(rootless: dict[str, Any]) -> None:
    code = (
        "import os\nprint(dict(os.environ))\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\nprint('pids', pids)\n"
        "for p in pids + [1]:\n"
        "    for what in ('cmdline', 'environ'):\n"
        "        try:\n            print(open(f'/proc/{p}/{what}', 'rb').read())\n        except OSError:\n            pass\n"
    )
    result = execute(rootless, code)
    assert result["status"] == "ok", result
    pids = eval(next(line for line in result["stdout"].splitlines() if line.startswith("pids ")).removeprefix("pids "))
    assert max(pids) < 50, pids  # its own PID namespace: a handful of pids
    for leak in (SECRET, "GRPO_", "grpo-reward", "grpo.reward", TOKEN):
        assert leak not in result["stdout"], leak


@pytest.mark.parametrize(("target", "inside"), [("/etc/grpo-attack", "denied"), ("/grpo-attack", "denied"),
                                                 ("/opt/venv/grpo-attack", "denied"), ("/tmp/grpo-attack", "wrote")])  # fmt: skip
def test_cannot_write_outside_scratch(rootless: dict[str, Any], target: str, inside: str) -> None:
    """/tmp inside the sandbox is the run's own scratch: writing there works and the container's /tmp sees nothing."""
    code = f"try:\n    open({target!r}, 'w').write('x')\n    print('wrote')\nexcept OSError:\n    print('denied')"
    assert execute(rootless, code)["stdout"] == inside + "\n"
    assert in_container(rootless["name"], f"test -e {target} && echo there || echo absent").strip() == "absent"


def test_time_limit_and_fork_bomb_are_contained(rootless: dict[str, Any]) -> None:
    started = time.monotonic()
    assert execute(rootless, "while True:\n    pass", timeout_s=1.0)["status"] == "timeout"
    assert time.monotonic() - started < 4.0
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    assert execute(rootless, bomb, timeout_s=1.5)["status"] == "timeout"
    assert execute(rootless, "print('after')")["stdout"] == "after\n"
    bomb = "x = []\nwhile True:\n    x.append(bytearray(50 << 20))"
    assert execute(rootless, bomb, timeout_s=5.0, memory_mb=256)["status"] == "memory_limit"


def test_ptrace_and_signals_reach_nothing_outside_the_run(rootless: dict[str, Any]) -> None:
    code = (
        "import ctypes, os, signal\nlibc = ctypes.CDLL(None, use_errno=True)\nattached, sent = [], []\n"
        "for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()] + [1, os.getppid()] + list(range(2, 200)):\n"
        "    if pid == os.getpid():\n        continue\n"
        "    if libc.ptrace(16, pid, 0, 0) == 0:\n        attached.append(pid)\n"
        "    for sig in (signal.SIGKILL, signal.SIGSTOP):\n"
        "        try:\n            os.kill(pid, sig)\n            sent.append(pid)\n        except OSError:\n            pass\n"
        "print('attached', attached, flush=True)\nos.kill(-1, signal.SIGKILL)\n"
    )
    result = execute(rootless, code, timeout_s=3)
    assert "attached []" in result["stdout"], result
    time.sleep(0.5)
    stopped = in_container(rootless["name"], "grep -l '^State:.*stopped' /proc/[0-9]*/status || true").split()
    assert not stopped, f"service processes stopped by the sandbox: {stopped}"
    assert httpx.get(f"{rootless['url']}/healthz", timeout=10).status_code == 200
    assert execute(rootless, "print(6 * 7)")["stdout"] == "42\n"
