"""Format, language and overlong rewards: table-driven."""

from __future__ import annotations

import re
import time

import pytest

from grpo.reward.verifiers.format import format_reward, split_think_answer, tag_blocks
from grpo.reward.verifiers.language import detect_language, language_reward, word_counts
from grpo.reward.verifiers.overlong import overlong_penalty, overlong_reward
from grpo.reward.verifiers.steps import column_addition


@pytest.mark.parametrize(
    ("completion", "kwargs", "score"),
    [
        ("<think>2+2 is 4</think><answer>4</answer>", {}, 1.0),
        ("  <think>\nreason\n</think>\n<answer> 4 </answer>\n", {}, 1.0),
        ("<think></think><answer>4</answer>", {}, 0.5),  # empty think: no full credit
        ("<think>   </think><answer>4</answer>", {}, 0.5),
        ("<think>r</think><answer></answer>", {}, 0.5),
        ("<answer>4</answer>", {}, 0.0),
        ("<think>r</think>", {}, 0.0),
        ("<think>r</think><answer>4</answer> trailing", {}, 0.0),
        ("<think>r</think><answer>4</answer><answer>5</answer>", {}, 0.0),
        ("<think>a<think>b</think><answer>4</answer>", {}, 0.0),
        ("just text", {}, 0.0),
        # prefilled <think> by the chat template: flagged, or detected from a lone closer
        ("reasoning</think><answer>4</answer>", {"think_prefilled": True}, 1.0),
        ("reasoning</think><answer>4</answer>", {}, 1.0),
        ("</think><answer>4</answer>", {"think_prefilled": True}, 0.5),
        ("<think>r</think><answer>4</answer>", {"think_prefilled": True}, 1.0),
        # configurable tags
        ("<reason>r</reason><final>4</final>", {"think_tag": "reason", "answer_tag": "final"}, 1.0),
        ("<think>r</think><answer>4</answer>", {"think_tag": "reason", "answer_tag": "final"}, 0.0),
    ],
)
def test_format_reward(completion: str, kwargs: dict[str, object], score: float) -> None:
    judged = format_reward(completion, **kwargs)  # type: ignore[arg-type]
    assert judged.score == score, judged
    assert judged.status == "ok"


def test_split_think_answer() -> None:
    assert split_think_answer("<think>a</think><answer>b</answer>") == ("a", "b")
    assert split_think_answer("a</think><answer>b</answer>") == ("a", "b")
    assert split_think_answer("no tags") == (None, None)


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("hello world", {"zh": 0, "en": 2, "other": 0}),
        ("我们计算", {"zh": 4, "en": 0, "other": 0}),
        ("先算 x plus 1", {"zh": 2, "en": 1, "other": 0}),  # a letter alone is a variable
        # math and code are in no language (they counted as English words)
        ("设 $x + y = 10$，则 \\(x = 3\\)，所以 y = 7", {"zh": 4, "en": 0, "other": 0}),
        ("所以 \\frac{\\sqrt{2}}{2} 是答案", {"zh": 5, "en": 0, "other": 0}),
        ("运行 `print(total)` 和\n```python\nfor item in items:\n    pass\n```\n结束", {"zh": 5, "en": 0, "other": 0}),
        ("$$\\text{area} = \\pi r^2$$ so the area", {"zh": 0, "en": 3, "other": 0}),
        ("an unclosed $ sign stays text", {"zh": 0, "en": 5, "other": 0}),
        ("12 + 3 = 15", {"zh": 0, "en": 0, "other": 0}),
        ("привет world", {"zh": 0, "en": 1, "other": 1}),
    ],
)
def test_word_counts(text: str, counts: dict[str, int]) -> None:
    assert word_counts(text) == counts


