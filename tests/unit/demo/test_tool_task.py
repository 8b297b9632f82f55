"""The tool demo's task: worked episodes print the gold in the real sandbox, segments alternate call / result /
answer, the splits are disjoint, episodes fit the token budgets, and the cold start's pairs are the trainer's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo.common.tool_formats import TAGGED_STOP, parse_tagged, render_tagged_result
from grpo.demo.tool_task import (
    A_RANGE,
    B_RANGE,
    MAX_PROMPT_TOKENS,
    RESULT_TOKENS,
    TURN_TOKENS,
    Problem,
    check_answer,
    make_splits,
    prompt_rows,
    run_product,
    sft_rows,
    tool_answer,
    worked_episode,
    worked_segments,
)

EXTREMES = [Problem(A_RANGE[0], B_RANGE[0]), Problem(A_RANGE[1], B_RANGE[1]), Problem(4821, 317)]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Any]:
    """The reward service's real sandbox (the python tool of the GRPO phase runs there)."""
    from grpo.reward.sandbox import make_sandbox
    from tests.support import sandbox_mode

    box = make_sandbox(workers=1, **sandbox_mode.options())
    yield box
    box.close()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from grpo.demo.config import TOOL_ARCH
    from grpo.demo.model import build_tokenizer

    return build_tokenizer(TOOL_ARCH["max_position_embeddings"])


def test_the_worked_code_prints_the_gold_in_the_sandbox(sandbox: Any) -> None:
    for p in [*EXTREMES, *make_splits(n_sft=5, n_grpo=0, n_eval=0, seed=1).sft]:
        call = parse_tagged(worked_segments(p)[0]["content"])
        assert call is not None and call.error is None and call.arguments["code"] == p.code
        ran = sandbox.run(p.code)
        assert ran.status == "ok", ran.stderr
        assert ran.stdout == p.gold + "\n"  # the tool's result is stdout less one newline: the gold
        assert run_product(p.code) == p.gold  # the cold start's in-process evaluator agrees


def test_segments_alternate_call_result_answer() -> None:
    p = Problem(4821, 317)
    segments = worked_segments(p)
    assert [s["role"] for s in segments] == ["assistant", "tool", "assistant"]
    assert segments[0]["content"] == "<code>print(4821*317)</code>" and segments[0]["content"].endswith(TAGGED_STOP)
    assert segments[1]["content"] == render_tagged_result("1528257") == "<output>1528257</output>"
    assert segments[2]["content"] == "<answer>1528257</answer>"
    assert p.prompt == "4821*317=" and p.gold == "1528257"
    assert check_answer(worked_episode(p), p.gold)
    # The answer is the last turn's: a right product in the tool's result alone is not an answer.
    assert not check_answer("<code>print(4821*317)</code><output>1528257</output><answer>1528</answer>", p.gold)


def test_rows_carry_the_gold_and_the_segments() -> None:
    p = Problem(12345, 6789)
    (row,) = sft_rows([p])
    assert row["prompt"] == "12345*6789=" and row["checks"] == {"math": {"gold": str(12345 * 6789)}}
    assert row["response"] == worked_segments(p)
    assert prompt_rows([p], "eval")[0]["id"] == "eval-0" and "response" not in prompt_rows([p], "eval")[0]


def test_splits_are_disjoint_seeded_and_in_range() -> None:
    s = make_splits(n_sft=300, n_grpo=400, n_eval=100, seed=2)
    sft, grpo, held = ({p.key for p in part} for part in (s.sft, s.grpo, s.eval))
    assert (len(sft), len(grpo), len(held)) == (300, 400, 100)
    assert not (sft & grpo) and not (sft & held) and not (grpo & held)
    assert make_splits(50, 50, 20, seed=2) == make_splits(50, 50, 20, seed=2) != make_splits(50, 50, 20, seed=3)
    assert all(A_RANGE[0] <= p.a <= A_RANGE[1] and B_RANGE[0] <= p.b <= B_RANGE[1] for p in s.sft + s.eval)
    assert {len(p.prompt) for p in s.sft} == {9, 10, 11}  # 4–5 digits times 3–4 digits


