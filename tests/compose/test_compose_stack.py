"""`docker compose up` as a user runs it: the three images, Redis, the shipped config, through the published ports.

Needs a Docker engine with the images built (`make test-compose` builds them first). The stack runs
with an API token, the README's verifier calls are made with and without it, the sandbox is probed
inside the reward container, the rollout is scaled to 2 replicas, each service is restarted while
GRPO runs, and the run must learn: the staged run (SFT, then GRPO) raises held-out accuracy by 20
points or more, with the trainer's accounting balanced. `down -v` must leave nothing behind.
The GRPO stage is shortened to 60 steps through an override file (the shipped config runs 200).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo.common.net import free_port
from tests.support.compose_project import REPO, ComposeProject
from tests.support.readme_examples import compose_results_commands
from tests.support.run_status import wait_for_status

pytestmark = pytest.mark.compose
log = logging.getLogger(__name__)
PROJECT = "grpocomposetest"
TOKEN = "compose-test-s3cret"
GRPO_STEPS = 60
IMAGES = {
    "reward": ("grpo.reward", "--optional=torch,transformers,tokenizers,safetensors,huggingface_hub,rich"),
    "rollout": ("grpo.rollout",),
    # The rollout package is installed beside the trainer for colocated mode (docs/colocated.md), not in its image.
    "trainer": ("grpo.trainer", "grpo.algo", "--optional=grpo.rollout"),
}


@dataclass
class Stack(ComposeProject):
    reward_port: int
    trainer_port: int
    started: float = 0.0  # time.monotonic() at `up`
    seen: dict[str, Any] = field(default_factory=dict)  # what the tests measured, for the report

    def status(self) -> dict[str, Any] | None:
        """The trainer's /v1/status, or None while it is not answering (starting, restarting, exited)."""
        try:
            reply = httpx.get(f"http://127.0.0.1:{self.trainer_port}/v1/status", timeout=5,
                              headers={"authorization": f"Bearer {TOKEN}"})  # fmt: skip
        except httpx.HTTPError:
            return None
        return reply.json() if reply.status_code == 200 else None

    def logs(self, service: str, tail: int = 60) -> str:
        return super().logs(service, tail)

    def wait(self, what: str, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """Poll the trainer's status until `predicate` holds; fail with the services' logs."""
        return wait_for_status(self.status, predicate, what, timeout, lambda: self.logs("trainer"), self.note)

    def note(self, status: dict[str, Any]) -> None:
        """Remember the most tasks each replica was seen to have done, and the last status."""
        for r in status.get("replicas", []):
            done = self.seen.setdefault("replica_tasks", {})
            done[r["replica_id"]] = max(done.get(r["replica_id"], 0), int(r.get("tasks_done", 0)))
        if status.get("phase") in ("grpo", "eval") and len(status.get("replicas", [])) >= 2:
            self.seen["both_replicas_working"] = self.seen.get("both_replicas_working", False) or all(
                r.get("tasks_done", 0) > 0 for r in status["replicas"]
            )
        self.seen["last_status"] = status

    def note_status(self) -> None:
        """Note the trainer's status if it answers (while waiting on something else, to keep noting replicas)."""
        status = self.status()
        if status is not None:
            self.note(status)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    override = tmp_path_factory.mktemp("compose") / "override.yml"
    override.write_text(
        "services:\n  trainer:\n    environment:\n"
        f"      GRPO_TRAINER_STEPS: '{GRPO_STEPS}'\n      GRPO_TRAINER_EVAL_EVERY: '20'\n"
    )
    reward_port, trainer_port = free_port(), free_port()
    env = {**os.environ, "GRPO_API_TOKEN": TOKEN, "GRPO_REWARD_HTTP_PORT": str(reward_port),
           "GRPO_TRAINER_HTTP_PORT": str(trainer_port), "COMPOSE_PROFILES": "cpu"}  # fmt: skip
    s = Stack(PROJECT, [REPO / "docker-compose.yml", override], env, reward_port, trainer_port)
    s.compose("down", "-v", "--remove-orphans", check=False)  # a previous run's leftovers
    s.started = time.monotonic()
    try:
        s.compose("up", "-d")  # returns once each dependency is healthy, in order
        s.seen["up_s"] = round(time.monotonic() - s.started, 1)
        yield s
    finally:
        report = os.environ.get("GRPO_COMPOSE_REPORT")
        if report:
            Path(report).write_text(json.dumps({k: v for k, v in s.seen.items() if k != "last_status"}, indent=1))
        s.compose("down", "-v", "--remove-orphans", check=False)


@pytest.mark.parametrize("service", list(IMAGES))
def test_each_image_imports_every_module_it_ships(service: str) -> None:
    args = [*IMAGES[service], "grpo.common", "grpo.v1"]
    done = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "python", "-v", f"{REPO / 'scripts'}:/scripts:ro",
         f"grpo-{service}:latest", "/scripts/check_image_imports.py", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["imported"] > 20


def test_verifier_examples_need_the_token(stack: Stack) -> None:
    url = f"http://127.0.0.1:{stack.reward_port}/v1/verify/math"
    body = {"answer": "<think>half</think><answer>\\frac{1}{2}</answer>", "gold": "0.5"}
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    reply = httpx.post(url, json=body, timeout=30, headers={"authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 200 and reply.json()["correct"] is True
    assert httpx.get(f"http://127.0.0.1:{stack.reward_port}/healthz", timeout=10).status_code == 200  # probes: open


def test_sandbox_inside_the_reward_container(stack: Stack) -> None:
    probe = (
        "import os, socket\n"
        "print('uid', os.getuid())\n"
        "for host, port in (('reward', 7052), ('redis', 6379), ('1.1.1.1', 53)):\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2); print('reached', host)\n"
        "    except OSError as e:\n"
        "        print('blocked', host, type(e).__name__)\n"
    )
    reply = httpx.post(
        f"http://127.0.0.1:{stack.reward_port}/v1/execute", timeout=60, headers={"authorization": f"Bearer {TOKEN}"},
        json={"language": "python", "code": probe, "timeout_s": 10},
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["status"] == "ok", out
    uid = int(out["stdout"].split("uid ")[1].split()[0])
    assert uid not in (0, 10001), f"generated code ran as uid {uid}"
    assert "reached" not in out["stdout"] and out["stdout"].count("blocked") == 3, out["stdout"]
    health = httpx.get(f"http://127.0.0.1:{stack.reward_port}/healthz", timeout=10).json()
    stack.seen["sandbox_isolation"] = health.get("sandbox", health)
    # The image's default toolchains, each built and run inside the container's sandbox.
    assert {"python", "c", "cpp", "java", "javascript", "typescript", "go", "rust", "bash"} <= set(
        health["languages"]
    ), health
    programs = {
        "c": '#include <stdio.h>\nint main(){ int a, b; scanf("%d %d", &a, &b); printf("%d\\n", a + b); }',
        "cpp": "#include <iostream>\nint main(){ int a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }",
        "java": "public class Main{public static void main(String[] x){java.util.Scanner s=new java.util.Scanner("
        "System.in);System.out.println(s.nextInt()+s.nextInt());}}",
        "javascript": 'const [a,b]=require("fs").readFileSync(0,"utf8").split(/\\s+/).map(Number);console.log(a+b);',
        "typescript": 'const [a, b]: number[] = require("fs").readFileSync(0, "utf8").split(/\\s+/).map(Number);'
        "console.log(a + b);",
        "go": 'package main\nimport "fmt"\nfunc main(){ var a, b int; fmt.Scan(&a, &b); fmt.Println(a + b) }',
        "rust": "fn main(){ let mut s = String::new(); std::io::stdin().read_line(&mut s).unwrap();"
        ' let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect(); println!("{}", v[0] + v[1]); }',
        "bash": "read a b; echo $((a + b))",
    }
    for language, code in programs.items():
        body = {"language": language, "code": code, "tests": [{"stdin": "2 40", "expected_stdout": "42"}]}
        verdict = httpx.post(
            f"http://127.0.0.1:{stack.reward_port}/v1/verify/code", timeout=120, json=body,
            headers={"authorization": f"Bearer {TOKEN}"},
        ).json()  # fmt: skip
        assert verdict["passed"] == 1, (language, verdict)


def test_two_rollout_replicas_register(stack: Stack) -> None:
    stack.compose("up", "-d", "--no-recreate", "--scale", "rollout=2")
    stack.wait("2 live rollout replicas", lambda s: len(s.get("replicas", [])) == 2, timeout=600)


def test_grpo_learns_through_a_restart_of_every_service(stack: Stack) -> None:
    def grpo_step(at_least: int) -> Callable[[dict[str, Any]], bool]:
        return lambda s: s.get("stage", "").endswith("grpo") and s.get("step", 0) >= at_least

    stack.wait("GRPO step 8", grpo_step(8), timeout=1200)
    # Redis answers only with the generated password, and the reward container has no route to it at all.
    refused = stack.compose("exec", "-T", "redis", "redis-cli", "ping", check=False).stdout.strip()
    assert "NOAUTH" in refused, refused
    authed = "REDISCLI_AUTH=$(cat /run/grpo/redis/password) redis-cli ping"
    assert stack.compose("exec", "-T", "redis", "sh", "-c", authed).stdout.strip() == "PONG"
    probe = "import socket\ntry:\n    socket.create_connection(('redis', 6379), timeout=3)\nexcept OSError as e:\n    print('no', e)"
    assert stack.compose("exec", "-T", "reward", "python", "-c", probe).stdout.startswith("no"), "reward reached redis"
    stack.seen["memory"] = docker_memory()
    for service, after in (("reward", 14), ("rollout", 20), ("trainer", 26)):
        stack.compose("restart", service)
        stack.wait(f"GRPO step {after} after restarting {service}", grpo_step(after), timeout=600)
    # both replicas took tasks at some point (noted from every status read; a status read just after the trainer's
    # restart may list none yet, so the status that ends the wait is not the evidence)
    stack.wait("both replicas taking tasks", lambda s: stack.seen.get("both_replicas_working", False), 300)
    assert len([r for r, n in stack.seen["replica_tasks"].items() if n > 0]) == 2, stack.seen["replica_tasks"]
    code = stack.wait_exit("trainer", timeout=1200, while_waiting=stack.note_status)  # noting replicas meanwhile
    assert code == 0, stack.logs("trainer")  # a finished run exits 0
    stack.seen["up_to_done_s"] = round(time.monotonic() - stack.started, 1)
    last = json.loads(stack.read_file("trainer", "/checkpoints/stage-2-grpo/metrics.jsonl").splitlines()[-1])
    dropped = sum(v for k, v in last.items() if k.startswith("tasks/dropped/"))
    assert last["step"] == GRPO_STEPS and last["tasks/balanced"] == 1.0, last
    assert last["tasks/published"] == last["tasks/trained"] + dropped + last["tasks/in_flight"], last
    assert last["tasks/trained"] > 0
    stack.seen["accounting"] = {k: v for k, v in last.items() if k.startswith("tasks/")}
    summary = json.loads(stack.read_file("trainer", "/checkpoints/summary.json"))
    stack.seen["summary"] = {k: summary.get(k) for k in ("eval_accuracy_before", "eval_accuracy_after",
                                                         "eval_accuracy_gain", "grpo_steps", "wall_seconds")}  # fmt: skip
    stack.seen["stages"] = summary["stages"]
    assert [s["mode"] for s in summary["stages"]] == ["sft", "grpo"]
    assert summary["eval_accuracy_gain"] >= 0.20, summary["eval_history"]
    report = stack.read_file("trainer", "/checkpoints/report.md")
    assert "accuracy.png" in report and "## Stages" in report
    files = set(
        stack.compose("run", "--rm", "--no-deps", "--entrypoint", "ls", "trainer", "/checkpoints").stdout.split()
    )
    assert {"accuracy.png", "reward.png", "kl.png", "stage-1-sft", "stage-2-grpo"} <= files, files


def test_the_readme_copies_the_results_out_of_the_volume(stack: Stack, tmp_path: Path) -> None:
    """The README's commands, as written but for this test's project and files, after the trainer has exited."""
    assert stack.wait_exit("trainer", timeout=1200) == 0, stack.logs("trainer")  # at once if the run test saw it end
    compose = shlex.join(stack.command())
    script = compose_results_commands().replace("docker compose", compose)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=stack.env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    results = tmp_path / "results"
    assert {"summary.json", "report.md", "reward.png", "accuracy.png", "kl.png"} <= {p.name for p in results.iterdir()}
    assert json.loads((results / "summary.json").read_text())["grpo_steps"] == GRPO_STEPS
    assert (results / "accuracy.png").read_bytes().startswith(b"\x89PNG")


def test_down_leaves_nothing_behind(stack: Stack) -> None:
    assert any(stack.resources().values())
    stack.compose("down", "-v", "--remove-orphans")
    left = stack.resources()
    assert left == {"containers": [], "networks": [], "volumes": []}, left


def docker_memory() -> dict[str, str]:
    """Memory use per container of the project (docker stats), for the docs."""
    done = subprocess.run(
        ["docker", "stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}}"], capture_output=True, text=True
    )
    return {line.split()[0]: line.split(" ", 1)[1] for line in done.stdout.splitlines() if PROJECT in line}
