"""Faults of plug-ins, the reward model and the PRM through a running service: each stays with the items that met it.

Real processes with real plug-in files (tests.unit.reward.test_plugins) and tiny real models whose checkpoints
give nan for inputs holding "§" (a broken model, as a training run can produce).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format

from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service
from tests.unit.reward.helpers import poison_tokens, save_tiny_prm, save_tiny_reward_model

REPO = Path(__file__).resolve().parents[2]
FNS = "tests.unit.reward.test_plugins"
PLUGINS = {name: f"{FNS}:{fn}" for name, fn in [
    ("exits", "exits"), ("parses_args", "parses_args"), ("length", "length_reward"), ("strings", "strings"),
    ("reals", "real_numbers"), ("huge", "huge_for_some"), ("needs_scale", "needs_scale"),
]}  # fmt: skip
BLOWUP = "\\boxed{\\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}}"


def env_with(plugins: dict[str, str]) -> dict[str, str]:
    return {"PYTHONPATH": str(REPO), "GRPO_REWARD_PLUGINS": json.dumps(plugins), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def plugged() -> Iterator[RewardService]:
    service = start_reward_service("--sandbox", "off", workers=1, env=env_with(PLUGINS))
    yield service
    stop_reward_service(service)


def score_http(service: RewardService, items: list[dict[str, Any]], **body: Any) -> dict[str, dict[str, Any]]:
    r = httpx.post(f"{service.http_url}/v1/score", json={"items": items, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return {res["id"]: res for res in r.json()["results"]}


def score_grpc(service: RewardService, items: list[dict[str, Any]], stream: bool = False) -> dict[str, pb.ScoreResult]:
    for item in items:  # the proto carries plug-in kwargs as JSON text
        for plugin in item["checks"].get("plugins", {}).values():
            plugin["kwargs_json"] = json.dumps(plugin.pop("kwargs", {}))
    request = pb.ScoreRequest(items=[json_format.ParseDict(i, pb.ScoreItem()) for i in items])
    with grpc.insecure_channel(service.grpc_addr) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        results = list(stub.ScoreStream(request, timeout=60)) if stream else stub.Score(request, timeout=60).results
    return {r.id: r for r in results}


def plugin(name: str, **kwargs: Any) -> dict[str, Any]:
    return {name: {"kwargs": kwargs}} if kwargs else {name: {}}


# ---- 1. a plug-in that exits ---------------------------------------------------------------------------------


def test_a_plugin_that_exits_fails_its_items_and_the_service_lives_on(
    start_reward: Callable[..., RewardService],
) -> None:
    plugged = start_reward("--sandbox", "off", env=env_with(PLUGINS))  # its own: it used to die here
    items = [
        {"id": "exit", "completion": "ab", "checks": {"plugins": plugin("exits")}},
        {"id": "argparse", "completion": "ab", "checks": {"plugins": plugin("parses_args")}},
        {"id": "fine", "completion": "abcd", "checks": {"plugins": plugin("length")}},
        {"id": "both", "completion": "abcd", "checks": {"plugins": {**plugin("exits"), **plugin("length")}}},
    ]
    for _ in range(2):  # the second request proves the first left the service whole
        results = score_http(plugged, items)
        assert results["exit"]["status"] == "error" and results["exit"]["reward"] is None
        assert "plug-in raised SystemExit: 3" in results["exit"]["error"]
        assert "plug-in raised SystemExit: 2" in results["argparse"]["error"]
        assert (results["fine"]["status"], results["fine"]["reward"]) == ("ok", 0.25)
        assert results["both"]["components"]["length"]["score"] == 0.25 and results["both"]["status"] == "error"
    over_grpc = score_grpc(plugged, [dict(i) for i in items])
    assert over_grpc["exit"].status == "error" and "SystemExit: 3" in over_grpc["exit"].error
    assert over_grpc["fine"].reward == 0.25
    plugged.assert_alive()
    assert httpx.get(f"{plugged.http_url}/readyz", timeout=5).status_code == 200


# ---- 3. one item's kwargs --------------------------------------------------------------------------------------


def test_reserved_kwargs_are_refused_naming_the_item(plugged: RewardService) -> None:
    items = [{"id": "a", "completion": "ab", "checks": {"plugins": plugin("length", scale=2)}},
             {"id": "b", "completion": "ab", "checks": {"plugins": plugin("length", prompts=1)}}]  # fmt: skip
    r = httpx.post(f"{plugged.http_url}/v1/score", json={"items": items}, timeout=60)
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"][:3] == ["body", "items", 1] and "['prompts'] are passed by the service itself" in error["msg"]
    with pytest.raises(grpc.RpcError) as err:
        score_grpc(plugged, items)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "items.1.checks.plugins.length.kwargs" in (err.value.details() or "")


def test_one_items_kwargs_fail_only_that_item(plugged: RewardService) -> None:
    items = [
        {"id": "scaled", "completion": "ab", "checks": {"plugins": plugin("needs_scale", scale=2)}},
        {"id": "missing", "completion": "ab", "checks": {"plugins": plugin("needs_scale")}},
        {"id": "extra", "completion": "ab", "checks": {"plugins": plugin("needs_scale", scale=1, bogus=1)}},
    ]
    results = score_http(plugged, items)
    assert (results["scaled"]["status"], results["scaled"]["reward"]) == ("ok", 2.0)
    assert results["missing"]["status"] == "error" and "required" in results["missing"]["error"]
    assert results["extra"]["status"] == "error" and "unexpected keyword argument 'bogus'" in results["extra"]["error"]


# ---- 6. what counts as a number --------------------------------------------------------------------------------


def test_plugin_scores_must_be_real_numbers_finite_as_floats(plugged: RewardService) -> None:
    items = [
        {"id": "string", "completion": "x", "checks": {"plugins": plugin("strings")}},
        {"id": "bool", "completion": "x", "checks": {"plugins": plugin("reals")}},
        {"id": "huge", "completion": "huge", "checks": {"plugins": plugin("huge")}},
        {"id": "fine", "completion": "fine", "checks": {"plugins": plugin("huge")}},
    ]
    results = score_http(plugged, items)
    assert results["string"]["status"] == "error" and "returned str, not a number" in results["string"]["error"]
    assert (results["bool"]["status"], results["bool"]["reward"]) == ("ok", 1.0)  # True counts 1, as in TRL
    assert results["huge"]["status"] == "error" and "too large for a float" in results["huge"]["error"]
    assert (results["fine"]["status"], results["fine"]["reward"]) == ("ok", 0.5)


# ---- 4. the request's deadline cutting math short --------------------------------------------------------------


@pytest.mark.parametrize("timeout_s", [1.5, 0.01])
def test_a_deadline_that_cuts_math_short_is_an_error_not_cannot_judge(plugged: RewardService, timeout_s: float) -> None:
    items = [{"id": "m", "completion": BLOWUP, "checks": {"math": {"gold": "5"}}}]
    result = score_http(plugged, items, timeout_s=timeout_s)["m"]
    assert (result["status"], result["reward"]) == ("error", None)
    assert result["components"]["math"]["status"] == "error" and "request deadline" in result["error"]


def test_math_over_its_own_limit_is_judged_never_an_error(plugged: RewardService) -> None:
    """timeout_s is the verification's own limit (from its start; the request's deadline leaves time to check the
    gold alone): the answer's blow-up is a 0, a gold that blows up by itself cannot judge; neither is `error`."""
    url = f"{plugged.http_url}/v1/verify/math"
    answer = httpx.post(url, json={"answer": BLOWUP, "gold": "5", "timeout_s": 1.0}, timeout=30).json()
    assert (answer["status"], answer["correct"]) == ("incorrect", False), answer
    gold = BLOWUP.removeprefix("\\boxed{").removesuffix("}")
    own = httpx.post(url, json={"answer": "\\boxed{5}", "gold": gold, "timeout_s": 1.0}, timeout=30).json()
    assert (own["status"], own["correct"]) == ("timeout", None), own


