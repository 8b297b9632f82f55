"""Math-Verify's own test suite, through our HTTP API: as right as math-verify, or right where it is not.

tests/data/math_verify_suite.json holds the 270 (gold, prediction, expected) cases of Math-Verify's tests/
(huggingface/Math-Verify, MIT licence; regenerate with scripts/vendor_math_verify_suite.py), each with the
settings its test uses. Every case is sent to POST /v1/verify/math with those settings.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow  # 270 cases through the API: `make test`

SUITE = json.loads((Path(__file__).parents[1] / "data" / "math_verify_suite.json").read_text())
# Where we answer differently on purpose: (gold, prediction) -> (our status, why).
DELIBERATE = {
    ("$1 - \\frac{1}{\\mathrm{e}}$", "$1 + \\frac{1}{\\mathrm{e}}$"): (
        "incorrect",
        "a sign error: math-verify reads \\mathrm{e} as text and both sides as 1; we read it as Euler's e",
    ),
    ("\\\\boxed{W(n) = 1 \\\\text{ and } W(n) = -1", "W(x)=1orW(x)=-1"): (
        "unparseable_gold",
        "the gold has an unclosed brace: a malformed gold is not trusted, whatever the answer",
    ),
    ("$10$", "Answer \\( (9+1) \\)"): (
        "incorrect",
        "an expression for an integer gold, not the number: paid, a policy restates the question (allow_unevaluated)",
    ),
    ("$1$", "$\\frac3{3} $"): ("incorrect", "an expression for an integer gold, not the number (allow_unevaluated)"),
}
UNEVALUATED = [key for key, (_, why) in DELIBERATE.items() if "allow_unevaluated" in why]


def judge(service: Any, case: dict[str, Any]) -> dict[str, Any]:
    body = {"answer": case["pred"], "gold": case["gold"]}
    keys = ("extraction", "precision", "strict", "allow_set_relation_comp", "allow_unevaluated")
    body.update({k: case[k] for k in keys if k in case})
    r = httpx.post(f"{service.http_url}/v1/verify/math", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_math_verify_suite_through_the_api(live_reward: Any) -> None:
    cases = SUITE["cases"]
    assert len(cases) == 270
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda c: judge(live_reward, c), cases))
    misses, deliberate = [], 0
    for case, verdict in zip(cases, verdicts, strict=True):
        planned = DELIBERATE.get((case["gold"], case["pred"]))
        if planned is not None:
            assert verdict["status"] == planned[0], (case, verdict, planned[1])
            deliberate += 1
        elif verdict["correct"] is not case["expected"]:
            misses.append((case["source"], case["gold"][:80], case["pred"][:80], case["expected"], verdict["status"]))
    assert not misses, f"{len(misses)} of {len(cases)} disagree with math-verify's suite:\n" + "\n".join(
        map(str, misses)
    )
    assert deliberate == len(DELIBERATE)


def test_allow_unevaluated_answers_as_math_verify_does(live_reward: Any) -> None:
    cases = [c for c in SUITE["cases"] if (c["gold"], c["pred"]) in UNEVALUATED]
    assert len(cases) == len(UNEVALUATED) == 2
    for case in cases:
        verdict = judge(live_reward, {**case, "allow_unevaluated": True})
        assert verdict["correct"] is case["expected"] is True, (case, verdict)
