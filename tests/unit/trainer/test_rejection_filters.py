"""Rejection sampling's selection on hand-made groups: exactly the documented filters (grpo.trainer.rejection), the SFT
rows they write with their provenance, and the summary's counts and reasons."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from grpo.trainer.data import PromptRow, parse_row
from grpo.trainer.rejection import (
    MAX_NONE_IDS,
    Candidate,
    PluginError,
    Rules,
    Tally,
    candidates,
    make_rules,
    required_components,
    rows_problem,
    rs_outcome,
    scripts,
    select,
    sft_row,
)
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2

ROW = parse_row({"id": "q7", "prompt": "What is 2 + 3?", "gold": "5", "checks": {"format": {}}}, "rows.jsonl line 1")


def sample(
    text: str,
    scores: dict[str, float | None],
    *,
    tokens: int = 5,
    finish: str = "stop",
    mask: list[int] | None = None,
    end: str = "",
) -> queue_pb2.SampleRecord:
    """A scored sample: `scores` per component (None: the component could not judge), its sum the reward."""
    s = queue_pb2.SampleRecord(
        completion=rollout_pb2.Completion(text=text, token_ids=list(range(10, 10 + tokens)), finish_reason=finish)
    )
    for name, score in scores.items():
        s.components[name].CopyFrom(reward_pb2.ComponentResult(status="ok"))
        if score is not None:
            s.components[name].score = score
    if all(v is not None for v in scores.values()):
        s.reward = sum(v for v in scores.values() if v is not None)
    if mask is not None:
        s.token_mask.extend(mask)
    if end:
        s.episode.end = end
    return s


def group(*samples: queue_pb2.SampleRecord, gid: str = "run-e0-3", version: int = 7) -> queue_pb2.GroupRecord:
    return queue_pb2.GroupRecord(group_id=gid, task_id=gid, status="ok", weight_version=version, samples=list(samples))


RIGHT = {"math": 1.0, "format": 1.0}


def pick(record: queue_pb2.GroupRecord, rules: Rules, row: PromptRow = ROW) -> tuple[list[int], dict[str, int]]:
    """The kept samples' indices and the rejections by reason."""
    chosen = select(candidates(record, row), rules, required_components(rules, row.components()))
    return [c.sample_index for c in chosen.kept], dict(chosen.rejected)


# ---- every required component passes -------------------------------------------------------------------------
def test_every_pass_fail_component_of_the_row_must_pass_and_the_first_failing_one_is_the_reason() -> None:
    record = group(
        sample("<think>a</think><answer>5</answer>", RIGHT),
        sample("<answer>5</answer>", {"math": 1.0, "format": 0.0}),
        sample("<think>a</think><answer>6</answer>", {"math": 0.0, "format": 1.0}),
        sample("6", {"math": 0.0, "format": 0.0}),  # both fail: format is checked first (names in order)
        sample("<think>b</think><answer>5</answer>", {"math": None, "format": 1.0}),  # math could not judge
        sample("<think>c</think><answer>5</answer>", {"format": 1.0}),  # math missing from the scores
    )
    kept, rejected = pick(record, make_rules(keep_per_prompt=8))
    assert kept == [0]
    assert rejected == {"failed component format": 2, "failed component math": 3}


def test_graded_components_are_not_required_unless_named() -> None:
    row = parse_row({"prompt": "p", "checks": {"math": {"gold": "5"}, "reward_model": {}, "overlong": {
        "max_tokens": 10, "buffer_tokens": 2}}}, "x")  # fmt: skip
    assert required_components(make_rules(), row.components()) == ("math",)
    record = group(sample("5", {"math": 1.0, "reward_model": 0.1, "overlong": -0.5}), sample("6", {"math": 0.0}))
    assert pick(record, make_rules(), row) == ([0], {"failed component math": 1})
    # Named, they must pass: the reward model's score against rs_pass_score.
    rules = make_rules(require=["math", "reward_model"], pass_score=0.5)
    assert pick(group(sample("5", {"math": 1.0, "reward_model": 0.1})), rules, row) == (
        [], {"failed component reward_model": 1})  # fmt: skip


