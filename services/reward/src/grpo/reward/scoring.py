"""`/v1/score` semantics: turn component verdicts into one reward, null when it cannot be trusted.

Every component ends in one of three states:

* **judged** — a score (a wrong answer is a judged 0);
* **cannot judge** — the item itself gives the verifier nothing to judge with: the
  reward is null, the item status stays "ok" and `error` says why (the trainer skips
  the sample instead of learning from a made-up 0);
* **failed** — the infrastructure broke: the item status is "error" and the reward is
  null. Never a score of 0.

Per component:

| component | judged | cannot judge | failed |
|---|---|---|---|
| math | correct → 1, incorrect → 0 (an answer that blew sympy up past math_timeout_s while its gold alone verifies in 2 s is incorrect), unparseable_answer → 0 (the model gave no answer) | unparseable_gold; timeout (the gold itself blew sympy up, or no time was left to check it; worker killed) | error (verifier exception, worker crash, queue full, the request's deadline passing before or during the verification) |
| code | passed / total over real verdicts (fail, compile_error, timeout, runtime_error, memory_limit, process_limit, output_limit, skipped count as not passed); all-or-nothing with `partial_credit: false` | — | any test with sandbox_error, or the sandbox machinery itself failing |
| format | 1 / 0.5 (a block empty) / 0 | — | — |
| language | share of target-language words (0 when the reasoning has none) | target auto with a prompt that has no words | — |
| overlong | 0 … -1 | — | — |
| reward_model | the model's first logit, normalised as the check asks: (logit - shift) / scale, through a sigmoid with normalize sigmoid | — | the model raised, or returned nan / ±inf for the item, or the scale made the score infinite |
| plug-ins | the returned real number (bool as 1 / 0) | the plug-in returned None | it raised (SystemExit too), hung past plugin_timeout_s, returned a non-number (a string too), nan, ±inf, a number too large for a float, or the wrong count |

Step scores (checks.steps) are reported beside the reward, never folded into it: 1 / 0 from a rule, a
probability from a PRM (nan from the PRM fails the step), null when a step cannot be judged; a step scorer
that failed makes the item an error.

A component with weight 0 is informational: its result is reported (status and detail, failures included),
but it adds nothing to the sum and cannot null the reward, neither by not judging nor by failing. The
exception: when every component of an item has weight 0 there is no reward to protect, and a failure among
them makes the item an error (a reward of 0 must never stand for a failure). Components without a weight
count 1. Weights are bounded (±1e6) so the sum stays finite; a sum that is not finite anyway is an error with
the weights named, never a bare null.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from grpo.reward.schemas import CodeTestResult, ComponentResult, ScoreResult, StepScore, VerifyMathResponse
from grpo.reward.verifiers.result import Judgement
from grpo.reward.verifiers.steps import StepJudgement

FAILED_STATUSES = frozenset({"error", "sandbox_error", "checker_error", "pool_error"})
MATH_SCORES = {"correct": 1.0, "incorrect": 0.0, "unparseable_answer": 0.0}
MATH_CANNOT_JUDGE = frozenset({"unparseable_gold", "timeout"})


def math_judgement(result: VerifyMathResponse) -> Judgement:
    """The math component from a math verification."""
    if result.status in MATH_SCORES:
        return Judgement(MATH_SCORES[result.status], result.status, result.detail)
    if result.status in MATH_CANNOT_JUDGE:
        return Judgement(None, result.status, result.detail or f"math verifier: {result.status}")
    return Judgement(None, "error", result.detail or "math verifier failed")


def code_judgement(tests: Sequence[CodeTestResult], partial_credit: bool = True) -> Judgement:
    """passed / total (or all-or-nothing), unless a test could not run (sandbox_error): then the component failed."""
    if not tests:
        return Judgement(None, "cannot_judge", "no tests")
    broken = [i for i, t in enumerate(tests) if t.verdict in ("sandbox_error", "checker_error")]
    if broken:  # the judge itself failed: never a score
        first = tests[broken[0]]
        why = first.detail or first.stderr
        return Judgement(None, first.verdict, f"{len(broken)} test(s) could not be judged: {why[:200]}")
    passed = sum(t.verdict == "pass" for t in tests)
    score = passed / len(tests) if partial_credit else float(passed == len(tests))
    return Judgement(score, "ok", f"{passed}/{len(tests)} tests passed")


def combine(
    item_id: str,
    components: Mapping[str, Judgement],
    weights: Mapping[str, float],
    wall_s: float = 0.0,
    steps: Sequence[StepJudgement] | None = None,
) -> ScoreResult:
    """The weighted reward of one item, or null with the reason (see the module docstring).

    Step scores are reported beside the reward and do not change it; a step whose scorer failed fails the item
    (its steps are part of what was asked), a step that cannot be judged is reported as such.
    """
    reported = {
        name: ComponentResult(score=j.score, status=j.status, detail=j.detail) for name, j in components.items()
    }
    scored_steps = [StepScore(start=j.start, end=j.end, score=j.score, status=j.status, detail=j.detail)
                    for j in steps or ()]  # fmt: skip
    result = _combine(item_id, components, weights, wall_s, reported)
    result.steps = scored_steps
    broken = [j for j in steps or () if j.status in FAILED_STATUSES]
    if broken:
        why = f"steps: {len(broken)} step(s) failed ({broken[0].detail})"
        result.reward, result.status = None, "error"
        result.error = f"{result.error}; {why}" if result.error else why
    return result


def _combine(
    item_id: str,
    components: Mapping[str, Judgement],
    weights: Mapping[str, float],
    wall_s: float,
    reported: dict[str, ComponentResult],
) -> ScoreResult:
    failed, unjudged, reward = [], [], 0.0
    informational = all(weights.get(name, 1.0) == 0 for name in components)
    for name, j in components.items():
        weight = weights.get(name, 1.0)
        if j.score is not None and not math.isfinite(j.score):  # a verifier let nan through: never a score
            j = Judgement(None, "error", f"the component's score is {j.score}")
            reported[name] = ComponentResult(score=None, status=j.status, detail=j.detail)
        if weight == 0 and not informational:  # reported above; adds nothing (0 × inf is nan), nulls nothing
            continue
        if j.status in FAILED_STATUSES:
            failed.append(f"{name}: {j.status} ({j.detail})" if j.detail else f"{name}: {j.status}")
        elif j.score is None:
            if weight != 0:
                unjudged.append(f"{name}: {j.status}" + (f" ({j.detail})" if j.detail else ""))
        else:
            reward += weight * j.score
    if failed:
        return ScoreResult(
            id=item_id, reward=None, status="error", error="; ".join(failed), components=reported, wall_s=wall_s
        )
    if unjudged:
        error = "cannot judge: " + "; ".join(unjudged)
        return ScoreResult(id=item_id, reward=None, status="ok", error=error, components=reported, wall_s=wall_s)
    if not math.isfinite(reward):
        # Bounded weights keep this from happening; were it to, JSON would show a bare null and protobuf refuse it.
        error = f"the weighted sum is {reward} (weights {dict(weights)}): not a reward; use smaller weights"
        return ScoreResult(id=item_id, reward=None, status="error", error=error, components=reported, wall_s=wall_s)
    return ScoreResult(id=item_id, reward=reward, status="ok", components=reported, wall_s=wall_s)


def error_result(item_id: str, message: str, wall_s: float = 0.0) -> ScoreResult:
    """An item the service could not finish (deadline, overload mid-request, crash)."""
    return ScoreResult(id=item_id, reward=None, status="error", error=message, wall_s=wall_s)
