"""What a code run returns through the API of a real reward service, over HTTP and gRPC: a bounded head and tail
of each output stream with its byte count (issue 33: a 4-test stdout flood came back as 67 MB), exact bytes for
binary output and read-back files (base64), where a wrong answer differs, and NaN limits refused as not numbers."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service

CAP = 4_000_000  # the service's max_output_bytes here: a flood crosses it in milliseconds
DEFAULT_KEEP = 64 << 10  # bytes of each stream returned by default (head and tail halves)
RESPONSE_BUDGET = 8 << 20  # the default max_response_output_bytes
FLOOD = "import sys\nsys.stdout.write('HEAD')\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
# 1 MB of stdout between two markers, and 1 MB of stderr the same way: within every cap, so the run is ok.
BOTH = (
    "import sys\nsys.stdout.write('HEAD' + 'x' * 1_000_000 + 'TAIL')\n"
    "sys.stderr.write('EHEAD' + 'e' * 1_000_000 + 'ETAIL')\n"
)
BINARY = bytes(range(256))


@pytest.fixture(scope="module")
def service() -> Iterator[RewardService]:
    started = start_reward_service("--max-output-bytes", str(CAP), workers=2)
    yield started
    stop_reward_service(started)


@pytest.fixture
def stub(service: RewardService) -> Iterator[reward_pb2_grpc.RewardServiceStub]:
    # A client that would take a reply of any size: the service, not the client, must keep replies bounded.
    options = [("grpc.max_receive_message_length", 1 << 30)]
    with grpc.insecure_channel(service.grpc_addr, options=options) as channel:
        yield reward_pb2_grpc.RewardServiceStub(channel)


def post(service: RewardService, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{service.http_url}{path}", json=body, timeout=120)


def stdio(stdin: str = "", expected: str = "1") -> dict[str, str]:
    return {"stdin": stdin, "expected_stdout": expected}


# ---- 1. output comes back as a bounded head and tail ---------------------------------------------------------


def test_a_flood_of_four_tests_comes_back_bounded_with_its_byte_counts(service: RewardService) -> None:
    """4 tests of a stdout flood: each stopped at the cap (output_limit), and the reply holds 64 KiB of each
    stream, not the 4 MB each test wrote (16 MiB each at the default cap: 67 MB in all)."""
    reply = post(service, "/v1/verify/code", {"code": FLOOD, "tests": [stdio(str(i)) for i in range(4)]})
    assert reply.status_code == 200, reply.text[:300]
    assert len(reply.content) < 4 * 2 * DEFAULT_KEEP + 10_000, len(reply.content)
    for test in reply.json()["tests"]:
        assert test["verdict"] == "output_limit"
        assert (test["stdout_bytes"], test["stdout_truncated"], test["stdout_encoding"]) == (CAP, True, "utf-8")
        assert test["stdout"].startswith("HEAD") and test["stdout"].endswith("x" * 1000)
        assert f"[... {CAP - DEFAULT_KEEP} bytes of stdout cut ...]" in test["stdout"]
        assert len(test["stdout"].encode()) <= DEFAULT_KEEP + 100


def test_execute_returns_the_head_and_tail_of_both_streams(service: RewardService) -> None:
    reply = post(service, "/v1/execute", {"code": BOTH})
    assert reply.status_code == 200, reply.text[:300]
    run = reply.json()
    assert run["status"] == "ok" and len(reply.content) < 2 * DEFAULT_KEEP + 10_000, len(reply.content)
    assert (run["stdout_bytes"], run["stdout_truncated"]) == (1_000_008, True)
    assert run["stdout"].startswith("HEAD") and run["stdout"].endswith("TAIL")
    # The sandbox keeps stderr's first and last 32 KiB; the count is still what the program wrote.
    assert (run["stderr_bytes"], run["stderr_truncated"]) == (1_000_010, True)
    assert run["stderr"].startswith("EHEAD") and run["stderr"].endswith("ETAIL")
    assert "bytes of stderr cut ...]" in run["stderr"]
    small = post(service, "/v1/execute", {"code": "print(42)"}).json()
    assert (small["stdout"], small["stdout_bytes"], small["stdout_truncated"]) == ("42\n", 3, False)
    assert (small["stderr"], small["stderr_bytes"], small["stderr_truncated"]) == ("", 0, False)


def test_return_output_bytes_asks_for_less_or_more(service: RewardService) -> None:
    less = post(service, "/v1/execute", {"code": BOTH, "return_output_bytes": 1000}).json()
    assert less["stdout"] == "HEAD" + "x" * 496 + "\n[... 999008 bytes of stdout cut ...]\n" + "x" * 496 + "TAIL"
    whole = post(service, "/v1/execute", {"code": BOTH, "return_output_bytes": 2 << 20}).json()
    assert (whole["stdout_truncated"], whole["stdout"]) == (False, "HEAD" + "x" * 1_000_000 + "TAIL")
    nothing = post(service, "/v1/execute", {"code": BOTH, "return_output_bytes": 0}).json()
    assert (nothing["stdout"], nothing["stdout_bytes"], nothing["stdout_truncated"]) == ("", 1_000_008, True)
    tests = [stdio("1"), stdio("2")]
    judged = post(service, "/v1/verify/code", {"code": BOTH, "tests": tests, "return_output_bytes": 100}).json()
    assert [len(t["stdout"].encode()) < 200 and t["stdout_truncated"] for t in judged["tests"]] == [True, True]


def test_the_tests_of_a_response_share_its_output_budget(service: RewardService) -> None:
    """200 tests of 100 kB each: 64 KiB a stream would be 26 MB; they share the response's 8 MiB."""
    share = RESPONSE_BUDGET // (2 * 200)
    code = "print('y' * 100_000)"
    reply = post(service, "/v1/verify/code", {"code": code, "tests": [stdio(str(i)) for i in range(200)]})
    assert reply.status_code == 200, reply.text[:300]
    assert len(reply.content) < RESPONSE_BUDGET + 200 * 1000, len(reply.content)
    head, tail = share // 2, share - share // 2
    returned = "y" * head + f"\n[... {100_001 - share} bytes of stdout cut ...]\n" + "y" * (tail - 1) + "\n"
    for test in reply.json()["tests"]:
        assert (test["stdout"], test["stdout_bytes"], test["stdout_truncated"]) == (returned, 100_001, True)


