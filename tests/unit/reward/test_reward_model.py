"""The optional reward model: a tiny randomly initialised Qwen2 sequence classifier saved locally, scored in batches."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.reward.helpers import save_tiny_reward_model


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"))


def test_scores_are_batched_deterministic_and_distinct(tiny_rm: Path) -> None:
    from grpo.reward.verifiers.reward_model import RewardModel

    model = RewardModel(str(tiny_rm), batch_size=2, max_length=64)
    prompts = ["What is 2+2?", "What is 3*3?", "Name a colour.", "2+2?", "Add 1 and 1."]
    completions = ["<answer>4</answer>", "9", "blue, clearly a colour", "four", "<think>1+1</think><answer>2</answer>"]
    scores = model.score(prompts, completions)
    assert len(scores) == 5 and all(isinstance(s, float) for s in scores)
    assert len({round(s, 6) for s in scores}) > 1, "a random model still tells inputs apart"
    one_by_one = [model.score([p], [c])[0] for p, c in zip(prompts, completions, strict=True)]
    assert scores == pytest.approx(one_by_one, abs=1e-4), "padding in a batch must not change a score"


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    from grpo.reward.verifiers.reward_model import RewardModel

    with pytest.raises(OSError):
        RewardModel(str(tmp_path / "nope"))


def test_service_core_does_not_import_torch() -> None:
    code = (
        "import sys; import grpo.reward.core, grpo.reward.http_api, grpo.reward.grpc_api; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
    ("logit", "how", "shift", "scale", "expected"),
    [
        (0.0, "sigmoid", 0.0, 1.0, 0.5),
        (2.0, "sigmoid", 0.0, 1.0, 1 / (1 + math.exp(-2.0))),
        (-3.0, "sigmoid", 1.0, 2.0, 1 / (1 + math.exp(2.0))),  # sigmoid((-3 - 1) / 2)
        (1e6, "sigmoid", 0.0, 1.0, 1.0),  # no overflow either way
        (-1e6, "sigmoid", 0.0, 1.0, 0.0),
        (2.5, "none", 0.0, 1.0, 2.5),  # the raw logit
        (2.5, "none", 0.5, 4.0, 0.5),
    ],
)
def test_normalized_maps_the_logit(logit: float, how: str, shift: float, scale: float, expected: float) -> None:
    from grpo.reward.verifiers.reward_model import normalized

    assert normalized(logit, how, shift, scale) == pytest.approx(expected, abs=1e-12)


def test_normalized_keeps_a_broken_logit_broken_and_refuses_bad_settings() -> None:
    from grpo.reward.verifiers.reward_model import normalized

    assert math.isnan(normalized(float("nan"), "sigmoid"))  # the caller fails the item: never a score
    assert normalized(float("inf"), "sigmoid") == float("inf")
    with pytest.raises(ValueError, match=r"one of \['none', 'sigmoid'\]"):
        normalized(1.0, "softmax")
    with pytest.raises(ValueError, match="scale must be > 0"):
        normalized(1.0, "sigmoid", scale=0.0)


def test_model_judgement_normalises_and_fails_non_finite_logits() -> None:
    from grpo.reward.components import _model_judgement
    from grpo.reward.schemas import RewardModelCheck

    j = _model_judgement(1.0, RewardModelCheck(normalize="sigmoid", shift=1.0))
    assert (j.score, j.status, j.detail) == (0.5, "ok", "logit 1")
    assert _model_judgement(-2.0, None).score == -2.0  # no options: the raw logit (the default)
    broken = _model_judgement(float("nan"), RewardModelCheck(normalize="sigmoid"))
    assert broken.score is None and broken.status == "error" and "nan" in broken.detail
    overflow = _model_judgement(1.0, RewardModelCheck(scale=1e-320))
    assert overflow.score is None and overflow.status == "error" and "scale" in overflow.detail


@pytest.mark.parametrize(
    ("check", "message"),
    [({"normalize": "softmax"}, "'none' or 'sigmoid'"), ({"scale": 0}, "greater than 0"),
     ({"shift": float("inf")}, "finite"), ({"scale": "NaN"}, "NaN is not a number"), ({"bias": 1}, "bias")],
)  # fmt: skip
def test_reward_model_check_validation_names_the_field(check: dict[str, object], message: str) -> None:
    from pydantic import ValidationError

    from grpo.reward.schemas import RewardModelCheck

    with pytest.raises(ValidationError, match=message):
        RewardModelCheck.model_validate(check)


def test_reward_model_options_round_trip_through_protobuf() -> None:
    from grpo.reward.convert import model_to_proto, parse_request
    from grpo.reward.schemas import ScoreRequest
    from grpo.v1 import reward_pb2

    item = {"id": "a", "completion": "c", "checks": {"reward_model": {"normalize": "sigmoid", "shift": -1, "scale": 2}}}
    req = ScoreRequest.model_validate({"items": [item]})
    msg = model_to_proto(req, reward_pb2.ScoreRequest())
    assert msg.items[0].checks.reward_model.normalize == "sigmoid"
    assert parse_request(ScoreRequest, msg) == req
    bare = reward_pb2.ScoreRequest()
    bare.items.add(id="b", completion="c").checks.reward_model.SetInParent()  # unset options: the defaults
    assert parse_request(ScoreRequest, bare).items[0].checks.reward_model.normalize == "none"
