"""Plug-in reward functions: loading by path, TRL's signature, None = cannot judge, failures are errors."""

from __future__ import annotations

import math

import pytest

from grpo.reward.verifiers.plugins import columns, load_function, run_plugin


def length_reward(prompts: list[str], completions: list[str], **kwargs: list[object]) -> list[float | None]:
    """Test plug-in: 1/len, None for empty completions, scaled by an optional per-item kwarg."""
    scale = kwargs.get("scale") or [None] * len(completions)
    return [None if not c else (s or 1.0) / len(c) for c, s in zip(completions, scale, strict=True)]  # type: ignore[operator]


def raises(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    raise RuntimeError("plug-in bug")


def wrong_count(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    return [1.0]


def not_numbers(prompts: list[str], completions: list[str], **kwargs: object) -> list[object]:
    return ["high", math.nan]


HERE = __name__


def test_load_function() -> None:
    assert load_function(f"{HERE}:length_reward") is length_reward
    for bad, message in [
        ("no_colon", "package.module:function"),
        ("not_a_module_xyz:fn", "cannot import"),
        (f"{HERE}:missing", "no callable"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_function(bad)


def test_columns() -> None:
    assert columns([{"a": 1}, {"b": 2}]) == {"a": [1, None], "b": [None, 2]}


def test_run_plugin_scores_and_none() -> None:
    judged = run_plugin(length_reward, ["p", "q", "r"], ["ab", "", "abcd"], [{}, {}, {"scale": 2.0}])
    assert [j.score for j in judged] == [0.5, None, 0.5]
    assert [j.status for j in judged] == ["ok", "cannot_judge", "ok"]


@pytest.mark.parametrize(("fn", "detail"), [(raises, "plug-in bug"), (wrong_count, "returned 1 scores for 2")])
def test_run_plugin_failures_are_errors(fn: object, detail: str) -> None:
    judged = run_plugin(fn, ["p", "q"], ["a", "b"], [{}, {}])  # type: ignore[arg-type]
    assert all(j.status == "error" and j.score is None and detail in j.detail for j in judged)


def test_run_plugin_rejects_non_numbers() -> None:
    judged = run_plugin(not_numbers, ["p", "q"], ["a", "b"], [{}, {}])
    assert [j.status for j in judged] == ["error", "error"]