def test_rs_require_names_the_components_and_rs_pass_score_sets_the_bar() -> None:
    record = group(sample("a", {"math": 0.0, "format": 1.0}), sample("b", {"math": 1.0, "format": 0.0}))
    assert pick(record, make_rules(require=["format"])) == ([0], {"failed component format": 1})
    code_row = parse_row(
        {"prompt": "p", "checks": {"code": {"tests": [{"stdio": {"stdin": "", "expected_stdout": "1"}}]}}}, "x"
    )
    tests = group(sample("x", {"code": 0.75}), sample("y", {"code": 0.5}), sample("z", {"code": 0.25}))
    assert pick(tests, make_rules(pass_score=0.5, keep_per_prompt=3), code_row) == ([0, 1], {
        "failed component code": 1})  # fmt: skip
    assert pick(tests, make_rules(keep_per_prompt=3), code_row)[0] == []  # 1.0: every test passed


# ---- quota, de-duplication, shortest first ------------------------------------------------------------------
def test_at_most_m_per_prompt_in_sample_order() -> None:
    record = group(*(sample(f"<think>{i}</think><answer>5</answer>", RIGHT) for i in range(5)))
    assert pick(record, make_rules(keep_per_prompt=2)) == ([0, 1], {"over quota": 3})
    assert pick(record, make_rules(keep_per_prompt=5)) == ([0, 1, 2, 3, 4], {})


def test_equal_answers_after_collapsing_whitespace_are_kept_once() -> None:
    record = group(
        sample("<think>two  plus\nthree</think> <answer>5</answer>", RIGHT),
        sample("  <think>two plus three</think> <answer>5</answer>\n", RIGHT),  # the same, whitespace aside
        sample("<think>two plus three</think><answer>5</answer>", RIGHT),  # no space between the blocks: different
        sample("<think>two plus three</think> <answer>5</answer>", RIGHT),
    )
    assert pick(record, make_rules(keep_per_prompt=4)) == ([0, 2], {"duplicate": 2})
    # A duplicate is a duplicate even when the quota is full.
    assert pick(record, make_rules(keep_per_prompt=1)) == ([0], {"duplicate": 2, "over quota": 1})


def test_shortest_first_keeps_the_shortest_passing_answers_ties_in_sample_order() -> None:
    record = group(
        sample("<think>long</think><answer>5</answer>", RIGHT, tokens=30),
        sample("<think>short</think><answer>5</answer>", RIGHT, tokens=8),
        sample("<think>wrong</think><answer>6</answer>", {"math": 0.0, "format": 1.0}, tokens=2),
        sample("<think>mid a</think><answer>5</answer>", RIGHT, tokens=12),
        sample("<think>mid b</think><answer>5</answer>", RIGHT, tokens=12),
    )
    assert pick(record, make_rules(keep_per_prompt=2, shortest_first=True)) == ([1, 3], {
        "failed component math": 1, "over quota": 2})  # fmt: skip
    assert pick(record, make_rules(keep_per_prompt=2))[0] == [0, 1]  # off: sample order
    # An episode's length is the model's tokens: tool output is not counted.
    episode = group(
        sample("<code>x</code><output>1234567</output><answer>5</answer>", RIGHT, tokens=20, mask=[1] * 6 + [0] * 14),
        sample("<think>no tool at all</think><answer>5</answer>", RIGHT, tokens=10),
    )
    chosen = select(candidates(episode, ROW, decode=lambda ids: f"<{len(ids)}>"), make_rules(shortest_first=True),
                    ("math",))  # fmt: skip
    assert [(c.sample_index, c.tokens) for c in chosen.kept] == [(0, 6)]