# ---- 2. nan from the reward model and the PRM ------------------------------------------------------------------


def test_nan_from_the_reward_model_or_prm_fails_only_its_items(
    start_reward: Callable[..., RewardService], tmp_path: Path
) -> None:
    rm = poison_tokens(save_tiny_reward_model(tmp_path / "rm"), "§")
    prm = poison_tokens(save_tiny_prm(tmp_path / "prm"), "§", head="token")
    env = {**env_with({}), "GRPO_REWARD_REWARD_MODEL_PATH": str(rm)}
    service = start_reward("--sandbox", "off", "--prm-path", str(prm), env=env)
    steps = {"source": "prm", "delimiter": "\n"}
    items = [
        {"id": "good", "prompt": "q", "completion": "fine", "checks": {"reward_model": {}}},
        {"id": "nan", "prompt": "q", "completion": "bad §", "checks": {"reward_model": {}}},
        {"id": "informational", "prompt": "q", "completion": "<think>§</think><answer>1</answer>",
         "checks": {"reward_model": {}, "format": {}}, "weights": {"reward_model": 0}},
        {"id": "prm_good", "prompt": "q", "completion": "one\ntwo", "checks": {"format": {}, "steps": steps}},
        {"id": "prm_nan", "prompt": "q", "completion": "one\n§ two", "checks": {"format": {}, "steps": steps}},
    ]  # fmt: skip
    http = score_http(service, items)
    assert http["good"]["status"] == "ok" and isinstance(http["good"]["reward"], float)
    assert (http["nan"]["status"], http["nan"]["reward"]) == ("error", None)
    assert http["nan"]["components"]["reward_model"] == {"score": None, "status": "error",
                                                        "detail": "reward model returned nan"}  # fmt: skip
    assert "weighted sum" not in http["nan"]["error"]
    assert (http["informational"]["status"], http["informational"]["reward"]) == ("ok", 1.0)
    assert http["prm_good"]["status"] == "ok" and all(s["status"] == "ok" for s in http["prm_good"]["steps"])
    assert http["prm_nan"]["status"] == "error" and "the PRM returned nan" in http["prm_nan"]["error"]
    for stream in (False, True):  # Score answered UNKNOWN and ScoreStream ended INTERNAL on one nan
        got = score_grpc(service, [json.loads(json.dumps(i)) for i in items], stream=stream)
        assert set(got) == {i["id"] for i in items}
        assert got["nan"].status == "error" and got["nan"].components["reward_model"].status == "error"
        assert got["good"].status == "ok" and got["good"].HasField("reward")
        assert got["informational"].reward == 1.0 and got["prm_nan"].status == "error"


