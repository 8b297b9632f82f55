"""Issue 33's math rewards through both APIs: a list gold is a list, an undefined gold cannot be judged.

A comma-list gold (`-2, 1`: all the roots, as MATH writes them) was read as its last number, so `\\boxed{1}` was
paid and `\\boxed{-2, 1}` was not; `\\infty-\\infty` and `1,,2` were golds every answer missed (or `1` hit).
Each case goes through POST /v1/verify/math, gRPC VerifyMath and a /v1/score item's math check.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc

# (answer, gold, status)
CASES = [
    ("$\\boxed{1}$", "-2, 1", "incorrect"),  # a partial list: paid before
    ("$\\boxed{-2, 1}$", "-2, 1", "correct"),  # the whole list: refused before
    ("The roots are $\\boxed{1}$ and $\\boxed{-2}$.", "-2, 1", "correct"),
    ("\\boxed{2}, \\boxed{3}", "2, 3", "correct"),  # the docs' own example
    ("\\boxed{3}", "1, 2, 3", "incorrect"),
    ("\\boxed{1000}", "1,000", "correct"),  # thousands stay thousands
    ("\\boxed{5}", "\\infty-\\infty", "unparseable_gold"),
    ("\\boxed{0}", "0\\cdot\\infty", "unparseable_gold"),
    ("\\boxed{1}", "1,,2", "unparseable_gold"),
]


@pytest.fixture
def stub(live_reward: Any) -> Iterator[reward_pb2_grpc.RewardServiceStub]:
    with grpc.insecure_channel(live_reward.grpc_addr) as channel:
        yield reward_pb2_grpc.RewardServiceStub(channel)


@pytest.mark.parametrize(("answer", "gold", "status"), CASES)
def test_lists_and_undefined_golds_over_http_and_grpc(
    live_reward: Any, stub: reward_pb2_grpc.RewardServiceStub, answer: str, gold: str, status: str
) -> None:
    http = httpx.post(f"{live_reward.http_url}/v1/verify/math", json={"answer": answer, "gold": gold}, timeout=60)
    assert http.status_code == 200, http.text
    assert http.json()["status"] == status, http.json()
    assert http.json()["correct"] == {"correct": True, "incorrect": False}.get(status)
    assert stub.VerifyMath(pb.VerifyMathRequest(answer=answer, gold=gold), timeout=60).status == status


def test_a_score_item_pays_only_the_whole_list(live_reward: Any) -> None:
    """The trainer's path: /v1/score with a math check. A partial list scores 0, an undefined gold is no score."""
    items = [
        {"id": "whole", "completion": "<answer>\\boxed{1, -2}</answer>", "checks": {"math": {"gold": "-2, 1"}}},
        {"id": "part", "completion": "<answer>\\boxed{1}</answer>", "checks": {"math": {"gold": "-2, 1"}}},
        {
            "id": "undefined",
            "completion": "<answer>\\boxed{5}</answer>",
            "checks": {"math": {"gold": "\\infty-\\infty"}},
        },
    ]
    wrong = {  # an earlier right box corrected to a wrong one, a right box then a wrong final sentence, cut off
        "corrected": "\\boxed{-2, 1} ... no wait, the roots are \\boxed{1}",
        "later_sentence": "First \\boxed{-2, 1}. The final answer is $5$.",
        "truncated": "<answer>\\boxed{-2, 1",
    }
    items += [{"id": k, "completion": v, "checks": {"math": {"gold": "-2, 1"}}} for k, v in wrong.items()]
    r = httpx.post(f"{live_reward.http_url}/v1/score", json={"items": items}, timeout=60)
    assert r.status_code == 200, r.text
    by_id = {result["id"]: result for result in r.json()["results"]}
    assert by_id["whole"]["reward"] == 1.0, by_id["whole"]
    assert by_id["part"]["reward"] == 0.0, by_id["part"]
    assert by_id["undefined"]["reward"] is None, by_id["undefined"]  # no score, never a silent 0
    for key in wrong:
        assert by_id[key]["reward"] == 0.0, by_id[key]
