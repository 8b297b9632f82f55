"""The reward service over gRPC: every RPC, INVALID_ARGUMENT on bad input, deadlines, health, reflection, the client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from grpo.common.net import free_port
from grpo.common.reward_client import RewardClient, RewardServiceError
from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc

BLOWUP = "\\boxed{\\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}}"
# Two weights of 1e308 on an item that passes both checks summed to infinity, which the answer could not carry.
HUGE_WEIGHTS = pb.ScoreItem(
    id="a",
    completion="<think>t</think><answer>4</answer>",
    checks=pb.Checks(math=pb.MathCheck(gold="4"), format=pb.FormatCheck()),
    weights={"math": 1e308, "format": 1e308},
)


@pytest.fixture
def channel(live_reward: Any) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(live_reward.grpc_addr) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> reward_pb2_grpc.RewardServiceStub:
    return reward_pb2_grpc.RewardServiceStub(channel)


def test_health_and_reflection(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", "grpo.v1.RewardService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert "grpo.v1.RewardService" in services


def test_verify_math_execute_verify_code(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    math = stub.VerifyMath(
        pb.VerifyMathRequest(answer="\\boxed{\\frac{1}{2^{98}}}", gold="\\frac{1}{2^{99}}"), timeout=30
    )
    assert math.status == "incorrect" and math.HasField("correct") and not math.correct
    unparseable = stub.VerifyMath(pb.VerifyMathRequest(answer="\\boxed{3}", gold=""), timeout=30)
    assert unparseable.status == "unparseable_gold" and not unparseable.HasField("correct")
    run = stub.Execute(pb.ExecuteRequest(language="python", code="print(6*7)"), timeout=30)
    assert run.status == "ok" and run.stdout.strip() == "42" and run.exit_code == 0
    code = stub.VerifyCode(
        pb.VerifyCodeRequest(
            language="python",
            code="```python\ndef f():\n    return 1\n```",
            tests=[pb.CodeTest(**{"assert": "assert f() == 1"}), pb.CodeTest(stdio=pb.StdioTest(expected_stdout="x"))],
        ),
        timeout=30,
    )
    assert [t.verdict for t in code.tests] == ["pass", "fail"] and (code.passed, code.total) == (1, 2)


def _items(n: int) -> list[pb.ScoreItem]:
    return [
        pb.ScoreItem(
            id=f"i{k}",
            completion=f"<think>adding</think><answer>{k}</answer>",
            checks=pb.Checks(math=pb.MathCheck(gold=str(k % 3)), format=pb.FormatCheck()),
        )
        for k in range(n)
    ]


def test_math_settings_over_grpc(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    """math-verify's settings per request, in VerifyMath and in a Score item's math check."""
    third = {"answer": "0.3333", "gold": "\\frac{1}{3}"}
    assert stub.VerifyMath(pb.VerifyMathRequest(**third), timeout=30).status == "incorrect"  # 6 places by default
    assert stub.VerifyMath(pb.VerifyMathRequest(**third, precision=4), timeout=30).status == "correct"
    loose = pb.VerifyMathRequest(answer="$f(y)$", gold="$f(x)$", strict=False, extraction=["latex"])
    assert stub.VerifyMath(loose, timeout=30).status == "correct"
    checks = [pb.Checks(math=pb.MathCheck(gold="\\frac{1}{3}", precision=p)) for p in (6, 4)]
    reply = stub.Score(pb.ScoreRequest(items=[pb.ScoreItem(id=str(i), completion="\\boxed{0.3333}", checks=c)
                                              for i, c in enumerate(checks)]), timeout=30)  # fmt: skip
    assert [r.reward for r in reply.results] == [0.0, 1.0]
    restated = {"answer": "<answer>047+586</answer>", "gold": "633"}  # the question copied as its answer
    assert stub.VerifyMath(pb.VerifyMathRequest(**restated), timeout=30).status == "incorrect"
    assert stub.VerifyMath(pb.VerifyMathRequest(**restated, allow_unevaluated=True), timeout=30).status == "correct"
    checks = [pb.Checks(math=pb.MathCheck(gold="633", allow_unevaluated=a)) for a in (False, True)]
    reply = stub.Score(pb.ScoreRequest(items=[pb.ScoreItem(id=str(i), completion="\\boxed{586+47}", checks=c)
                                              for i, c in enumerate(checks)]), timeout=30)  # fmt: skip
    assert [r.reward for r in reply.results] == [0.0, 1.0]


def test_judge_options_over_grpc(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    tests = [pb.CodeTest(stdio=pb.StdioTest(stdin="3", expected_stdout="0.333333333"))]
    request = pb.VerifyCodeRequest(language="python", code="print(1 / int(input()))", tests=tests)
    assert stub.VerifyCode(request, timeout=30).tests[0].verdict == "fail"  # lines: the default
    request.compare = "float"
    reply = stub.VerifyCode(request, timeout=30)
    assert reply.tests[0].verdict == "pass" and reply.tests[0].peak_memory_mb > 0


def test_score_and_stream_return_every_item(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    batch = stub.Score(pb.ScoreRequest(items=_items(12)), timeout=60)
    assert [r.id for r in batch.results] == [f"i{k}" for k in range(12)]
    for k, r in enumerate(batch.results):
        assert r.status == "ok" and r.reward == (2.0 if k < 3 else 1.0)
    streamed = list(stub.ScoreStream(pb.ScoreRequest(items=_items(12)), timeout=60))
    assert sorted(r.id for r in streamed) == sorted(f"i{k}" for k in range(12))
    assert {r.id: r.reward for r in streamed} == {r.id: r.reward for r in batch.results}


@pytest.mark.parametrize(
    ("method", "request_", "needle"),
    [
        ("Execute", pb.ExecuteRequest(language="cobol", code="x"), "language"),
        ("VerifyMath", pb.VerifyMathRequest(answer="1", gold="1", timeout_s=-2), "timeout_s"),
        ("VerifyMath", pb.VerifyMathRequest(answer="1", gold="1", extraction=["latex", "tex"]), "extraction"),
        ("VerifyMath", pb.VerifyMathRequest(answer="1", gold="1", precision=-1), "precision"),
        ("VerifyCode", pb.VerifyCodeRequest(language="python", code="x"), "tests"),
        ("Score", pb.ScoreRequest(items=[pb.ScoreItem(id="a", completion="c")]), "checks"),
        (
            "Score",
            pb.ScoreRequest(items=[pb.ScoreItem(id="a", checks=pb.Checks(language=pb.LanguageCheck(target="xx")))]),
            "target",
        ),
        ("Score", pb.ScoreRequest(), "items"),
        (  # *.class is Java's build output: the file would replace the program
            "Execute",
            pb.ExecuteRequest(language="java", code="class Main {}", files={"Main.class": "junk"}),
            "['Main.class'] are the program's own file names in java",
        ),
        ("Score", pb.ScoreRequest(items=[HUGE_WEIGHTS]), "items.0.weights.math: Input should be less than or equal"),
        ("ScoreStream", pb.ScoreRequest(items=_items(1025)), "limit per request is 1024"),
    ],
)
def test_bad_input_is_invalid_argument(
    stub: reward_pb2_grpc.RewardServiceStub, method: str, request_: Any, needle: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        reply = getattr(stub, method)(request_, timeout=30)
        if method == "ScoreStream":
            list(reply)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details()


def test_grpc_deadline_bounds_a_blowup(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    item = pb.ScoreItem(id="b", completion=BLOWUP, checks=pb.Checks(math=pb.MathCheck(gold="5")))
    started = time.monotonic()
    reply = stub.Score(pb.ScoreRequest(items=[item]), timeout=2.0)
    assert time.monotonic() - started < 2.0
    result = reply.results[0]
    # The call's deadline, not math_timeout_s, stopped the verification: the service ran out, an error.
    assert not result.HasField("reward") and result.components["math"].status == "error"
    assert result.status == "error" and "request deadline" in result.error


def test_client_scores_and_raises_when_unreachable(live_reward: Any) -> None:
    with RewardClient(live_reward.grpc_addr, timeout_s=30) as client:
        results = client.score([{"id": "a", "completion": "\\boxed{4}", "checks": {"math": {"gold": "4"}}}])
        assert results[0].reward == 1.0 and results[0].components["math"].status == "correct"
        with pytest.raises(RewardServiceError, match="checks") as bad:
            client.score([{"id": "a", "completion": "x"}])  # the service names the missing field
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(ValueError, match="ScoreItem"):
            client.score([{"id": "a", "no_such_field": 1}])  # caught before anything is sent
    with RewardClient(f"127.0.0.1:{free_port()}", timeout_s=0.5, retry_budget_s=1.5, backoff_s=0.05) as dead:
        started = time.monotonic()
        with pytest.raises(RewardServiceError, match=r"retry budget 1.5s") as err:
            dead.score([{"id": "a", "completion": "\\boxed{4}", "checks": {"math": {"gold": "4"}}}])
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert 0.5 < time.monotonic() - started < 5  # it kept retrying, but not past its budget


def test_client_rides_out_a_service_that_comes_up_late(start_reward: Callable[..., Any]) -> None:
    """The first Score call is made while nothing listens; the service starts 5 s later and the batch is scored."""
    port = free_port()

    def start_late() -> None:
        time.sleep(5)
        start_reward(grpc_port=port)  # stopped by the fixture

    late = threading.Thread(target=start_late)
    items = [{"id": f"i{k}", "completion": f"\\boxed{{{k}}}", "checks": {"math": {"gold": "3"}}} for k in range(4)]
    try:
        with RewardClient(f"127.0.0.1:{port}", timeout_s=10, retry_budget_s=30) as client:
            began = time.monotonic()
            late.start()
            results = client.score(items)
            waited = time.monotonic() - began
    finally:
        late.join(60)
    assert [r.id for r in results] == ["i0", "i1", "i2", "i3"]
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 1.0]
    assert 5 < waited < 30, waited


def test_client_score_stream_yields_every_item(live_reward: Any) -> None:
    items = [{"id": f"s{k}", "completion": f"\\boxed{{{k}}}", "checks": {"math": {"gold": "2"}}} for k in range(6)]
    with RewardClient(live_reward.grpc_addr, timeout_s=30) as client:
        results = list(client.score_stream(items))
    assert sorted(r.id for r in results) == [f"s{k}" for k in range(6)]  # each once, in any order
    by_id = {r.id: r for r in results}
    assert by_id["s2"].reward == 1.0 and by_id["s2"].status == "ok"
    assert all(by_id[f"s{k}"].reward == 0.0 for k in (0, 1, 3, 4, 5))
