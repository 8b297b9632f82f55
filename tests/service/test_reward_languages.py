"""A reward service serving Python and Bash only (`--languages`; the slim image has no other toolchain): what it
lacks is a 400 that names what it has, for the program and for a checker alike, never a sandbox_error on every
test."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest

from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service

TESTS = [{"stdin": "5", "expected_stdout": "0 5"}]
PYTHON_CHECKER = (  # any two numbers that sum to n
    "import sys\nn = int(open(sys.argv[1]).read())\na, b = map(int, open(sys.argv[2]).read().split())\n"
    "sys.exit(0 if a + b == n else 1)\n"
)


@pytest.fixture(scope="module")
def python_only() -> Iterator[RewardService]:
    service = start_reward_service("--languages", "python,bash", workers=1)
    yield service
    stop_reward_service(service)


def test_the_server_has_python_and_bash_only(python_only: RewardService) -> None:
    health = httpx.get(f"{python_only.http_url}/healthz", timeout=5).json()
    assert health["languages"] == ["bash", "python"], health


def test_a_checker_in_a_missing_language_is_400_naming_what_is_served(python_only: RewardService) -> None:
    """The checker's language defaults to cpp: without a C++ compiler, any checker request used to answer 200
    with sandbox_error on every test."""
    body = {"code": "n = int(input())\nprint(1, n - 1)", "tests": TESTS, "checker": {"code": "int main(){}"}}
    reply = httpx.post(f"{python_only.http_url}/v1/verify/code", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert "checker.language: 'cpp' is not served here" in reply.text and "'python'" in reply.text, reply.text
    item = {"id": "a", "completion": body["code"], "checks": {"code": {"tests": TESTS, "checker": body["checker"]}}}
    scored = httpx.post(f"{python_only.http_url}/v1/score", json={"items": [item]}, timeout=60)
    assert scored.status_code == 400, scored.text
    assert "items[0].checks.code.checker.language: 'cpp' is not served here" in scored.text, scored.text
    # A checker in a language the server has still decides.
    python = {**body, "checker": {"language": "python", "code": PYTHON_CHECKER}}
    judged = httpx.post(f"{python_only.http_url}/v1/verify/code", json=python, timeout=60)
    assert judged.status_code == 200 and judged.json()["passed"] == 1, judged.text


def test_a_checker_in_a_missing_language_is_invalid_argument(python_only: RewardService) -> None:
    checker = pb.CheckerProgram(language="java", code="class Main {}")
    code = pb.CodeCheck(tests=[pb.CodeTest(stdio=pb.StdioTest(stdin="5", expected_stdout="0 5"))], checker=checker)
    with grpc.insecure_channel(python_only.grpc_addr) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.VerifyCode(pb.VerifyCodeRequest(code="print(0, 5)", tests=code.tests, checker=checker), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "checker.language: 'java' is not served here" in err.value.details()
        items = [pb.ScoreItem(id="a", completion="print(0, 5)", checks=pb.Checks(code=code))]
        with pytest.raises(grpc.RpcError) as err:
            stub.Score(pb.ScoreRequest(items=items), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "checker.language: 'java' is not served here" in err.value.details()