@pytest.mark.parametrize(
    ("completion", "target", "prompt", "score", "status"),
    [
        ("<think>first add the numbers</think><answer>4</answer>", "en", "", 1.0, "ok"),
        ("<think>先把数字相加</think><answer>4</answer>", "zh", "", 1.0, "ok"),
        ("<think>先把数字相加</think><answer>4</answer>", "en", "", 0.0, "ok"),
        # mixed: 2 CJK words, 2 English words -> half
        ("<think>相加 then add</think><answer>4</answer>", "zh", "", 0.5, "ok"),
        # only the reasoning counts, not the answer
        ("<think>add them</think><answer>答案是四</answer>", "en", "", 1.0, "ok"),
        # no think block: the whole completion is the reasoning
        ("add them up", "en", "", 1.0, "ok"),
        ("<think>12+3</think><answer>15</answer>", "en", "", 0.0, "ok"),
        # a Chinese solution with formulas is all Chinese (it was 0.5)
        ("<think>设 x + y = 10，则 x = 3，所以 y = 7</think><answer>7</answer>", "zh", "", 1.0, "ok"),
        # auto from the prompt
        ("<think>先相加</think><answer>4</answer>", "auto", "计算二加二", 1.0, "ok"),
        ("<think>先相加</think><answer>4</answer>", "auto", "What is 2+2?", 0.0, "ok"),
        ("<think>add</think><answer>4</answer>", "auto", "", None, "cannot_judge"),
        ("<think>add</think><answer>4</answer>", "fr", "", None, "cannot_judge"),
    ],
)
def test_language_reward(completion: str, target: str, prompt: str, score: float | None, status: str) -> None:
    judged = language_reward(completion, target, prompt)
    assert judged.status == status, judged
    assert judged.score == (pytest.approx(score) if score is not None else None)


def test_detect_language() -> None:
    assert detect_language("How many apples?") == "en"
    assert detect_language("有多少个苹果?") == "zh"
    assert detect_language("1 + 1") is None


@pytest.mark.parametrize(
    ("length", "max_tokens", "buffer", "penalty"),
    [
        (0, 100, 20, 0.0),
        (80, 100, 20, 0.0),
        (90, 100, 20, -0.5),
        (100, 100, 20, -1.0),
        (101, 100, 20, -1.0),
        (100, 100, 0, 0.0),
        (101, 100, 0, -1.0),
    ],
)
def test_overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float) -> None:
    assert overlong_penalty(length, max_tokens, buffer) == pytest.approx(penalty)


def test_overlong_uses_token_count_when_given() -> None:
    assert overlong_reward("x" * 400, 100, 20).score == -1.0  # 400 chars ~ 100 tokens
    assert overlong_reward("x" * 400, 100, 20, completion_tokens=10).score == 0.0
    assert overlong_reward("x" * 360, 100, 20).score == pytest.approx(-0.5)


@pytest.mark.parametrize(
    ("text", "en"),
    [("résumé naïve café don't", 4), ("re\u0301sume\u0301", 1), ("Straße œuvre ŁÓDŹ Ærø", 4), ("it’s", 1)],
)
def test_accented_latin_words_are_one_word(text: str, en: int) -> None:
    assert word_counts(text) == {"zh": 0, "en": en, "other": 0}


def test_accented_english_reasoning_is_all_english() -> None:
    judged = language_reward("<think>résumé naïve café</think><answer>x</answer>", "en")
    assert (judged.score, judged.status) == (1.0, "ok")
    assert language_reward("<think>привет résumé</think>", "en").score == 0.5


@pytest.mark.parametrize(
    "completion",
    [
        "<think>" * 40_000,  # a repetition loop cut by the length limit: no closer anywhere
        "<think>x" + "</think>\n<answer>42</answer>\n" * 8_000 + "</thi",
        "<think>x</think><answer>" * 20_000,
    ],
)
def test_degenerate_repeated_tags_are_judged_in_linear_time(completion: str) -> None:
    """Format and language run inline in the service's event loop: a lazy regex over repeated tags took 5-50 s on
    these (quadratic), stalling every other item. Each is judged in well under a second, with the same verdicts."""
    started = time.perf_counter()
    judged = [format_reward(completion), language_reward(completion, "en"), *column_addition("1+2=", completion)]
    assert time.perf_counter() - started < 1.0
    assert judged[0].score == 0.0


@pytest.mark.parametrize(
    ("text", "tag", "spans"),
    [
        ("a<t>x</t>b<t>y</t>", "t", [(4, 5), (13, 14)]),
        ("<t><t>x</t>", "t", [(3, 7)]),  # the first opener's block, nested opener included (as the regex)
        ("<t>x</t><t>y", "t", [(3, 4)]),
        ("</t><t>", "t", []),
    ],
)
def test_tag_blocks_finds_what_the_regex_found(text: str, tag: str, spans: list[tuple[int, int]]) -> None:
    assert tag_blocks(text, tag) == spans
    assert spans == [m.span(1) for m in re.finditer(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)]
