"""Code limits seen through the API of a real reward service: test data of megabytes (max_test_chars), the stdout
cap (max_output_bytes) and stderr, exit() in Python solutions and checkers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service

SUM = "import sys\nprint(sum(map(int, sys.stdin.read().split())))"


@pytest.fixture(scope="module")
def service() -> Iterator[RewardService]:
    """Small caps, so that crossing them costs little: 1 MB of test data, 300 kB of stdout."""
    started = start_reward_service("--max-test-chars", "1000000", "--max-output-bytes", "300000", workers=1)
    yield started
    stop_reward_service(started)


def verify(service: RewardService, **body: Any) -> httpx.Response:
    return httpx.post(f"{service.http_url}/v1/verify/code", json=body, timeout=120)


def test_test_data_of_megabytes_is_not_capped_at_the_code_limit(service: RewardService) -> None:
    """stdin and expected_stdout were capped at max_code_chars (200,000): CodeContests tests run to megabytes."""
    numbers = "\n".join(map(str, range(120_000)))  # 779 kB
    reply = verify(service, code=SUM, tests=[{"stdin": numbers, "expected_stdout": str(sum(range(120_000)))}])
    assert reply.status_code == 200, reply.text
    assert reply.json()["tests"][0]["verdict"] == "pass"
    expected = " ".join(map(str, range(40_000)))  # 228,889 characters
    answer = verify(service, code="print(*range(40_000))", tests=[{"expected_stdout": expected}])
    assert answer.status_code == 200 and answer.json()["passed"] == 1, answer.text[:500]


def test_test_data_past_max_test_chars_is_400_naming_it(service: RewardService) -> None:
    reply = verify(service, code=SUM, tests=[{"stdin": "1 " * 600_000, "expected_stdout": "600000"}])
    assert reply.status_code == 400 and "max_test_chars" in reply.text and "tests[0].stdin" in reply.text
    code = verify(service, code="#" * 200_001, tests=[{"stdin": "", "expected_stdout": ""}])
    assert code.status_code == 400 and "max_code_chars" in code.text


def test_the_stdout_cap_is_the_servers_setting_and_stderr_does_not_count(service: RewardService) -> None:
    within = verify(service, code="print('a' * 299_999)", tests=[{"expected_stdout": "a" * 299_999}])
    assert within.json()["tests"][0]["verdict"] == "pass", within.text[:300]
    over = verify(service, code="print('a' * 300_000)", tests=[{"expected_stdout": "a" * 300_000}])
    assert over.json()["tests"][0]["verdict"] == "output_limit"
    debug = "import sys\nfor i in range(70000):\n    print('debug line', i, file=sys.stderr)\nprint(42)"  # 1.2 MB
    noisy = verify(service, code=debug, tests=[{"expected_stdout": "42"}, {"expected_stdout": "42"}])
    assert [t["verdict"] for t in noisy.json()["tests"]] == ["pass", "pass"]
    executed = httpx.post(f"{service.http_url}/v1/execute", json={"code": debug}, timeout=60).json()
    assert executed["status"] == "ok" and executed["stdout"] == "42\n" and len(executed["stderr"]) < 70_000


def test_exit_in_a_solution_and_in_a_python_checker(service: RewardService) -> None:
    solution = "n = int(input())\nif n < 0:\n    print(-1)\n    exit()\nprint(n)"
    tests = [{"stdin": "-5", "expected_stdout": "-1"}, {"stdin": "7", "expected_stdout": "7"}]
    assert verify(service, code=solution, tests=tests).json()["passed"] == 2
    checker = {"language": "python", "code": "import sys\nexit(0 if open(sys.argv[2]).read().split() == "
               "open(sys.argv[3]).read().split() else 1)"}  # fmt: skip
    judged = verify(
        service, code="print(1)", checker=checker, tests=[{"expected_stdout": "1"}, {"expected_stdout": "2"}]
    )
    assert [t["verdict"] for t in judged.json()["tests"]] == ["pass", "fail"], judged.text[:500]


def test_a_programs_own_signals_and_its_process_limit_through_the_api(service: RewardService) -> None:
    """Issue 33. A signal a program sends itself ends it as it would outside the sandbox, in a single run
    (/v1/execute) and in a batch (a request's tests) alike: a single run's program was its namespace's init, which
    ignored its raise(SIGTERM) (status ok) and died of SIGSEGV in abort(). A Java thread bomb is process_limit,
    not memory_limit."""
    term = '#include <signal.h>\n#include <stdio.h>\nint main(void){ raise(SIGTERM); puts("after"); return 0; }'
    executed = httpx.post(f"{service.http_url}/v1/execute", json={"language": "c", "code": term}, timeout=60).json()
    assert (executed["status"], executed["exit_code"], executed["stdout"]) == ("runtime_error", -15, ""), executed
    judged = verify(service, code="import os\nos.abort()", tests=[{"expected_stdout": "1"}] * 2).json()
    assert [(t["verdict"], t["exit_code"]) for t in judged["tests"]] == [("runtime_error", -6)] * 2, judged
    bomb = (
        "public class Main{public static void main(String[] a){while(true){Thread t=new Thread(()->{"
        "try{Thread.sleep(100000);}catch(InterruptedException e){}});t.setDaemon(true);t.start();}}}"
    )
    body = {"language": "java", "code": bomb, "timeout_s": 20}
    executed = httpx.post(f"{service.http_url}/v1/execute", json=body, timeout=120).json()
    assert executed["status"] == "process_limit" and "unable to create native thread" in executed["stderr"], executed
    judged = verify(service, language="java", code=bomb, timeout_s=20, tests=[{"expected_stdout": ""}] * 2).json()
    assert [t["verdict"] for t in judged["tests"]] == ["process_limit"] * 2, judged


def test_a_programs_own_signals_and_a_thread_bomb_over_grpc(service: RewardService) -> None:
    """The same over gRPC: Execute (a single run) and VerifyCode (a batch) report the signal the program sent
    itself, and a C thread bomb that hits the process limit is process_limit."""
    abort = "#include <stdlib.h>\nint main(void){ abort(); }"
    bomb = (  # small stacks: 8 MiB ones would reach the address-space limit first (that is memory_limit)
        "#include <pthread.h>\n#include <stdio.h>\n#include <unistd.h>\n"
        "static void *rest(void *p){ sleep(100); return p; }\n"
        "int main(void){ pthread_attr_t a; pthread_attr_init(&a); pthread_attr_setstacksize(&a, 1 << 16);\n"
        '  for(;;){ pthread_t t; if(pthread_create(&t, &a, rest, 0)){ perror("pthread_create"); return 1; } } }'
    )
    with grpc.insecure_channel(service.grpc_addr) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        run = stub.Execute(pb.ExecuteRequest(language="c", code=abort), timeout=60)
        assert (run.status, run.exit_code) == ("runtime_error", -6), run
        tests = [pb.CodeTest(stdio=pb.StdioTest(stdin="", expected_stdout=""))] * 2
        judged = stub.VerifyCode(pb.VerifyCodeRequest(language="c", code=abort, tests=tests), timeout=60)
        assert [(t.verdict, t.exit_code) for t in judged.tests] == [("runtime_error", -6)] * 2, judged
        run = stub.Execute(pb.ExecuteRequest(language="c", code=bomb), timeout=60)
        assert run.status == "process_limit", run
