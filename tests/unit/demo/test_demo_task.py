"""The demo task: disjoint seeded splits, worked-answer format, answer extraction (pure, no torch)."""

from __future__ import annotations

import pytest

from grpo.demo.task import (
    Problem,
    extract_answer,
    is_correct,
    make_splits,
    prompt_rows,
    scratchpad,
    sft_rows,
    worked_answer,
)


def test_splits_are_disjoint_unique_and_sized() -> None:
    s = make_splits(n_sft=500, n_grpo=700, n_eval=300, seed=3)
    sft, grpo, held = ({p.key for p in part} for part in (s.sft, s.grpo, s.eval))
    assert (len(sft), len(grpo), len(held)) == (500, 700, 300)  # no duplicates inside a split
    assert not (sft & grpo) and not (sft & held) and not (grpo & held)


def test_splits_are_seeded() -> None:
    assert make_splits(100, 100, 50, seed=1) == make_splits(100, 100, 50, seed=1)
    assert make_splits(100, 100, 50, seed=1).eval != make_splits(100, 100, 50, seed=2).eval


def test_eval_side_is_the_same_for_every_split_size() -> None:
    # A held-out pair never becomes training data when a caller asks for more problems.
    small, big = make_splits(200, 200, 100, seed=0), make_splits(2000, 2000, 100, seed=0)
    assert not ({p.key for p in small.eval} & {p.key for p in big.sft + big.grpo})


def test_prompt_is_zero_padded_and_fixed_length() -> None:
    assert Problem(47, 586).prompt == "047+586="
    assert {len(p.prompt) for p in make_splits(300, 300, 100).eval} == {8}


@pytest.mark.parametrize(
    ("a", "b", "pad", "gold"),
    [
        (47, 586, "13 13 06", "633"),
        (999, 999, "18 19 19", "1998"),
        (10, 20, "00 03 00", "30"),
        (505, 505, "10 01 10", "1010"),
    ],
)
def test_worked_answer(a: int, b: int, pad: str, gold: str) -> None:
    assert scratchpad(a, b) == pad
    assert worked_answer(Problem(a, b)) == f"<think>{pad}</think><answer>{gold}</answer>"
    assert Problem(a, b).gold == gold == str(a + b)


def test_extraction_and_correctness() -> None:
    assert extract_answer("<think>x</think><answer> 633 </answer>") == "633"
    assert extract_answer("<answer>1</answer><answer>2</answer>") == "2"  # the last one, as the verifier reads
    assert extract_answer("633") is None
    assert is_correct(worked_answer(Problem(47, 586)), "633")
    assert is_correct("<answer>0633</answer>", "633")  # same integer
    assert not is_correct("<answer>634</answer>", "633")
    assert not is_correct("<answer>6 33</answer>", "633")
    assert not is_correct("<think>633</think>", "633")


def test_rows_carry_gold_and_response() -> None:
    p = Problem(47, 586)
    (row,) = prompt_rows([p], "eval")
    assert row == {"id": "eval-0", "prompt": "047+586=", "task_type": "math",
                   "checks": {"math": {"gold": "633"}, "format": {}}}  # fmt: skip
    assert sft_rows([p])[0]["response"] == worked_answer(p)
