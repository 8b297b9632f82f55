"""Step scores for process supervision: cut a completion into steps, score each with a rule (or a PRM, prm.py).

A step is a character span [start, end) of the completion. Steps are scored 1 (right) or 0 (wrong) by a rule,
or with a probability by a process reward model; `None` means the step cannot be judged, and the item's status
says whether that is the task's fault (cannot_judge) or the machinery's (error) — never a 0.

`column_addition` is the rule for the demo's task, and the model for your own: a function that takes the prompt
and the completion, cuts the completion into its own steps and returns a `StepJudgement` for each, registered in
STEP_RULES under the name tasks ask for. A process reward model scores steps cut by a delimiter or given spans.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from grpo.reward.verifiers.format import tag_blocks

Span = tuple[int, int]


@dataclass(frozen=True)
class StepJudgement:
    start: int
    end: int
    score: float | None
    status: str  # ok | cannot_judge | error
    detail: str = ""


def cut_at(completion: str, delimiter: str) -> list[Span]:
    """Steps between delimiters; a delimiter closes the step before it. A piece with only whitespace (a doubled
    delimiter) is no step: it joins the step before it; at the start it belongs to no step (the token mapping
    gives it to the first). A completion without the delimiter is one step, an empty one is [(0, 0)]."""
    if not delimiter:
        raise ValueError("the step delimiter must not be empty")
    spans: list[Span] = []
    start = 0
    while (at := completion.find(delimiter, start)) >= 0:
        end = at + len(delimiter)
        if completion[start:at].strip():
            spans.append((start, end))
        elif spans:
            spans[-1] = (spans[-1][0], end)
        start = end
    if completion[start:].strip() or not spans:
        spans.append((start if spans else 0, len(completion)))
    return spans


def check_spans(spans: list[Span], completion: str) -> None:
    """Explicit spans must be ordered, non-overlapping and inside the completion (ValueError otherwise)."""
    if not spans:
        raise ValueError("steps.spans is empty: give at least one span, or a delimiter")
    last = 0
    for i, (start, end) in enumerate(spans):
        if not 0 <= start <= end <= len(completion):
            raise ValueError(f"steps.spans[{i}] = [{start}, {end}] is not inside the {len(completion)}-char completion")
        if start < last:
            raise ValueError(f"steps.spans[{i}] starts at {start}, before the previous span ends ({last})")
        last = end


# ---- rules --------------------------------------------------------------------------------------------------

_SUM = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*=\s*$")


def column_addition(prompt: str, completion: str) -> list[StepJudgement]:
    """The demo's scratchpad, `047+586=` → `<think>13 13 06</think><answer>633</answer>`, checked step by step.

    Steps: each whitespace-separated entry of the <think> block (one column, right to left, written as carry-out
    and digit), then the <answer>. Column k is right when it equals a_k + b_k + carry-in, the carry-in read from
    the model's own previous entry (so one slip does not mark every later column wrong); an entry that is not two
    digits, or a column past the operands' width, is wrong. The answer step is right when it is the true sum.
    Without a <think> block the whole completion is one step: the answer's.
    """
    numbers = _SUM.match(prompt.strip().splitlines()[-1] if prompt.strip() else "")
    if numbers is None:
        span = (0, len(completion))
        why = f"column_addition needs a prompt ending in 'a+b=', got {prompt[-40:]!r}"
        return [StepJudgement(*span, None, "cannot_judge", why)]
    a, b = numbers.group(1), numbers.group(2)
    width = max(len(a), len(b))
    digits_a, digits_b = a.zfill(width)[::-1], b.zfill(width)[::-1]
    steps: list[StepJudgement] = []
    think = tag_blocks(completion, "think")[:1]  # linear, where a regex is quadratic on repeated tags
    if think:
        carry = 0
        for k, entry in enumerate(re.finditer(r"\S+", completion[slice(*think[0])])):
            start, end = think[0][0] + entry.start(), think[0][0] + entry.end()
            text = entry.group()
            if k >= width:
                steps.append(StepJudgement(start, end, 0.0, "ok", f"column {k + 1} does not exist"))
                continue
            want = int(digits_a[k]) + int(digits_b[k]) + carry
            right = text == f"{want:02d}"
            detail = "" if right else f"column {k + 1}: {digits_a[k]}+{digits_b[k]}+{carry} is {want:02d}, not {text}"
            steps.append(StepJudgement(start, end, float(right), "ok", detail))
            carry = int(text[0]) if re.fullmatch(r"[01]\d", text) else want // 10
    answers = tag_blocks(completion, "answer")
    start = steps[-1].end if steps else 0
    end = answers[-1][1] + len("</answer>") if answers else len(completion)
    said = completion[slice(*answers[-1])].strip() if answers else ""
    total = add_decimal(a, b)
    # Leading zeros as the zero-padded operands have them (`059` for 047+012) are the same number, as the outcome's
    # math check reads it: compared as a string only, a right answer's step was scored 0 beside a reward of 1.
    right = (said.lstrip("0") or "0") == total if re.fullmatch(r"[0-9]+", said) else False
    detail = "" if right else f"the answer is {_clip(total)}, not {_clip(said) or 'missing'}"
    steps.append(StepJudgement(start, max(start, end), float(right), "ok", detail))
    return steps


def add_decimal(a: str, b: str) -> str:
    """The sum of two non-negative decimal strings, without int(): Python refuses to convert strings of over
    4300 digits (a guard against slow conversion), and a long operand is the task's business, not an error."""
    width = max(len(a), len(b))
    digits, carry = [], 0
    for x, y in zip(reversed(a.zfill(width)), reversed(b.zfill(width)), strict=True):
        carry, digit = divmod(int(x) + int(y) + carry, 10)
        digits.append(str(digit))
    if carry:
        digits.append("1")
    return "".join(reversed(digits)).lstrip("0") or "0"


def _clip(text: str, keep: int = 40) -> str:
    """A long number shown by its ends (a 5000-digit sum in a detail is no help)."""
    return text if len(text) <= 2 * keep else f"{text[:keep]}…{text[-keep:]} ({len(text)} digits)"


StepRule = Callable[[str, str], list[StepJudgement]]
STEP_RULES: dict[str, StepRule] = {"column_addition": column_addition}