def test_the_judge_and_the_checker_see_the_whole_stdout(service: RewardService) -> None:
    big = "a" * 300_000
    code = "print('a' * 300_000)"
    reply = post(service, "/v1/verify/code", {"code": code, "tests": [stdio("", big)]}).json()
    assert reply["tests"][0]["verdict"] == "pass" and reply["tests"][0]["stdout_truncated"], reply["tests"][0]["detail"]
    checker = {
        "language": "python",
        "code": "import sys\nsys.exit(0 if len(open(sys.argv[2]).read()) == 300001 else 1)",
    }
    checked = post(service, "/v1/verify/code", {"code": code, "tests": [stdio()], "checker": checker})
    assert checked.json()["tests"][0]["verdict"] == "pass", checked.text[:500]


def test_a_flood_over_grpc_is_bounded(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    """The 4-test flood's reply (67 MB at the default cap) was past gRPC's 64 MiB message limit: RESOURCE_EXHAUSTED."""
    tests = [pb.CodeTest(stdio=pb.StdioTest(stdin=str(i), expected_stdout="1")) for i in range(4)]
    reply = stub.VerifyCode(pb.VerifyCodeRequest(language="python", code=FLOOD, tests=tests), timeout=120)
    assert reply.ByteSize() < 4 * 2 * DEFAULT_KEEP + 10_000, reply.ByteSize()
    for test in reply.tests:
        assert test.verdict == "output_limit" and test.stdout.startswith("HEAD")
        assert (test.stdout_bytes, test.stdout_truncated, test.stdout_encoding) == (CAP, True, "utf-8")
    run = stub.Execute(pb.ExecuteRequest(language="python", code=BOTH, return_output_bytes=1000), timeout=60)
    assert run.stdout.startswith("HEAD") and run.stdout.endswith("TAIL") and run.stdout_truncated
    assert (run.stdout_bytes, run.stderr_bytes, run.stderr_truncated) == (1_000_008, 1_000_010, True)


# ---- 2. bytes come back exactly ------------------------------------------------------------------------------

WRITE_FILES = (
    "import sys\nopen('b.bin', 'wb').write(bytes(range(256)))\nopen('t.txt', 'w').write('héllo')\n"
    "sys.stdout.buffer.write(bytes(range(256)))\n"
)


def test_binary_read_back_and_stdout_come_back_as_base64(service: RewardService) -> None:
    reply = post(service, "/v1/execute", {"code": WRITE_FILES, "read_back": ["*.bin", "*.txt"]})
    assert reply.status_code == 200, reply.text[:300]
    run = reply.json()
    assert base64.b64decode(run["files"]["b.bin"], validate=True) == BINARY
    assert run["files"]["t.txt"] == "héllo"
    assert run["file_encodings"] == {"b.bin": "base64", "t.txt": "utf-8"}
    assert (run["stdout_encoding"], run["stdout_bytes"], run["stdout_truncated"]) == ("base64", 256, False)
    assert base64.b64decode(run["stdout"], validate=True) == BINARY
    text = post(service, "/v1/execute", {"code": "print('héllo')"}).json()
    assert (text["stdout"], text["stdout_encoding"], text["stdout_bytes"]) == ("héllo\n", "utf-8", 7)


def test_binary_stdout_of_a_test_is_base64_and_judged_on_its_bytes(service: RewardService) -> None:
    code = "import sys\nsys.stdout.buffer.write(b'\\xff\\n')"
    reply = post(service, "/v1/verify/code", {"code": code, "tests": [stdio("", "\ufffd")]}).json()
    [test] = reply["tests"]
    # Read with U+FFFD in place of the byte, the output equalled this expected output; the bytes do not.
    assert test["verdict"] == "fail"
    assert (test["stdout_encoding"], base64.b64decode(test["stdout"])) == ("base64", b"\xff\n")


def test_binary_read_back_and_stdout_over_grpc(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    request = pb.ExecuteRequest(language="python", code=WRITE_FILES, read_back=["*.bin", "*.txt"])
    run = stub.Execute(request, timeout=60)
    assert base64.b64decode(run.files["b.bin"], validate=True) == BINARY and run.files["t.txt"] == "héllo"
    assert dict(run.file_encodings) == {"b.bin": "base64", "t.txt": "utf-8"}
    assert run.stdout_encoding == "base64" and base64.b64decode(run.stdout) == BINARY


# ---- 3. a wrong answer says where ----------------------------------------------------------------------------


def test_a_wrong_answer_names_its_first_differing_line(service: RewardService, stub: Any) -> None:
    tests = [stdio("", "1\n2\n3\n"), stdio("", "1 2 3.5")]
    reply = post(service, "/v1/verify/code", {"code": "print(1)\nprint(2)\nprint(4)", "tests": tests[:1]}).json()
    assert reply["tests"][0]["detail"] == (
        "stdout does not match the expected output (lines): line 3: expected '3', got '4'"
    )
    floats = post(service, "/v1/verify/code", {"code": "print(1, 2, 3.6)", "tests": tests[1:], "compare": "float"})
    assert "token 3: expected '3.5', got '3.6'" in floats.json()["tests"][0]["detail"]
    request = pb.VerifyCodeRequest(
        language="python", code="print(1)", tests=[pb.CodeTest(stdio=pb.StdioTest(expected_stdout="1\n2"))]
    )
    detail = stub.VerifyCode(request, timeout=60).tests[0].detail
    assert detail.endswith("line 2: expected '2', got the end of the output"), detail


# ---- 4. NaN is not a number ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/v1/execute", '{"code": "print(1)", "timeout_s": NaN}', "timeout_s"),
        ("/v1/verify/code", '{"code": "print(1)", "tests": [{"expected_stdout": "1", "timeout_s": NaN}]}', "timeout_s"),
        ("/v1/verify/code", '{"code": "1", "compare": "float", "abs_tol": NaN, "tests": [{"assert": "1"}]}', "abs_tol"),
        ("/v1/verify/math", '{"answer": "1", "gold": "1", "timeout_s": NaN}', "timeout_s"),
    ],
)
def test_a_nan_limit_is_a_422_that_says_it_is_not_a_number(
    service: RewardService, path: str, body: str, where: str
) -> None:
    reply = httpx.post(
        f"{service.http_url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert reply.status_code == 422, reply.text
    said = [p["msg"] for p in reply.json()["detail"] if where in p["loc"]]  # (a union names both of its shapes)
    assert any("NaN is not a number" in msg for msg in said) and not any("3600" in msg for msg in said), said


def test_a_nan_limit_over_grpc_is_invalid_argument(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    for method, request in (
        ("Execute", pb.ExecuteRequest(language="python", code="print(1)", timeout_s=float("nan"))),
        ("VerifyMath", pb.VerifyMathRequest(answer="1", gold="1", timeout_s=float("nan"))),
    ):
        with pytest.raises(grpc.RpcError) as err:
            getattr(stub, method)(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "timeout_s" in err.value.details() and "not a number" in err.value.details(), err.value.details()