# ---- readability filters -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "mixed"),
    [
        ("The area is πr², so x = 3 and θ = 2.", False),  # lone Greek and Latin letters are symbols
        ("答案是 x = 5, 所以 n = 5", False),  # Chinese with Latin variables
        ("これは漢字とひらがなとカタカナ", False),  # Japanese mixes its scripts
        ("First add the numbers, 然后 we get 5", True),  # English and Chinese words
        ("Сначала add the numbers", True),  # Cyrillic and Latin words
        ("Ｆｕｌｌｗｉｄｔｈ letters are Latin", False),
    ],
)
def test_mixed_language(text: str, mixed: bool) -> None:
    assert (len(scripts(text)) > 1) is mixed, scripts(text)
    record = group(sample(text, RIGHT))
    rejected = {"filter mixed_language": 1} if mixed else {}
    assert pick(record, make_rules(filters=["mixed_language"])) == ([] if mixed else [0], rejected)


def test_truncated_and_overlong_filters() -> None:
    record = group(
        sample("<think>cut", RIGHT, finish="length"),  # hit max_new_tokens (and passed, say, a lenient check)
        sample("<think>an episode out of room</think><answer>5</answer>", RIGHT, end="max_total_tokens"),
        sample("<think>eleven tokens</think><answer>5</answer>", RIGHT, tokens=11),
        sample("<think>ten tokens</think><answer>5</answer>", RIGHT, tokens=10),
    )
    rules = make_rules(filters=["truncated", "overlong"], max_tokens=10, keep_per_prompt=4)
    assert pick(record, rules) == ([3], {"filter truncated": 2, "filter overlong": 1})
    assert pick(record, make_rules(keep_per_prompt=4)) == ([0, 1, 2, 3], {})  # no filter, no rejection
    # Each candidate says why it stopped (the SFT row's provenance.ended): an episode's end, else the finish reason.
    assert [c.ended for c in candidates(record, ROW)] == ["length", "max_total_tokens", "stop", "stop"]
    # Filters come after the pass check: a wrong truncated answer is rejected for its answer.
    wrong = group(sample("<think>cut", {"math": 0.0, "format": 0.0}, finish="length"))
    assert pick(wrong, rules) == ([], {"failed component format": 1})


