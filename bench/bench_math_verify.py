"""Our math verifier against plain math-verify on Math-Verify's own test suite (270 cases), in one process.

For every case of tests/data/math_verify_suite.json, with the settings its test uses: does plain
`math_verify.verify(parse(gold), parse(pred))` agree with the expected verdict, does ours
(`grpo.reward.verifiers.math.verify_math`, what the API runs in its workers), and how long each takes.
Writes bench/results/math_verify.json; the ratio is ours / plain over the whole suite (best of 3).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from grpo.reward.verifiers.math import MathOptions, verify_math

HERE = Path(__file__).resolve().parent
SUITE = json.loads((HERE.parent / "tests" / "data" / "math_verify_suite.json").read_text())["cases"]
log = logging.getLogger("bench_math_verify")


def plain(case: dict) -> bool:
    """math-verify as its own tests call it (compare_strings)."""
    targets = [LatexExtractionConfig(boxed_match_priority=0) if m == "latex" else ExprExtractionConfig()
               for m in case["extraction"]]  # fmt: skip
    gold, pred = parse(case["gold"], targets), parse(case["pred"], targets)
    settings = {"strict": case["strict"], "allow_set_relation_comp": case["allow_set_relation_comp"]}
    return bool(verify(gold, pred, float_rounding=case["precision"], **settings))


def ours(case: dict) -> bool | None:
    options = MathOptions(tuple(case["extraction"]), case["precision"], case["strict"], case["allow_set_relation_comp"])
    return verify_math(case["pred"], case["gold"], options).correct


def timed(fn: object) -> tuple[float, list]:
    best, verdicts = float("inf"), []
    for _ in range(3):
        started = time.perf_counter()
        verdicts = [fn(c) for c in SUITE]  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best, verdicts


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for case in SUITE[:20]:  # warm sympy's caches for both
        plain(case), ours(case)
    plain_s, plain_v = timed(plain)
    ours_s, ours_v = timed(ours)
    expected = [c["expected"] for c in SUITE]
    result = {
        "cases": len(SUITE),
        "plain_agree": sum(v == e for v, e in zip(plain_v, expected, strict=True)),
        "ours_agree": sum(v is e for v, e in zip(ours_v, expected, strict=True)),
        "ours_disagree": [
            {
                "source": c["source"],
                "gold": c["gold"][:100],
                "pred": c["pred"][:100],
                "expected": c["expected"],
                "ours": v,
            }
            for c, v in zip(SUITE, ours_v, strict=True)
            if v is not c["expected"]
        ],
        "plain_s": round(plain_s, 3),
        "ours_s": round(ours_s, 3),
        "ours_over_plain": round(ours_s / plain_s, 3),
    }
    out = HERE / "results" / "math_verify.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    log.info("%s", json.dumps({k: v for k, v in result.items() if k != "ours_disagree"}))


if __name__ == "__main__":
    main()
