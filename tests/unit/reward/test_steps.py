"""Step scores: the column-addition rule, cutting at a delimiter, a tiny PRM read at its separators, and how steps
travel beside the reward (never folded into it; a failed step scorer fails the item)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo.reward.scoring import combine
from grpo.reward.verifiers.result import Judgement
from grpo.reward.verifiers.steps import StepJudgement, column_addition, cut_at
from tests.unit.reward.helpers import save_tiny_prm, save_tiny_remote_code_prm

RIGHT = "<think>13 13 06</think><answer>633</answer>"  # 047+586: 7+6=13, 4+8+1=13, 0+5+1=06


def scores(prompt: str, completion: str) -> list[float | None]:
    return [j.score for j in column_addition(prompt, completion)]


def test_column_addition_checks_each_column_and_the_answer() -> None:
    judged = column_addition("047+586=", RIGHT)
    assert [RIGHT[j.start : j.end] for j in judged] == ["13", "13", "06", "</think><answer>633</answer>"]
    assert [j.score for j in judged] == [1.0, 1.0, 1.0, 1.0]
    # A slip in column 2 (carry written as 1, digit wrong): column 3 is judged with the model's own carry.
    assert scores("047+586=", "<think>13 12 06</think><answer>623</answer>") == [1.0, 0.0, 1.0, 0.0]
    # Dropping the carry in column 2 makes column 3 right only if it uses carry 0 as written.
    assert scores("047+586=", "<think>13 03 05</think><answer>533</answer>") == [1.0, 0.0, 1.0, 0.0]
    # A malformed entry, an extra column, a missing answer.
    assert scores("047+586=", "<think>13 1 06 00</think>") == [1.0, 0.0, 1.0, 0.0, 0.0]
    detail = column_addition("047+586=", "<think>13 12 06</think><answer>623</answer>")[1].detail
    assert detail == "column 2: 4+8+1 is 13, not 12"


def test_column_addition_without_a_scratchpad_is_one_step_and_a_bad_prompt_cannot_be_judged() -> None:
    assert scores("047+586=", "<answer>633</answer>") == [1.0]
    assert scores("047+586=", "633") == [0.0]  # no <answer> block: the answer step is wrong
    [step] = column_addition("What is the capital of France?", RIGHT)
    assert step.score is None and step.status == "cannot_judge" and "a+b=" in step.detail


def test_cut_at_a_delimiter() -> None:
    text = "Step 1: x = 2.\n\nStep 2: y = 3.\n\nSo 5."
    spans = cut_at(text, "\n\n")
    assert [text[s:e] for s, e in spans] == ["Step 1: x = 2.\n\n", "Step 2: y = 3.\n\n", "So 5."]
    assert cut_at("no delimiter here", "\n\n") == [(0, 17)]  # one step
    assert cut_at("", "\n") == [(0, 0)]  # an empty completion is one empty step
    assert cut_at("a\n\n\n\nb", "\n\n") == [(0, 5), (5, 6)]  # a doubled delimiter makes no empty step
    with pytest.raises(ValueError, match="must not be empty"):
        cut_at("x", "")


def test_steps_are_reported_beside_the_reward_and_a_failed_scorer_fails_the_item() -> None:
    math = {"math": Judgement(1.0, "correct")}
    ok = combine("a", math, {}, steps=[StepJudgement(0, 2, 1.0, "ok"), StepJudgement(2, 5, 0.0, "ok", "wrong")])
    assert ok.reward == 1.0 and ok.status == "ok" and [s.score for s in ok.steps] == [1.0, 0.0]
    unjudged = combine("b", math, {}, steps=[StepJudgement(0, 5, None, "cannot_judge", "no a+b=")])
    assert unjudged.reward == 1.0 and unjudged.steps[0].score is None  # the trainer decides; the outcome stands
    broken = combine("c", math, {}, steps=[StepJudgement(0, 5, None, "error", "the PRM failed: boom")])
    assert broken.reward is None and broken.status == "error" and "the PRM failed: boom" in broken.error


@pytest.fixture(scope="module")
def tiny_prm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_prm(tmp_path_factory.mktemp("tiny-prm"))


def test_a_prm_is_read_at_the_separator_after_each_step(tiny_prm: Path) -> None:
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from grpo.reward.verifiers.prm import ProcessRewardModel

    prm = ProcessRewardModel(str(tiny_prm))
    completion = "Step 1: 12 + 7 = 19.\n\nStep 2: 19 * 2 = 38.\n\nThe answer is 38."
    spans = cut_at(completion, "\n\n")
    judged = prm.score("What is (12 + 7) * 2?", completion, spans)
    assert [(j.start, j.end) for j in judged] == spans and all(j.status == "ok" for j in judged)
    got = [j.score for j in judged]
    assert all(s is not None and 0.0 < s < 1.0 for s in got)
    # By hand: the steps stripped, each followed by <extra_0>, after the prompt; softmax(logits)[1] at each one.
    tokenizer = AutoTokenizer.from_pretrained(tiny_prm)
    model = AutoModelForTokenClassification.from_pretrained(tiny_prm).eval()
    steps = "Step 1: 12 + 7 = 19.<extra_0>Step 2: 19 * 2 = 38.<extra_0>The answer is 38.<extra_0>"
    messages = [{"role": "user", "content": "What is (12 + 7) * 2?"}, {"role": "assistant", "content": steps}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)  # as Qwen's PRM card
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        probs = torch.softmax(model(input_ids=ids).logits[0], dim=-1)[:, 1]
    at = (ids[0] == tokenizer.convert_tokens_to_ids("<extra_0>")).nonzero().flatten().tolist()
    assert got == pytest.approx([float(probs[i]) for i in at], abs=1e-6)
    # A separator inside a step's text is removed (it would shift every later score); past max_length: null.
    planted = prm.score("q", "a<extra_0>b\nc", cut_at("a<extra_0>b\nc", "\n"))
    assert len(planted) == 2 and all(j.score is not None for j in planted)
    short = ProcessRewardModel(str(tiny_prm), max_length=at[0] + 1).score("What is (12 + 7) * 2?", completion, spans)
    assert short[0].score == pytest.approx(got[0], abs=1e-6)  # causal: the cut does not change an earlier score
    assert [j.status for j in short[1:]] == ["cannot_judge"] * 2 and short[1].score is None


def test_a_prm_folder_without_the_separator_token_is_refused(tmp_path: Path) -> None:
    from grpo.reward.verifiers.prm import ProcessRewardModel

    folder = save_tiny_prm(tmp_path / "prm", step_token="<step>")
    with pytest.raises(ValueError, match="no '<extra_0>' token"):
        ProcessRewardModel(str(folder))


def test_a_remote_code_prm_loads_as_qwen_math_prm_does(tmp_path: Path) -> None:
    """AutoModel + trust_remote_code (the folder's own head, logits first in a tuple); refused without the flag."""
    from grpo.reward.verifiers.prm import ProcessRewardModel

    folder = save_tiny_remote_code_prm(tmp_path / "remote-prm")
    with pytest.raises(ValueError, match="trust_remote_code"):
        ProcessRewardModel(str(folder))
    prm = ProcessRewardModel(str(folder), trust_remote_code=True)
    assert type(prm.model).__name__ == "Qwen2ForProcessRewardModel"
    completion = "x = 2\ny = 3\nso 5"
    judged = prm.score("Add 2 and 3.", completion, cut_at(completion, "\n"))
    assert len(judged) == 3 and all(j.score is not None and 0.0 < j.score < 1.0 for j in judged)


def test_column_addition_of_operands_longer_than_int_conversion_allows() -> None:
    a = "9" * 5000  # past Python's 4300-digit limit on int(str)
    [right] = column_addition(f"{a}+1=", f"<answer>1{'0' * 5000}</answer>")
    assert (right.score, right.status) == (1.0, "ok")
    [wrong] = column_addition(f"{a}+1=", "<answer>12</answer>")
    assert (wrong.score, wrong.status) == (0.0, "ok") and "(5001 digits), not 12" in wrong.detail


def test_a_zero_padded_right_answer_is_a_right_answer_step() -> None:
    """The operands are zero-padded (`047+012=`); an answer padded the same way (`059`) is the sum, and the outcome's
    math check pays it 1: the answer step must not call it wrong beside that reward."""
    assert scores("047+012=", "<think>09 05 00</think><answer>059</answer>") == [1.0, 1.0, 1.0, 1.0]
    assert scores("047+012=", "<think>09 05 00</think><answer>000</answer>")[-1] == 0.0
    assert scores("000+000=", "<answer>000</answer>") == [1.0]
    assert scores("047+012=", "<answer>59.0</answer>") == [0.0]  # the rule reads digits only