PLUGIN = """
SEEN = []

def short_only(candidate):
    SEEN.append(candidate)
    return len(candidate["response"]) < 30 or "too long for the plug-in"

def reject_all(candidate):
    return False

def undecided(candidate):
    return None

def broken(candidate):
    raise KeyError("oops")
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A plug-in module, importable by name from a folder on sys.path."""
    (tmp_path / "rs_plugin_under_test.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "rs_plugin_under_test"


def test_a_plugin_predicate_keeps_on_true_and_rejects_with_its_reason(plugin: str) -> None:
    import importlib

    record = group(
        sample("<answer>5</answer>", RIGHT, tokens=4),
        sample("<think>" + "a" * 40 + "</think><answer>5</answer>", RIGHT, tokens=9, finish="length"),
    )
    rules = make_rules(filters=[f"{plugin}:short_only"], keep_per_prompt=2)
    assert pick(record, rules) == ([0], {f"filter {plugin}:short_only: too long for the plug-in": 1})
    seen = importlib.import_module(plugin).SEEN
    assert seen[0] == {"prompt": "What is 2 + 3?", "response": "<answer>5</answer>", "row_id": "q7",
                       "task_type": "math", "components": RIGHT, "tokens": 4, "truncated": False}  # fmt: skip
    assert seen[1]["truncated"] is True and seen[1]["tokens"] == 9
    assert pick(record, make_rules(filters=[f"{plugin}:reject_all"])) == ([], {f"filter {plugin}:reject_all": 2})
    # In the listed order: the first that rejects names the reason.
    both = make_rules(filters=["truncated", f"{plugin}:reject_all"], keep_per_prompt=2)
    assert pick(record, both)[1] == {f"filter {plugin}:reject_all": 1, "filter truncated": 1}


def test_a_plugin_that_answers_neither_keep_nor_reject_is_an_error_naming_it(plugin: str) -> None:
    record = group(sample("<answer>5</answer>", RIGHT))
    with pytest.raises(PluginError, match=f"{plugin}:undecided' returned None; it must return True"):
        pick(record, make_rules(filters=[f"{plugin}:undecided"]))
    with pytest.raises(PluginError, match=f"{plugin}:broken' raised KeyError"):
        pick(record, make_rules(filters=[f"{plugin}:broken"]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"filters": ["no_such_filter"]}, "neither a built-in filter"),
        ({"filters": ["no_such_module_xyz:f"]}, "cannot import module 'no_such_module_xyz'"),
        ({"filters": ["json:no_such_function"]}, "module 'json' has no callable 'no_such_function'"),
        ({"filters": ["overlong"]}, "rs_max_tokens is 0"),
        ({"filters": ["truncated", "truncated"]}, "each filter once"),
        ({"require": []}, "rs_require is empty"),
    ],
)
def test_bad_rules_are_refused_naming_the_setting(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_rules(**kwargs)


def test_rows_with_nothing_to_pass_or_lacking_a_required_component_are_refused() -> None:
    rm_only = parse_row({"prompt": "chat", "checks": {"reward_model": {}}}, "mixed.jsonl line 4")
    problem = rows_problem(make_rules(), [ROW, rm_only])
    assert problem is not None and problem.startswith("mixed.jsonl line 4: its checks ['reward_model'] have no "
                                                      "pass/fail component")  # fmt: skip
    assert rows_problem(make_rules(require=["reward_model"], pass_score=0.5), [rm_only]) is None
    problem = rows_problem(make_rules(require=["math", "code"]), [ROW])
    assert problem is not None and "rs_require names ['code']" in problem
    assert rows_problem(make_rules(require=["overlong"]), [ROW], added={"overlong"}) is None
    assert rows_problem(make_rules(), [ROW]) is None


# ---- the SFT row and its provenance --------------------------------------------------------------------------
def test_a_kept_answer_becomes_an_sft_row_with_its_provenance() -> None:
    record = group(sample("<think>2+3</think><answer>5</answer>", {**RIGHT, "overlong": 0.0}, tokens=6), version=12)
    (c,) = select(candidates(record, ROW), make_rules(), ("math", "format")).kept
    row = sft_row(c, model="/runs/r1/stage-2-grpo/final", stage=3)
    assert row == {
        "id": "q7#0",
        "prompt": "What is 2 + 3?",
        "response": "<think>2+3</think><answer>5</answer>",
        "task_type": "math",
        "checks": {"format": {}, "math": {"gold": "5"}},
        "provenance": {"task_id": "run-e0-3", "prompt_id": "q7", "sample_index": 0,
                       "model": "/runs/r1/stage-2-grpo/final", "model_version": 12, "reward": 2.0,
                       "components": {"format": 1.0, "math": 1.0, "overlong": 0.0}, "tokens": 6, "ended": "stop",
                       "stage": 3},
    }  # fmt: skip
    # The row is valid SFT data, read back as written.
    back = parse_row(json.loads(json.dumps(row)), "data.jsonl line 1", need_response=True)
    assert back.response == row["response"] and back.provenance == row["provenance"]
    # A row without an id is named by its task id; chat prompts stay messages.
    chat = parse_row({"prompt": [{"role": "user", "content": "2+3?"}], "gold": "5"}, "x")
    (c,) = candidates(group(sample("<answer>5</answer>", {"math": 1.0}), gid="run-s3-e0-9"), chat)
    row = sft_row(c, model="m", stage=3)
    assert row["id"] == "run-s3-e0-9#0" and row["prompt"] == [{"role": "user", "content": "2+3?"}]


def test_an_episode_becomes_assistant_and_tool_segments() -> None:
    episode = sample("<code>print(2+3)</code><output>5</output><answer>5</answer>", RIGHT, tokens=6,
                     mask=[1, 1, 0, 0, 1, 1])  # fmt: skip
    (c,) = candidates(group(episode), ROW, decode=lambda ids: "".join(f"[{i}]" for i in ids))
    assert c.response == (("assistant", "[10][11]"), ("tool", "[12][13]"), ("assistant", "[14][15]"))
    assert c.tokens == 4 and c.model_text == "[10][11][14][15]"
    assert sft_row(c, model="m", stage=1)["response"] == [
        {"role": "assistant", "content": "[10][11]"}, {"role": "tool", "content": "[12][13]"},
        {"role": "assistant", "content": "[14][15]"}]  # fmt: skip
    with pytest.raises(ValueError, match="needs the tokenizer"):
        candidates(group(episode), ROW)
    # A mask of the model's tokens only is a plain completion.
    (plain,) = candidates(group(sample("<answer>5</answer>", RIGHT, tokens=3, mask=[1, 1, 1])), ROW)
    assert plain.response == "<answer>5</answer>"


# ---- the summary ------------------------------------------------------------------------------------------------
def test_the_tally_counts_every_sample_once_and_the_summary_names_the_prompts_with_none(tmp_path: Path) -> None:
    tally = Tally()
    rules = make_rules(keep_per_prompt=1)
    record = group(sample("<think>a</think><answer>5</answer>", RIGHT), sample("<answer>5</answer>", RIGHT),
                   sample("6", {"math": 0.0, "format": 0.0}), sample("<think>a</think><answer>5</answer>", RIGHT))  # fmt: skip
    chosen = select(candidates(record, ROW), rules, ("math", "format"))
    tally.add("q7", 4, len(chosen.kept), chosen.rejected)
    wrong = group(*(sample("6", {"math": 0.0, "format": 1.0}) for _ in range(4)), gid="run-e0-4")
    chosen = select(candidates(wrong, ROW), rules, ("math", "format"))
    tally.add("q8", 4, 0, chosen.rejected)
    tally.add_dropped("q9", 4, "failed")
    tally.add_dropped("q10", 4, "unscored")
    with pytest.raises(ValueError, match="sampled"):
        tally.add("q11", 4, 1, {"duplicate": 1})  # 4 samples, 2 accounted for
    summary = tally.summary(12.34, model="m")
    assert summary == {
        "prompts": 4, "sampled": 16, "kept": 1, "kept_per_prompt": {"0": 3, "1": 1}, "prompts_with_none": 3,
        "prompts_with_none_ids": ["q8", "q9", "q10"],
        "rejected": {"failed component math": 5, "group failed": 4, "group unscored": 4, "duplicate": 1,
                     "over quota": 1},
        "wall_seconds": 12.3, "model": "m",
    }  # fmt: skip
    assert summary["sampled"] == summary["kept"] + sum(summary["rejected"].values())
    assert Tally.from_state(json.loads(json.dumps(tally.to_state()))) == tally  # checkpointed as JSON
    for i in range(MAX_NONE_IDS + 10):
        tally.add_dropped(f"x{i}", 4, "timeout")
    assert tally.none_kept == 3 + MAX_NONE_IDS + 10 and len(tally.none_ids) == MAX_NONE_IDS
    # The stage's outcome (stage.json) reads the summary.
    (tmp_path / "rs_summary.json").write_text(json.dumps(summary))
    outcome = rs_outcome(tmp_path, 3.0)
    assert outcome["outcome"] == "kept 1 of 16 samples (3 of 4 prompts with none)"
    assert (outcome["kept"], outcome["sampled"], outcome["prompts"], outcome["prompts_with_none"]) == (1, 16, 4, 3)
    assert outcome["seconds"] == 12.3 and outcome["data"] == str(tmp_path / "data.jsonl")


def test_candidates_keep_the_groups_facts() -> None:
    record = group(sample("<answer>5</answer>", {"math": 1.0, "format": None}, tokens=3, finish="length"), version=9)
    (c,) = candidates(record, ROW)
    assert c == Candidate(task_id="run-e0-3", prompt_id="q7", sample_index=0, prompt="What is 2 + 3?",
                          response="<answer>5</answer>", text="<answer>5</answer>", task_type="math",
                          checks=ROW.checks, reward=None, components={"format": None, "math": 1.0}, tokens=3,
                          truncated=True, weight_version=9, ended="length")  # fmt: skip
