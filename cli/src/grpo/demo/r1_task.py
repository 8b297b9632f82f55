"""The task family of R1's whole recipe (services/trainer/configs/r1.yaml): addition and subtraction (pure, seeded).

Two task kinds, one format, so one tiny model can learn both and one rule checks both:

* `add` is the demo's task (grpo.demo.task): `047+586=` → `<think>13 13 06</think><answer>633</answer>`.
* `sub`: `586-047=` (the first operand is never the smaller) → `<think>19 03 05</think><answer>539</answer>`:
  the columns right to left, each written as two digits (borrow out, difference digit), as addition writes
  (carry out, sum digit). The answer is the plain integer (no leading zeros), so the reward service's math
  verifier judges `<answer>N</answer>` against the gold as it does for addition.

Every row carries its kind as `task_type` (the trainer's per-task sampling weights, metrics and evaluation go
by it). The rows of the recipe's data files are `data_files()`:
`python -m grpo.demo.r1_task services/trainer/configs/data` writes them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from grpo.demo.task import HIGH, LOW, WIDTH, draw_splits, scratchpad, write_data_files

KINDS = ("add", "sub")
OPERATOR = {"add": "+", "sub": "-"}


@dataclass(frozen=True)
class Problem:
    """One problem of either kind; `sub` problems have a >= b (the difference is never negative)."""

    kind: str
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a:0{WIDTH}d}{OPERATOR[self.kind]}{self.b:0{WIDTH}d}="

    @property
    def gold(self) -> str:
        return str(self.a + self.b if self.kind == "add" else self.a - self.b)

    @property
    def key(self) -> tuple[int, int]:  # within one kind (splits are drawn per kind)
        return (self.a, self.b)


def borrow_scratchpad(a: int, b: int) -> str:
    """Column differences right to left, each as two digits (borrow out, digit): 586-47 → `19 03 05`."""
    columns, borrow = [], 0
    for i in range(WIDTH):
        diff = (a // 10**i) % 10 - (b // 10**i) % 10 - borrow
        borrow = int(diff < 0)
        columns.append(f"{borrow}{diff + 10 * borrow}")
    return " ".join(columns)


def worked_answer(problem: Problem) -> str:
    """The SFT target: the kind's scratchpad in <think>, the plain integer in <answer>."""
    pad = scratchpad(problem.a, problem.b) if problem.kind == "add" else borrow_scratchpad(problem.a, problem.b)
    return f"<think>{pad}</think><answer>{problem.gold}</answer>"


def parse_prompt(prompt: str, kind: str) -> Problem:
    """The problem a prompt of this family poses (`047+586=`, `586-047=`); ValueError for any other text."""
    a, sep, b = prompt.removesuffix("=").partition(OPERATOR[kind])
    if not (sep and prompt.endswith("=") and a.isdigit() and b.isdigit()):
        raise ValueError(f"not a {kind} prompt of this family: {prompt!r}")
    return Problem(kind, int(a), int(b))


def worked_scratchpad(candidate: dict[str, Any]) -> bool | str:
    """A rejection-sampling filter (`rs_filters: [grpo.demo.r1_task:worked_scratchpad]`): keep an answer only when
    its scratchpad is the column algorithm's too, not only its result (the math check reads the result alone, so a
    wrong scratchpad with a right result passes it). Rows of other task types are kept."""
    kind = candidate["task_type"]
    if kind not in KINDS:
        return True
    if candidate["response"].strip() == worked_answer(parse_prompt(candidate["prompt"], kind)):
        return True
    return "the scratchpad is not the column algorithm's"


def _problems(kind: str, rng: random.Random) -> Iterator[Problem]:
    while True:
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        yield Problem(kind, *((max(a, b), min(a, b)) if kind == "sub" else (a, b)))


def is_eval(problem: Problem, seed: int, eval_fraction: float) -> bool:
    """Deterministic split by a hash of kind and operands: a problem is eval or train for every caller, never both."""
    return random.Random(f"r1:{seed}:{problem.kind}:{problem.a}:{problem.b}").random() < eval_fraction


@dataclass(frozen=True)
class Splits:
    """Disjoint problems of each kind, interleaved kind by kind: the cold start's, the GRPO and rejection-sampling
    prompts, the general SFT data mixed into the re-SFT, and the held-out evaluation."""

    sft: list[Problem]
    grpo: list[Problem]
    general: list[Problem]
    eval: list[Problem]


def make_splits(
    n_sft: int, n_grpo: int, n_general: int, n_eval: int, seed: int = 0, eval_fraction: float = 0.1
) -> Splits:
    """`n_*` problems of EACH kind per split; no problem in two splits, none twice; eval never in train."""
    parts: dict[str, list[list[Problem]]] = {"sft": [], "grpo": [], "general": [], "eval": []}
    for kind in KINDS:
        train, held = draw_splits(_problems(kind, random.Random(f"r1:{seed}:{kind}")),
                                  lambda p: is_eval(p, seed, eval_fraction), n_sft + n_grpo + n_general, n_eval)  # fmt: skip
        parts["sft"].append(train[:n_sft])
        parts["grpo"].append(train[n_sft : n_sft + n_grpo])
        parts["general"].append(train[n_sft + n_grpo :])
        parts["eval"].append(held)
    return Splits(**{name: interleave(lists) for name, lists in parts.items()})


def interleave(lists: list[list[Problem]]) -> list[Problem]:
    """One of each list in turn (add, sub, add, sub, ...): any prefix of the file holds both kinds."""
    return [p for group in zip(*lists, strict=True) for p in group]


def prompt_rows(problems: list[Problem], prefix: str) -> list[dict[str, object]]:
    """GRPO, rejection-sampling and eval rows: prompt, task_type (the kind), the math and format checks."""
    return [
        {"id": f"{prefix}-{i}", "prompt": p.prompt, "task_type": p.kind,
         "checks": {"math": {"gold": p.gold}, "format": {}}}
        for i, p in enumerate(problems)
    ]  # fmt: skip


def sft_rows(problems: list[Problem], prefix: str) -> list[dict[str, object]]:
    """SFT rows: prompt, task_type and the worked answer as response (SFT needs no checks)."""
    return [
        {"id": f"{prefix}-{i}", "prompt": p.prompt, "task_type": p.kind, "response": worked_answer(p)}
        for i, p in enumerate(problems)
    ]


def data_files(seed: int = 0) -> dict[str, list[dict[str, object]]]:
    """The rows services/trainer/configs/r1.yaml trains on (services/trainer/configs/data/r1-*.jsonl)."""
    splits = make_splits(n_sft=2048, n_grpo=1024, n_general=512, n_eval=128, seed=seed)
    return {"r1-sft.jsonl": sft_rows(splits.sft, "sft"), "r1-train.jsonl": prompt_rows(splits.grpo, "train"),
            "r1-general.jsonl": sft_rows(splits.general, "general"),
            "r1-eval.jsonl": prompt_rows(splits.eval, "eval")}  # fmt: skip


if __name__ == "__main__":  # python -m grpo.demo.r1_task services/trainer/configs/data
    write_data_files(data_files())
