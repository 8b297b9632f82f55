"""The reward image on its own, as a verifier user runs it: `docker run` with the sandbox's capabilities.

The slim variant (`--build-arg LANGUAGES=python`, tagged `grpo-reward:latest-python` by `make images`) serves
Python and Bash only, says so on /healthz (and that its single runs start from the C init built in the image's
build stage), and answers a request for another language with a 400 that names
what it has. The full image builds a Codeforces-style checker that includes the vendored testlib.h.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from grpo.common.net import free_port

pytestmark = pytest.mark.compose
SANDBOX_FLAGS = [  # as docker-compose.yml runs the reward service
    "--user", "0", "--cap-add", "SYS_ADMIN", "--cap-add", "SETUID", "--cap-add", "SETGID", "--cap-add", "KILL",
    "--security-opt", "no-new-privileges:true", "--security-opt", "seccomp:unconfined",
    "--security-opt", "apparmor:unconfined",
]  # fmt: skip


def serve(image: str) -> Iterator[str]:
    """Run `image` with a published HTTP port; yield its base URL once /healthz answers; remove it after."""
    port = free_port()
    name = f"grpo-reward-test-{port}"
    subprocess.run(
        ["docker", "run", "-d", "--rm", "--name", name, *SANDBOX_FLAGS, "-p", f"127.0.0.1:{port}:8002",
         # Inside its container the service binds 0.0.0.0: without a token it runs only when told it may
         # (published here on the host's loopback alone).
         "-e", "GRPO_REWARD_ALLOW_UNAUTHENTICATED=1", image],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True).stderr
                pytest.fail(f"{image} did not become healthy in 120 s:\n{logs[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def slim() -> Iterator[str]:
    yield from serve("grpo-reward:latest-python")


@pytest.fixture(scope="module")
def full() -> Iterator[str]:
    yield from serve("grpo-reward:latest")


def image_mb(image: str) -> float:
    size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", image], capture_output=True, text=True)
    return int(size.stdout) / 1e6


def test_the_slim_image_serves_python_and_says_what_it_lacks(slim: str) -> None:
    health = httpx.get(f"{slim}/healthz", timeout=10).json()
    assert sorted(health["languages"]) == ["bash", "python"], health
    # No compiler in this image: its single runs' C init was built in the build stage ($GRPO_SANDBOX_INIT).
    assert "static C init" in health["sandbox"], health
    python = {"language": "python", "code": "print(sum(map(int, input().split())))",
              "tests": [{"stdin": "2 40", "expected_stdout": "42"}]}  # fmt: skip
    assert httpx.post(f"{slim}/v1/verify/code", json=python, timeout=60).json()["passed"] == 1
    c = {**python, "language": "c", "code": "int main(){ return 0; }"}
    reply = httpx.post(f"{slim}/v1/verify/code", json=c, timeout=60)
    assert reply.status_code == 400 and "python" in reply.text and "'c'" in reply.text, reply.text
    # No toolchains: a fraction of the full image.
    assert image_mb("grpo-reward:latest-python") < 0.5 * image_mb("grpo-reward:latest")


def test_the_full_image_builds_a_testlib_checker(full: str) -> None:
    checker = (
        '#include "testlib.h"\n'
        "int main(int argc, char* argv[]) {\n"
        "    registerTestlibCmd(argc, argv);\n"
        '    long long n = inf.readLong(), a = ouf.readLong(0, n, "a"), b = ouf.readLong(0, n, "b");\n'
        '    if (a + b != n) quitf(_wa, "%lld + %lld != %lld", a, b, n);\n'
        '    quitf(_ok, "fine");\n'
        "}\n"
    )
    body = {
        "language": "python", "code": "n = int(input())\nprint(1, n - 1)",
        "tests": [{"stdin": "7", "expected_stdout": "0 7"}, {"stdin": "3", "expected_stdout": "3 0"}],
        "checker": {"language": "cpp", "code": checker},
    }  # fmt: skip
    verdict = httpx.post(f"{full}/v1/verify/code", json=body, timeout=180).json()
    assert verdict["passed"] == 2, verdict
    wrong = httpx.post(f"{full}/v1/verify/code", json={**body, "code": "print(1, 1)"}, timeout=180).json()
    assert wrong["passed"] == 0 and "1 + 1 != 7" in wrong["tests"][0]["detail"], wrong
