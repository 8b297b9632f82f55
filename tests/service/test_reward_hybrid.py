"""The hybrid reward through a running reward service: a locally trained reward classifier (reward_model_path)
scored next to the math rule, its logit normalised as each item's RewardModelCheck asks, over gRPC and HTTP."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from grpo.v1 import reward_pb2, reward_pb2_grpc
from tests.support.reward_classifier import MAX_LENGTH, accuracy, logits, train_reward_classifier
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service

PROMPT = "What is 3 + 4?"
COMPLETIONS = ("the answer is 7", "no idea at all", "<answer>7</answer>")


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = train_reward_classifier(tmp_path_factory.mktemp("reward-classifier"))
    assert accuracy(path) >= 0.8, "the classifier learned its property (a digit in the completion)"
    return path


@pytest.fixture(scope="module")
def rm_service(classifier: Path) -> Iterator[RewardService]:
    """One reward service with the classifier as its reward model, for the module."""
    args = ("--reward-model-path", str(classifier), "--reward-model-max-length", str(MAX_LENGTH))
    service = start_reward_service(*args, workers=1, env={"OMP_NUM_THREADS": "1"})
    try:
        yield service
        service.assert_alive()
    finally:
        stop_reward_service(service)


def test_normalised_reward_model_scores_over_grpc_and_http(rm_service: RewardService, classifier: Path) -> None:
    own = logits(classifier, [PROMPT] * len(COMPLETIONS), list(COMPLETIONS))
    assert own[0] > 0 > own[1], "the trained classifier tells a digit from none"
    checks = [
        ({"reward_model": {"normalize": "sigmoid"}}, [sigmoid(x) for x in own]),
        ({"reward_model": {}}, own),  # the default: the raw logit
        ({"reward_model": {"normalize": "none", "shift": 1.5, "scale": 2.0}}, [(x - 1.5) / 2 for x in own]),
        ({"reward_model": {"normalize": "sigmoid", "shift": -1.0, "scale": 4.0}}, [sigmoid((x + 1) / 4) for x in own]),
    ]
    items, expected = [], {}
    for k, (check, scores) in enumerate(checks):
        for j, completion in enumerate(COMPLETIONS):
            items.append({"id": f"{k}-{j}", "prompt": PROMPT, "completion": completion, "checks": check})
            expected[f"{k}-{j}"] = scores[j]

    r = httpx.post(f"{rm_service.http_url}/v1/score", json={"items": items}, timeout=120)
    assert r.status_code == 200, r.text
    for res in r.json()["results"]:
        component = res["components"]["reward_model"]
        assert component["score"] == pytest.approx(expected[res["id"]], abs=1e-5), res
        assert res["reward"] == pytest.approx(component["score"], abs=1e-12)
        assert component["detail"].startswith("logit ")

    request = reward_pb2.ScoreRequest()
    for item in items:
        msg = request.items.add(id=item["id"], prompt=item["prompt"], completion=item["completion"])
        msg.checks.reward_model.SetInParent()
        for key, value in item["checks"]["reward_model"].items():
            setattr(msg.checks.reward_model, key, value)
    with grpc.insecure_channel(rm_service.grpc_addr) as channel:
        reply = reward_pb2_grpc.RewardServiceStub(channel).Score(request, timeout=120)
    assert len(reply.results) == len(items)
    for res in reply.results:
        assert res.components["reward_model"].score == pytest.approx(expected[res.id], abs=1e-5), res


def test_a_rule_and_the_reward_model_in_one_row_are_weighted(rm_service: RewardService, classifier: Path) -> None:
    """A row with both: the weighted sum of the math rule (0 or 1) and the sigmoid score, both in [0, 1]."""
    (own,) = logits(classifier, [PROMPT], ["<answer>7</answer>"])
    item = {"id": "h", "prompt": PROMPT, "completion": "<answer>7</answer>", "weights": {"math": 1.0, "reward_model": 0.5},
            "checks": {"math": {"gold": "7"}, "reward_model": {"normalize": "sigmoid"}}}  # fmt: skip
    r = httpx.post(f"{rm_service.http_url}/v1/score", json={"items": [item]}, timeout=120)
    assert r.status_code == 200, r.text
    (res,) = r.json()["results"]
    assert res["components"]["math"]["score"] == 1.0
    assert res["reward"] == pytest.approx(1.0 + 0.5 * sigmoid(own), abs=1e-5)


@pytest.mark.parametrize(
    ("check", "named"),
    [({"normalize": "softmax"}, "'sigmoid'"), ({"scale": 0}, "greater than 0"), ({"scale": -2.0}, "greater than 0"),
     ({"shift": "NaN"}, "NaN")],
)  # fmt: skip
def test_bad_normalisation_is_refused_naming_what_to_change(
    rm_service: RewardService, check: dict[str, Any], named: str
) -> None:
    item = {"id": "x", "prompt": PROMPT, "completion": "7", "checks": {"reward_model": check}}
    r = httpx.post(f"{rm_service.http_url}/v1/score", json={"items": [item]}, timeout=60)
    assert r.status_code == 422 and named in r.text and "reward_model" in r.text, r.text

    request = reward_pb2.ScoreRequest()
    msg = request.items.add(id="x", prompt=PROMPT, completion="7")
    msg.checks.reward_model.SetInParent()
    for key, value in check.items():
        setattr(msg.checks.reward_model, key, float(value) if key != "normalize" else value)
    with grpc.insecure_channel(rm_service.grpc_addr) as channel, pytest.raises(grpc.RpcError) as err:
        reward_pb2_grpc.RewardServiceStub(channel).Score(request, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (err.value.details() or ""), err.value.details()


def test_reward_model_rows_on_a_service_without_one_are_an_error_not_a_zero(live_reward: RewardService) -> None:
    """The session service has no reward_model_path: a row asking for the reward model is refused, naming the
    setting, never scored 0."""
    request = reward_pb2.ScoreRequest()
    msg = request.items.add(id="x", prompt=PROMPT, completion="7")
    msg.checks.reward_model.normalize = "sigmoid"
    with grpc.insecure_channel(live_reward.grpc_addr) as channel, pytest.raises(grpc.RpcError) as err:
        reward_pb2_grpc.RewardServiceStub(channel).Score(request, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reward_model_path" in (err.value.details() or "")
