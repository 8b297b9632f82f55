"""Scoring rules: weights, cannot-judge -> null reward, infrastructure failure -> error (never 0)."""

from __future__ import annotations

import pytest

from grpo.reward.schemas import CodeTestResult, VerifyMathResponse
from grpo.reward.scoring import code_judgement, combine, math_judgement
from grpo.reward.verifiers.result import Judgement

OK1, OK0, HALF = Judgement(1.0, "ok"), Judgement(0.0, "ok"), Judgement(0.5, "ok")
UNJUDGED = Judgement(None, "unparseable_gold", "no gold")
FAILED = Judgement(None, "sandbox_error", "zygote died")


@pytest.mark.parametrize(
    ("components", "weights", "reward", "status"),
    [
        ({"math": OK1}, {}, 1.0, "ok"),
        ({"math": OK1, "format": HALF}, {}, 1.5, "ok"),
        ({"math": OK1, "format": HALF}, {"format": 0.2}, 1.1, "ok"),
        ({"math": OK0, "format": OK1}, {"math": 2.0, "format": 0.5}, 0.5, "ok"),
        ({"overlong": Judgement(-0.5, "ok"), "math": OK1}, {}, 0.5, "ok"),
        # a required component cannot judge: null reward, item still ok, reason given
        ({"math": UNJUDGED, "format": OK1}, {}, None, "ok"),
        # weight 0 makes it informational
        ({"math": UNJUDGED, "format": OK1}, {"math": 0.0}, 1.0, "ok"),
        # infrastructure failure: error, never a 0
        ({"code": FAILED, "format": OK1}, {}, None, "error"),
        ({"math": Judgement(None, "error", "worker crashed")}, {}, None, "error"),
        ({"p": Judgement(None, "error", "plug-in raised")}, {}, None, "error"),
    ],
)
def test_combine(
    components: dict[str, Judgement], weights: dict[str, float], reward: float | None, status: str
) -> None:
    result = combine("x", components, weights)
    assert result.status == status
    assert result.reward == (pytest.approx(reward) if reward is not None else None)
    assert set(result.components) == set(components)
    if reward is None:
        assert result.error, "a null reward must say why"


def test_combine_reports_reason() -> None:
    result = combine("x", {"math": UNJUDGED}, {})
    assert "cannot judge" in result.error and "unparseable_gold" in result.error
    failed = combine("x", {"code": FAILED}, {})
    assert "sandbox_error" in failed.error and "zygote died" in failed.error


def test_a_sum_that_is_not_finite_is_an_error_that_says_so() -> None:
    """Weights are bounded, but a plug-in may return 1e308: the sum is then no reward, and must not go out as a
    bare null (JSON) or fail to serialize (protobuf)."""
    huge = Judgement(1e308, "ok")
    result = combine("x", {"p": huge, "q": huge}, {"p": 1e6})
    assert result.reward is None and result.status == "error"
    assert "weighted sum is inf" in result.error and "'p': 1000000.0" in result.error


@pytest.mark.parametrize(
    ("status", "score", "component_status"),
    [
        ("correct", 1.0, "correct"),
        ("incorrect", 0.0, "incorrect"),
        ("unparseable_answer", 0.0, "unparseable_answer"),  # the model gave no answer: a judged 0
        ("unparseable_gold", None, "unparseable_gold"),  # cannot judge
        ("timeout", None, "timeout"),  # cannot judge (the answer blew the verifier up)
        ("error", None, "error"),  # failed
    ],
)
def test_math_judgement(status: str, score: float | None, component_status: str) -> None:
    judged = math_judgement(VerifyMathResponse(correct=None, status=status))  # type: ignore[arg-type]
    assert judged.score == score
    assert judged.status == component_status


def _t(verdict: str) -> CodeTestResult:
    return CodeTestResult(verdict=verdict)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("verdicts", "score", "status"),
    [
        (["pass", "pass"], 1.0, "ok"),
        (["pass", "fail", "timeout", "runtime_error"], 0.25, "ok"),
        (["memory_limit", "output_limit"], 0.0, "ok"),
        (["pass", "process_limit"], 0.5, "ok"),  # a verdict like memory_limit: judged, not passed, never an error
        (["pass", "sandbox_error"], None, "sandbox_error"),
        ([], None, "cannot_judge"),
    ],
)
def test_code_judgement(verdicts: list[str], score: float | None, status: str) -> None:
    judged = code_judgement([_t(v) for v in verdicts])
    assert judged.score == score
    assert judged.status == status


def test_code_judgement_all_or_nothing() -> None:
    assert code_judgement([_t("pass"), _t("fail"), _t("skipped")], partial_credit=False).score == 0.0
    assert code_judgement([_t("pass"), _t("pass")], partial_credit=False).score == 1.0
    assert code_judgement([_t("pass"), _t("skipped")]).score == 0.5  # a skipped test is not passed


@pytest.mark.parametrize("failed", [FAILED, Judgement(None, "error", "plug-in raised ValueError")])
def test_a_failing_informational_component_is_reported_and_does_not_null_the_reward(failed: Judgement) -> None:
    result = combine("x", {"math": OK1, "probe": failed}, {"probe": 0.0})
    assert (result.reward, result.status, result.error) == (1.0, "ok", "")
    assert result.components["probe"].status == failed.status and result.components["probe"].score is None


def test_a_failure_among_only_informational_components_is_an_error_not_a_zero() -> None:
    result = combine("x", {"probe": FAILED, "format": OK1}, {"probe": 0.0, "format": 0.0})
    assert (result.reward, result.status) == (None, "error") and "zygote died" in result.error


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_score_that_is_not_finite_never_reaches_the_sum(value: float) -> None:
    weighted = combine("x", {"math": OK1, "rm": Judgement(value, "ok")}, {})
    assert (weighted.reward, weighted.status) == (None, "error") and f"score is {value}" in weighted.error
    assert weighted.components["rm"].score is None and weighted.components["rm"].status == "error"
    informational = combine("x", {"math": OK1, "rm": Judgement(value, "ok")}, {"rm": 0.0})  # 0 × inf is nan
    assert (informational.reward, informational.status) == (1.0, "ok")
