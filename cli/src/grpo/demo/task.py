"""The demo's synthetic task: zero-padded addition with a column scratchpad (pure, seeded, no torch).

A prompt is the compact sum `047+586=`; the worked answer adds the columns right to left,
each written as two digits (carry out, sum digit), then states the result:
`<think>13 13 06</think><answer>633</answer>`. The gold answer is a plain integer string,
so the reward service's math verifier judges `<answer>N</answer>` against it.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

LOW, HIGH = 10, 999
WIDTH = 3  # operands are zero-padded to this many digits: every prompt has the same length
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Problem:
    """One addition problem."""

    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a:0{WIDTH}d}+{self.b:0{WIDTH}d}="

    @property
    def gold(self) -> str:
        return str(self.a + self.b)

    @property
    def key(self) -> tuple[int, int]:
        return (self.a, self.b)


def scratchpad(a: int, b: int) -> str:
    """Column sums right to left, each as two digits (carry out, digit): 47+586 → `13 13 06`."""
    columns, carry = [], 0
    for i in range(WIDTH):
        total = (a // 10**i) % 10 + (b // 10**i) % 10 + carry
        columns.append(f"{total:02d}")
        carry = total // 10
    return " ".join(columns)


def worked_answer(problem: Problem) -> str:
    """The SFT target: the scratchpad in <think>, the plain integer in <answer>."""
    return f"<think>{scratchpad(problem.a, problem.b)}</think><answer>{problem.gold}</answer>"


def extract_answer(completion: str) -> str | None:
    """The last <answer> block's content, stripped; None when there is none (what the verifier reads)."""
    found = _ANSWER.findall(completion)
    return found[-1].strip() if found else None


def is_correct(completion: str, gold: str) -> bool:
    """Exact integer match of the extracted answer (the math verifier agrees on plain integers)."""
    answer = extract_answer(completion)
    if answer is None or not re.fullmatch(r"-?\d+", answer):
        return False
    return int(answer) == int(gold)


def _pairs(rng: random.Random) -> Iterator[Problem]:
    while True:
        yield Problem(rng.randint(LOW, HIGH), rng.randint(LOW, HIGH))


def is_eval(problem: Problem, seed: int, eval_fraction: float) -> bool:
    """Deterministic split by a hash of the operands: a pair is eval or train for every caller, never both."""
    return random.Random(f"{seed}:{problem.a}:{problem.b}").random() < eval_fraction


@dataclass(frozen=True)
class Splits:
    """Disjoint train problems (SFT pairs drawn first, then GRPO prompts) and held-out eval problems."""

    sft: list[Problem]
    grpo: list[Problem]
    eval: list[Problem]


def make_splits(
    n_sft: int = 4096, n_grpo: int = 4096, n_eval: int = 512, seed: int = 0, eval_fraction: float = 0.1
) -> Splits:
    """Seeded splits; eval problems are never in train (the eval side of the hash split), no duplicates."""
    train, held = draw_splits(_pairs(random.Random(seed)), lambda p: is_eval(p, seed, eval_fraction),
                              n_sft + n_grpo, n_eval)  # fmt: skip
    return Splits(sft=train[:n_sft], grpo=train[n_sft:], eval=held)


class Keyed(Protocol):
    @property
    def key(self) -> tuple[int, int]: ...


K = TypeVar("K", bound=Keyed)


def draw_splits(
    problems: Iterator[K], held_out: Callable[[K], bool], n_train: int, n_eval: int
) -> tuple[list[K], list[K]]:
    """Distinct problems (by key) in draw order until `n_train` train and `n_eval` held-out ones; `held_out` decides
    each problem's side, so a pair is never on both (shared by the addition and the tool demo)."""
    seen: set[tuple[int, int]] = set()
    train: list[K] = []
    held: list[K] = []
    for p in problems:
        if len(held) >= n_eval and len(train) >= n_train:
            break
        if p.key in seen:
            continue
        seen.add(p.key)
        if held_out(p):
            if len(held) < n_eval:
                held.append(p)
        elif len(train) < n_train:
            train.append(p)
    return train, held


def prompt_rows(problems: list[Problem], prefix: str) -> list[dict[str, object]]:
    """Trainer data rows: the prompt, task_type math, and checks for the math and format verifiers."""
    return [
        {
            "id": f"{prefix}-{i}",
            "prompt": p.prompt,
            "task_type": "math",
            "checks": {"math": {"gold": p.gold}, "format": {}},
        }
        for i, p in enumerate(problems)
    ]


def sft_rows(problems: list[Problem]) -> list[dict[str, object]]:
    """Trainer SFT rows: prompt plus the worked answer as response."""
    return [
        {**row, "response": worked_answer(p)} for row, p in zip(prompt_rows(problems, "sft"), problems, strict=True)
    ]


def jsonl(rows: list[dict[str, object]]) -> str:
    """Rows as the checked-in data files hold them: one compact JSON object per line."""
    return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)


def write_data_files(files: dict[str, list[dict[str, object]]]) -> None:
    """`python -m grpo.demo.<task> FOLDER`: each named file of rows into FOLDER."""
    for name, rows in files.items():
        (Path(sys.argv[1]) / name).write_text(jsonl(rows))
