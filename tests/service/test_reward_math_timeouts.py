"""A math verification that times out, through the real service: the answer's doing is a 0, the gold's a null.

A null reward makes the trainer drop the whole group as unscored: an answer that blows sympy up escaped its 0,
and its correct siblings lost their signal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

TOWER = "<think>big</think><answer>\\boxed{10^{10^{10}}}</answer>"  # sympy works on a 10^10-digit integer
BLOWUP_GOLD = "\\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}"


def score(service: Any, items: list[tuple[str, str, str]]) -> dict[str, Any]:
    body = {"items": [{"id": i, "completion": c, "checks": {"math": {"gold": g}}} for i, c, g in items]}
    r = httpx.post(f"{service.http_url}/v1/score", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return {res["id"]: res for res in r.json()["results"]}


def test_an_answer_that_blows_up_scores_0_and_its_group_keeps_its_rewards(start_reward: Callable[..., Any]) -> None:
    service = start_reward("--math-timeout-s", "1", "--sandbox", "off", workers=2)
    group = [
        ("tower", TOWER, "5"),
        ("right", "<think>2+3</think><answer>\\boxed{5}</answer>", "5"),
        ("wrong", "<think>2+2</think><answer>\\boxed{4}</answer>", "5"),
    ]
    results = score(service, group)
    assert [results[i]["reward"] for i in ("tower", "right", "wrong")] == [0.0, 1.0, 0.0], results
    tower = results["tower"]["components"]["math"]
    assert tower["status"] == "incorrect" and "the answer's doing" in tower["detail"], tower
    # /v1/verify/math says the same (its default deadline leaves time to check the gold).
    verdict = httpx.post(f"{service.http_url}/v1/verify/math", json={"answer": TOWER, "gold": "5"}, timeout=60)
    assert (verdict.json()["status"], verdict.json()["correct"]) == ("incorrect", False), verdict.text

    # A gold that blows up by itself cannot judge anything: still a timeout, a null reward.
    bad = score(service, [("bad-gold", "<answer>\\boxed{5}</answer>", BLOWUP_GOLD)])["bad-gold"]
    assert bad["reward"] is None and bad["components"]["math"]["status"] == "timeout", bad
    assert "the gold itself does not verify in time" in bad["components"]["math"]["detail"]
