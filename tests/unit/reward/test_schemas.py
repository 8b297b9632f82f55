"""The API models and their protobuf conversion: both edges see the same validated request."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from grpo.reward.convert import model_to_proto, parse_request, proto_to_model
from grpo.reward.errors import InputError
from grpo.reward.schemas import AssertTest, ScoreRequest, ScoreResult, StdioTest, VerifyCodeRequest
from grpo.v1 import reward_pb2 as pb

ITEM: dict[str, Any] = {
    "id": "a",
    "prompt": "p",
    "completion": "c",
    "checks": {
        "math": {"gold": "4"},
        "code": {"tests": [{"stdin": "1", "expected_stdout": "2"}, {"assert": "assert f() == 1"}]},
        "format": {"think_prefilled": True},
        "language": {"target": "zh"},
        "overlong": {"max_tokens": 100, "buffer_tokens": 10, "completion_tokens": 5},
        "plugins": {"len": {"kwargs": {"scale": 2}}},
    },
    "weights": {"math": 2.0, "len": 0.5},
}


def test_score_request_round_trips_through_protobuf() -> None:
    req = ScoreRequest.model_validate({"items": [ITEM], "timeout_s": 5})
    msg = model_to_proto(req, pb.ScoreRequest())
    assert msg.items[0].checks.code.tests[1].WhichOneof("kind") == "assert"
    assert msg.items[0].checks.plugins["len"].kwargs_json == '{"scale": 2}'
    assert parse_request(ScoreRequest, msg) == req


def test_code_tests_are_either_shape() -> None:
    req = VerifyCodeRequest.model_validate(
        {"code": "x", "tests": [{"stdin": "", "expected_stdout": ""}, {"assert": "a"}]}
    )
    assert isinstance(req.tests[0], StdioTest) and isinstance(req.tests[1], AssertTest)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"checks": {}}, "at least one component"),
        ({"weights": {"reward_model": 1.0}}, "not in checks"),
        ({"checks": {"language": {"target": "fr"}}}, "target"),
        ({"checks": {"overlong": {"max_tokens": 10, "buffer_tokens": 20}}}, "buffer_tokens"),
        ({"checks": {"format": {"think_tag": "answer"}}}, "must differ"),  # else every completion scores 0
        ({"checks": {"code": {"tests": [{"stdin": "x"}]}}}, "expected_stdout"),
        ({"checks": {"code": {"tests": []}}}, "at least 1"),
        ({"completion": 5}, "completion"),
        ({"weights": {"math": float("nan")}}, "finite"),
        ({"weights": {"math": 1e308}}, "less than or equal to 1000000"),  # two of them sum to infinity
        ({"weights": {"math": -2e6}}, "greater than or equal to -1000000"),
    ],
)
def test_bad_items_name_the_problem(change: dict[str, Any], message: str) -> None:
    item = {**ITEM, **change}
    if "weights" not in change:
        item["weights"] = {}
    with pytest.raises(ValidationError, match=message):
        ScoreRequest.model_validate({"items": [item]})


def test_duplicate_ids_and_bad_timeout() -> None:
    base = {**ITEM, "weights": {}}
    with pytest.raises(ValidationError, match="duplicate item id"):
        ScoreRequest.model_validate({"items": [base, base]})
    with pytest.raises(ValidationError, match="timeout_s"):
        ScoreRequest.model_validate({"items": [base], "timeout_s": -1})


def test_parse_request_reports_fields_as_input_error() -> None:
    msg = pb.ScoreRequest(items=[pb.ScoreItem(id="a", completion="c")])
    with pytest.raises(InputError, match=r"items\.0\.checks: Field required"):
        parse_request(ScoreRequest, msg)
    bad_json = pb.ScoreRequest(
        items=[pb.ScoreItem(id="a", checks=pb.Checks(plugins={"p": pb.PluginCheck(kwargs_json="{no")}))]
    )
    with pytest.raises(InputError, match="kwargs_json is not valid JSON"):
        parse_request(ScoreRequest, bad_json)


def test_score_result_from_protobuf_keeps_null_reward() -> None:
    msg = pb.ScoreResult(
        id="a", status="ok", error="cannot judge", components={"math": pb.ComponentResult(status="timeout")}
    )
    result = proto_to_model(ScoreResult, msg)
    assert result.reward is None and result.components["math"].score is None


def test_unset_proto_strings_take_the_defaults() -> None:
    from grpo.reward.schemas import ExecuteRequest

    assert parse_request(ExecuteRequest, pb.ExecuteRequest(code="print(1)")).language == "python"
    item = pb.ScoreItem(
        id="a", checks=pb.Checks(language=pb.LanguageCheck(), code=pb.CodeCheck(tests=[pb.CodeTest(**{"assert": "x"})]))
    )
    req = parse_request(ScoreRequest, pb.ScoreRequest(items=[item]))
    assert req.items[0].checks.language is not None and req.items[0].checks.language.target == "auto"
    assert req.items[0].checks.code is not None and req.items[0].checks.code.language == "python"


def test_a_lone_surrogate_is_found_beside_what_orjson_cannot_write() -> None:
    """The text check asks orjson's encoder first (it refuses a lone surrogate) and walks the body only when it
    refuses: an integer over 64 bits, which it also refuses, must neither hide a surrogate nor be one."""
    kwargs = {"big": 1 << 70, "s": "ok \ud800"}
    item = {**ITEM, "checks": {"plugins": {"len": {"kwargs": kwargs}}}, "weights": {}}
    with pytest.raises(ValidationError, match=r"items\.0\.checks\.plugins\.len\.kwargs\.s at character 3"):
        ScoreRequest.model_validate({"items": [item]})
    kwargs["s"] = "ok \u00e9"
    assert ScoreRequest.model_validate({"items": [item]}).items[0].checks.plugins["len"].kwargs == kwargs
