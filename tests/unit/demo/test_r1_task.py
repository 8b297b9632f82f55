"""The task family of R1's whole recipe (grpo.demo.r1_task): subtraction's scratchpad is the column algorithm, the
reward service's own verifiers give every worked answer full marks and a wrong one none, the splits are disjoint
per kind and interleaved, the rows are the trainer's, and the committed data files are the generator's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from grpo.demo.r1_task import (
    KINDS,
    Problem,
    borrow_scratchpad,
    data_files,
    make_splits,
    parse_prompt,
    prompt_rows,
    sft_rows,
    worked_answer,
    worked_scratchpad,
)
from grpo.demo.task import HIGH, LOW, WIDTH, jsonl

DATA = Path(__file__).resolve().parents[3] / "services" / "trainer" / "configs" / "data"


def test_the_borrow_scratchpad_is_column_subtraction() -> None:
    assert borrow_scratchpad(586, 47) == "19 03 05"  # 6-7 borrows: 9; 8-4-1 = 3; 5-0 = 5
    assert borrow_scratchpad(100, 1) == "19 19 00"  # a borrow that ripples through a zero
    assert borrow_scratchpad(999, 999) == "00 00 00"
    rng = random.Random(0)
    for _ in range(2000):
        b = rng.randint(LOW, HIGH)
        a = rng.randint(b, HIGH)
        columns = borrow_scratchpad(a, b).split()
        assert len(columns) == WIDTH and columns[-1][0] == "0"  # no borrow out of the top column: a >= b
        borrow = 0
        for i, col in enumerate(columns):  # each column: (borrow out, digit) of a_i - b_i - borrow in
            diff = (a // 10**i) % 10 - (b // 10**i) % 10 - borrow
            assert col == f"{int(diff < 0)}{diff % 10}"
            borrow = int(diff < 0)
        assert int("".join(c[1] for c in reversed(columns))) == a - b


def test_worked_answers_score_full_marks_with_the_reward_services_verifiers() -> None:
    from grpo.reward.verifiers.format import format_reward
    from grpo.reward.verifiers.math import verify_math

    for p in [Problem("sub", 586, 47), Problem("sub", 10, 10), Problem("add", 999, 999), Problem("add", 47, 586)]:
        text = worked_answer(p)
        assert format_reward(text).score == 1.0, text
        assert verify_math(text, p.gold).correct is True, text
        wrong = text.replace(f"<answer>{p.gold}<", f"<answer>{int(p.gold) + 1}<")
        assert verify_math(wrong, p.gold).correct is False, wrong
    assert worked_answer(Problem("sub", 586, 47)) == "<think>19 03 05</think><answer>539</answer>"
    assert Problem("sub", 586, 47).prompt == "586-047=" and Problem("add", 47, 586).prompt == "047+586="


def test_the_scratchpad_filter_keeps_only_the_column_algorithms_answers() -> None:
    """grpo.demo.r1_task:worked_scratchpad as the rejection-sampling stage loads and calls it (an rs_filters plug-in):
    a right result with a wrong scratchpad is rejected with a reason, the worked answer kept, other tasks kept."""
    from grpo.trainer.rejection import load_plugin

    keep = load_plugin("grpo.demo.r1_task:worked_scratchpad")
    assert keep is worked_scratchpad
    for p in [Problem("sub", 586, 47), Problem("add", 47, 586)]:
        candidate = {"prompt": p.prompt, "response": worked_answer(p) + " ", "task_type": p.kind}
        assert keep(candidate) is True and parse_prompt(p.prompt, p.kind) == p
        lucky = candidate["response"].replace("<think>", "<think>1", 1).replace(" ", "", 1)  # digits moved, same result
        assert lucky != candidate["response"] and f"<answer>{p.gold}</answer>" in lucky
        assert keep({**candidate, "response": lucky}) == "the scratchpad is not the column algorithm's"
    assert keep({"prompt": "Say hi", "response": "hi", "task_type": "chat"}) is True
    with pytest.raises(ValueError, match="not a sub prompt"):
        parse_prompt("586+047=", "sub")


def test_splits_are_disjoint_per_kind_held_out_and_interleaved() -> None:
    s = make_splits(n_sft=300, n_grpo=200, n_general=100, n_eval=50, seed=3)
    sizes = {"sft": 300, "grpo": 200, "general": 100, "eval": 50}
    seen: set[tuple[str, int, int]] = set()
    for name, n in sizes.items():
        problems = getattr(s, name)
        assert [p.kind for p in problems] == list(KINDS) * n  # add, sub, add, sub, ...: any prefix holds both
        keys = {(p.kind, p.a, p.b) for p in problems}
        assert len(keys) == 2 * n and not keys & seen, name
        seen |= keys
    assert all(p.a >= p.b for p in s.sft + s.grpo + s.general + s.eval if p.kind == "sub")
    assert make_splits(300, 200, 100, 50, seed=3) == s and make_splits(300, 200, 100, 50, seed=4) != s


def test_the_rows_are_the_trainers_and_fit_the_recipes_token_budget(tmp_path: Path) -> None:
    from grpo.common.tiny_model import ensure_tiny_model
    from grpo.trainer.data import load_rows
    from grpo.trainer.export import load_tokenizer

    tokenizer = load_tokenizer(str(ensure_tiny_model()))
    s = make_splits(n_sft=50, n_grpo=50, n_general=0, n_eval=10, seed=0)
    (tmp_path / "train.jsonl").write_text(jsonl(prompt_rows(s.grpo, "train")))
    (tmp_path / "sft.jsonl").write_text(jsonl(sft_rows(s.sft, "sft")))
    train = load_rows(tmp_path / "train.jsonl", tokenizer=tokenizer)
    sft = load_rows(tmp_path / "sft.jsonl", need_response=True, tokenizer=tokenizer)
    assert {r.task_type for r in train} == {r.task_type for r in sft} == set(KINDS)
    assert all(set(r.checks) == {"math", "format"} for r in train)
    # r1.yaml's max_new_tokens (24) holds the longest worked answer with EOS and leaves the overlong ramp (4) unreached.
    longest = max(len(tokenizer.encode(worked_answer(p), add_special_tokens=False)) + 1 for p in s.sft)
    assert longest <= 24 - 4, longest


@pytest.mark.parametrize("name", sorted(data_files()))
def test_the_recipes_data_is_the_generators(name: str) -> None:
    """services/trainer/configs/r1.yaml trains on committed rows; regenerate them with
    `python -m grpo.demo.r1_task services/trainer/configs/data`."""
    assert (DATA / name).read_text() == jsonl(data_files()[name]), f"{name} is stale: regenerate it"
