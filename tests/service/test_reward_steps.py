"""Step scores through the reward service's public API: a rule over HTTP and gRPC, a PRM configured on the server,
and the 4xx answers for step checks that cannot work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc
from tests.unit.reward.helpers import save_tiny_prm

RIGHT = "<think>13 13 06</think><answer>633</answer>"
SLIP = "<think>13 12 06</think><answer>623</answer>"  # column 2 wrong (4+8+1 = 13), so is the answer


def score(url: str, items: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{url}/v1/score", json={"items": items}, timeout=60)


def test_rule_steps_come_back_beside_the_reward(live_reward: Any) -> None:
    steps = {"source": "rule", "rule": "column_addition"}
    items = [
        {"id": k, "prompt": "047+586=", "completion": c, "checks": {"math": {"gold": "633"}, "steps": steps}}
        for k, c in (("right", RIGHT), ("slip", SLIP))
    ]
    r = score(live_reward.http_url, items)
    assert r.status_code == 200, r.text
    right, slip = r.json()["results"]
    assert right["reward"] == 1.0 and [s["score"] for s in right["steps"]] == [1.0, 1.0, 1.0, 1.0]
    assert [RIGHT[s["start"] : s["end"]] for s in right["steps"]][:3] == ["13", "13", "06"]
    assert slip["reward"] == 0.0 and [s["score"] for s in slip["steps"]] == [1.0, 0.0, 1.0, 0.0]
    assert slip["steps"][1]["detail"] == "column 2: 4+8+1 is 13, not 12"
    unjudgeable = score(live_reward.http_url, [{**items[0], "prompt": "Add them."}]).json()["results"][0]
    assert unjudgeable["reward"] == 1.0 and unjudgeable["steps"][0]["score"] is None
    assert unjudgeable["steps"][0]["status"] == "cannot_judge"


def test_rule_steps_over_grpc(live_reward: Any) -> None:
    with grpc.insecure_channel(live_reward.grpc_addr) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        checks = pb.Checks(math=pb.MathCheck(gold="633"), steps=pb.StepsCheck(source="rule", rule="column_addition"))
        reply = stub.Score(pb.ScoreRequest(items=[pb.ScoreItem(id="s", prompt="047+586=", completion=SLIP,
                                                               checks=checks)]), timeout=30)  # fmt: skip
        [result] = reply.results
        assert [s.score for s in result.steps] == [1.0, 0.0, 1.0, 0.0]
        assert [SLIP[s.start : s.end] for s in result.steps][:3] == ["13", "12", "06"]
        bad = pb.Checks(math=pb.MathCheck(gold="1"), steps=pb.StepsCheck(source="rule", rule="nope"))
        with pytest.raises(grpc.RpcError) as err:
            stub.Score(pb.ScoreRequest(items=[pb.ScoreItem(id="b", completion="x", checks=bad)]), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown step rule 'nope'" in str(
            err.value.details()
        )


@pytest.mark.parametrize(
    ("steps", "status", "needle"),
    [
        ({"source": "rule", "rule": "nope"}, 422, "unknown step rule 'nope'; available: ['column_addition']"),
        ({"source": "rule", "rule": "column_addition", "delimiter": "\n"}, 422, "cuts the completion itself"),
        ({"source": "prm", "delimiter": "\n", "spans": [{"start": 0, "end": 1}]}, 422, "not both"),
        ({"source": "prm", "spans": [{"start": 0, "end": 99}]}, 422, "not inside the 5-char completion"),
        ({"source": "prm", "spans": [{"start": 2, "end": 4}, {"start": 1, "end": 2}]}, 422, "before the previous"),
        ({"source": "oracle"}, 422, "source"),
        ({"source": "prm"}, 400, "prm_path"),
    ],
)
def test_step_checks_that_cannot_work_are_refused(live_reward: Any, steps: dict[str, Any], status: int,
                                                  needle: str) -> None:  # fmt: skip
    item = {"id": "a", "prompt": "1+1=", "completion": "a\nb\nc", "checks": {"format": {}, "steps": steps}}
    r = score(live_reward.http_url, [item])
    assert r.status_code == status, r.text
    assert needle in r.text


def test_a_server_prm_scores_each_step(start_reward: Any, tmp_path: Path) -> None:
    prm = save_tiny_prm(tmp_path / "prm")
    service = start_reward("--prm-path", str(prm))
    completion = "Step 1: 12 + 7 = 19.\n\nStep 2: 19 * 2 = 38.\n\nThe answer is 38."
    item = {"id": "p", "prompt": "What is (12 + 7) * 2?", "completion": completion,
            "checks": {"math": {"gold": "38"}, "steps": {"source": "prm", "delimiter": "\n\n"}}}  # fmt: skip
    second = completion.index("Step 2")
    spans = [{"start": 0, "end": second}, {"start": second, "end": completion.index("The answer")}]
    r = score(service.http_url, [item, {**item, "id": "q", "checks": {**item["checks"],
                                                                      "steps": {"source": "prm", "spans": spans}}}])  # fmt: skip
    assert r.status_code == 200, r.text
    by_delimiter, by_spans = r.json()["results"]
    assert by_delimiter["reward"] == 1.0 and len(by_delimiter["steps"]) == 3
    assert all(0 < s["score"] < 1 and s["status"] == "ok" for s in by_delimiter["steps"])
    assert [(s["start"], s["end"]) for s in by_spans["steps"]] == [(sp["start"], sp["end"]) for sp in spans]
    # The same two steps scored the same way whether cut by the delimiter or given as spans.
    assert [s["score"] for s in by_spans["steps"]] == pytest.approx([s["score"] for s in by_delimiter["steps"][:2]])