# ---- 5. a hung plug-in -----------------------------------------------------------------------------------------


def test_a_hung_plugin_stalls_only_itself_and_readiness_names_it(start_reward: Callable[..., RewardService]) -> None:
    plugins = {"hangs": f"{FNS}:hangs", "length": f"{FNS}:length_reward"}
    service = start_reward("--sandbox", "off", "--plugin-timeout-s", "1", env=env_with(plugins))
    hung = {"id": "hung", "completion": "ab", "checks": {"plugins": plugin("hangs")}}
    fine = {"id": "fine", "completion": "abcd", "checks": {"plugins": plugin("length")}}
    for call in range(4):  # each call leaves one of the plug-in's 4 threads stuck
        started = time.monotonic()
        results = score_http(service, [hung, fine])
        assert time.monotonic() - started < 3.0
        assert results["hung"]["status"] == "error"
        assert "plug-in 'hangs' gave no answer within 1s of starting" in results["hung"]["error"]
        assert results["fine"]["reward"] == 0.25  # another plug-in's threads are its own
        ready = httpx.get(f"{service.http_url}/readyz", timeout=5)
        assert ready.status_code == (503 if call == 3 else 200), ready.text
    assert any("plug-in 'hangs': all 4 of its threads are stuck" in m for m in ready.json()["missing"])
    queued = score_http(service, [hung, fine], timeout_s=1.0)
    assert "no free thread for plug-in 'hangs' before the request's deadline" in queued["hung"]["error"]
    assert "4 of its 4 threads stuck" in queued["hung"]["error"] and queued["fine"]["reward"] == 0.25
    started = time.monotonic()
    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(timeout=10) == 0
    assert time.monotonic() - started < 3.0, "stuck plug-in threads must not hold the process at exit"
