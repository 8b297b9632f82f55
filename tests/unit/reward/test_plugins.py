"""Plug-in reward functions: loading by path, TRL's signature, None = cannot judge, failures are errors."""

from __future__ import annotations

import argparse
import math
import sys
import time
from fractions import Fraction

import pytest
from pydantic import ValidationError

from grpo.common.plugins import import_function
from grpo.reward.schemas import ScoreRequest
from grpo.reward.verifiers.plugins import columns, run_plugin


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


def exits(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    sys.exit(3)


def parses_args(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    """A plug-in that runs its own argparse on the service's argv: argparse exits (SystemExit 2)."""
    argparse.ArgumentParser(prog="plugin").parse_args(["--no-such-flag"])
    return [1.0] * len(prompts)


def interrupts(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    raise KeyboardInterrupt


def strings(prompts: list[str], completions: list[str], **kwargs: object) -> list[object]:
    return ["0.75"] * len(prompts)


def real_numbers(prompts: list[str], completions: list[str], **kwargs: object) -> list[object]:
    """One of each real type a plug-in may return, cycling."""
    kinds: list[object] = [True, False, 3, Fraction(1, 4), 0.5]
    return [kinds[i % len(kinds)] for i in range(len(prompts))]


def huge_for_some(prompts: list[str], completions: list[str], **kwargs: object) -> list[object]:
    return [10**400 if "huge" in c else 0.5 for c in completions]


def needs_scale(prompts: list[str], completions: list[str], scale: list[float]) -> list[float]:
    """Takes one required kwarg and no others: an item without it, or with another, is a TypeError."""
    return [float(s) for s in scale]


def hangs(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    time.sleep(600)
    return [1.0] * len(prompts)


HERE = __name__


def test_import_function() -> None:
    assert import_function(f"{HERE}:length_reward", "plugins") is length_reward
    for bad, message in [
        ("no_colon", "^plugins: 'no_colon' must look like 'package.module:function'"),
        ("not_a_module_xyz:fn", "^plugins: plug-in 'not_a_module_xyz:fn': cannot import module 'not_a_module_xyz'"),
        (f"{HERE}:missing", "no callable 'missing'"),
    ]:
        with pytest.raises(ValueError, match=message):
            import_function(bad, "plugins")


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


@pytest.mark.parametrize(("fn", "detail"), [(exits, "SystemExit: 3"), (parses_args, "SystemExit: 2"),
                                            (interrupts, "KeyboardInterrupt")])  # fmt: skip
def test_a_plugin_that_exits_is_an_error_for_its_items(fn: object, detail: str) -> None:
    judged = run_plugin(fn, ["p", "q"], ["a", "b"], [{}, {}])  # type: ignore[arg-type]
    assert [(j.score, j.status) for j in judged] == [(None, "error")] * 2
    assert all(detail in j.detail for j in judged)


def test_strings_are_not_numbers_and_reals_are() -> None:
    assert [(j.status, j.detail) for j in run_plugin(strings, ["p"], ["a"], [{}])] == [
        ("error", "plug-in returned str, not a number")
    ]
    judged = run_plugin(real_numbers, ["p"] * 5, ["a"] * 5, [{}] * 5)
    assert [(j.score, j.status) for j in judged] == [(1.0, "ok"), (0.0, "ok"), (3.0, "ok"), (0.25, "ok"), (0.5, "ok")]


def test_a_number_too_large_for_a_float_fails_only_its_item() -> None:
    judged = run_plugin(huge_for_some, ["p", "q"], ["fine", "huge"], [{}, {}])
    assert (judged[0].score, judged[0].status) == (0.5, "ok")
    assert (judged[1].score, judged[1].status) == (None, "error") and "too large for a float" in judged[1].detail


def test_one_items_kwargs_fail_only_that_item() -> None:
    kwargs = [{"scale": 2}, {}, {"scale": 3, "extra": 1}, {"scale": 4}]
    judged = run_plugin(needs_scale, ["p"] * 4, ["a"] * 4, kwargs)
    assert [j.score for j in judged] == [2.0, None, None, 4.0]
    assert "missing 1 required" in judged[1].detail and "'scale'" in judged[1].detail
    assert "unexpected keyword argument 'extra'" in judged[2].detail


def test_a_type_error_of_the_plugin_itself_still_fails_each_item() -> None:
    def broken(prompts: list[str], completions: list[str]) -> list[float]:
        raise TypeError("a bug")

    judged = run_plugin(broken, ["p", "q"], ["a", "b"], [{}, {}])
    assert [(j.status, j.detail) for j in judged] == [("error", "plug-in raised TypeError: a bug")] * 2


@pytest.mark.parametrize("key", ["prompts", "completions"])
def test_reserved_kwargs_are_refused_naming_the_item(key: str) -> None:
    items = [{"id": "a", "completion": "x", "checks": {"plugins": {"p": {"kwargs": {"scale": 2}}}}},
             {"id": "b", "completion": "x", "checks": {"plugins": {"p": {"kwargs": {key: 1}}}}}]  # fmt: skip
    with pytest.raises(ValidationError) as err:
        ScoreRequest.model_validate({"items": items})
    (error,) = err.value.errors()
    assert error["loc"][:2] == ("items", 1) and "passed by the service itself" in error["msg"]