def test_the_in_process_tool_answers_like_the_sandbox_or_refuses() -> None:
    assert tool_answer("<code>print(12*-3+1)</code>") == "<output>-35</output>"
    assert tool_answer("<answer>4</answer>") is None  # no call: the turn is the answer
    assert tool_answer("<code> </code>") == "<output>Error: empty code block</output>"
    assert run_product("print(12*3").startswith("Error: SyntaxError: ")
    assert run_product("import os") == "Error: only print(<arithmetic>) is evaluated in-process"
    assert run_product("print(2**10)").startswith("Error: not integer arithmetic")


def test_episodes_fit_the_turn_and_position_budgets(tokenizer: Any) -> None:
    from grpo.demo.config import TOOL_ARCH

    for p in EXTREMES:
        call, result, answer = (tokenizer.encode(s["content"], add_special_tokens=False) for s in worked_segments(p))
        assert tokenizer.decode(call + result + answer) == worked_episode(p)  # every character has a token
        assert len(call) <= TURN_TOKENS and len(answer) + 1 <= TURN_TOKENS and len(result) <= RESULT_TOKENS
        assert len(tokenizer.encode(p.prompt, add_special_tokens=False)) <= MAX_PROMPT_TOKENS
    worst = MAX_PROMPT_TOKENS + 2 * TURN_TOKENS + len("<output></output>") + 100  # tool_output_chars default
    assert worst <= TOOL_ARCH["max_position_embeddings"]


def test_the_cold_start_pairs_are_the_trainers(tmp_path: Path, tokenizer: Any) -> None:
    """The in-process cold start encodes an episode as the trainer's SFT does: segment by segment, the tool's
    result masked out, EOS (trained) at the end."""
    from grpo.demo.tool_sft import segment_pair
    from grpo.trainer.data import load_rows
    from grpo.trainer.sft import to_pair

    p = Problem(4821, 317)
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in sft_rows([p])))
    (row,) = load_rows(data, need_response=True, tokenizer=tokenizer)
    theirs, ours = to_pair(tokenizer, row, apply_chat_template=False), segment_pair(tokenizer, p.prompt,
                                                                                     worked_segments(p))  # fmt: skip
    assert (ours.prompt_token_ids, ours.response_token_ids, ours.response_mask) == (
        theirs.prompt_token_ids, theirs.response_token_ids, theirs.response_mask)  # fmt: skip
    ids, mask = ours.response_token_ids, ours.response_mask
    assert ids[-1] == tokenizer.eos_token_id and mask[-1] == 1
    masked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    assert masked == "<output>1528257</output>"


def test_the_example_configs_data_is_the_generators() -> None:
    """services/trainer/configs/tool.yaml trains on committed rows; regenerate them with
    `python -m grpo.demo.tool_task services/trainer/configs/data`."""
    from grpo.demo.task import jsonl
    from grpo.demo.tool_task import data_files

    folder = Path(__file__).resolve().parents[3] / "services" / "trainer" / "configs" / "data"
    for name, rows in data_files().items():
        assert (folder / name).read_text() == jsonl(rows), f"{name} is stale: regenerate it"


def test_the_tool_task_settings_leave_the_addition_demo_alone() -> None:
    from grpo.demo.config import TOOL_ARCH, DemoConfig
    from grpo.trainer.config import TrainerSettings

    ports = {"model": "m", "train_data": "t", "eval_data": "e", "redis_url": "r", "run_id": "x", "output_dir": "o",
             "grpc_port": 1, "http_port": 2}  # fmt: skip
    addition, tool = DemoConfig(), DemoConfig(task="tool")
    assert "tools" not in addition.trainer_settings(**ports) and "task" not in addition.sft_settings()
    assert (addition.max_new_tokens, addition.steps, addition.sft_threshold) == (24, 200, 0.35)
    assert DemoConfig.quick().steps == 40 and DemoConfig.quick(task="tool").steps == 40
    assert DemoConfig(task="tool", steps=7).steps == 7  # an option given beats the task's default
    settings = tool.trainer_settings(**ports)
    trainer = TrainerSettings.model_validate({**settings, "redis_url": "redis://127.0.0.1:1/0"})
    assert trainer.tools == ["python"] and trainer.max_turns == 2 and trainer.reward_weights == {"math": 1.0}
    # The whole episode (every turn, one whole result) fits the model's positions after the longest prompt.
    assert MAX_PROMPT_TOKENS + trainer.max_episode_tokens <= TOOL_ARCH["max_position_embeddings"]
    assert tool.sft_settings()["task"] == "tool"  # its cold start is cached apart from the addition's
