"""VinePPO's pure parts: split points, task ids, the value books, and per-token credit from values."""

from __future__ import annotations

import pytest

from grpo.trainer.vine import ValueBooks, sample_credit, split_points, value_task_id


def test_split_points_are_inner_boundaries_spread_evenly() -> None:
    # Step ends [2, 5, 5, 8, 11] of an 11-token completion: inner boundaries 2, 5, 8 (the end is not a split).
    assert split_points([2, 5, 5, 8, 11], 11, 8) == [2, 5, 8]
    assert split_points([0, 3], 3, 4) == []  # an empty first step and the end: nothing to split at
    assert split_points(list(range(1, 11)), 11, 4) == [1, 4, 7, 10]  # ten boundaries → four, evenly spread
    assert split_points(list(range(1, 11)), 11, 1) == [6]
    assert split_points([4], 4, 3) == []  # one step (no delimiter): the whole completion is one segment


def test_value_task_ids_name_the_policy_version() -> None:
    assert value_task_id("run-e0-7", 3, 12, 41) == "run-e0-7/v3.12@41"
    assert value_task_id("run-e0-7", 3, 12, 41) != value_task_id("run-e0-7", 3, 12, 42)


def test_sample_credit_is_the_value_difference_of_each_segment() -> None:
    # Prompt value 0.5, V(after token 2) = 0.25, V(after token 4) = 1.0, reward 1.0, 6 tokens:
    # segments [0, 2) → 0.25 − 0.5, [2, 4) → 1.0 − 0.25, [4, 6) → 1.0 − 1.0.
    got = sample_credit([2, 4], {2: 0.25, 4: 1.0}, 0.5, 1.0, 6)
    assert got == pytest.approx([-0.25, -0.25, 0.75, 0.75, 0.0, 0.0])
    # The value at 2 is missing: [0, 4) merges, its credit is V(4) − V(prompt).
    assert sample_credit([2, 4], {4: 1.0}, 0.5, 1.0, 6) == pytest.approx([0.5] * 4 + [0.0] * 2)
    assert sample_credit([], {}, 0.5, 0.0, 3) == pytest.approx([-0.5] * 3)  # no split: reward − V(prompt)


def test_value_books_balance_or_fail_loudly() -> None:
    books = ValueBooks(published=5, used=3, continuation_tokens=300)
    books.dropped["timeout"] += 2
    books.check()
    metrics = books.metrics(trained_tokens=100)
    assert metrics["vine/value_dropped/timeout"] == 2.0 and metrics["vine/value_used"] == 3.0
    assert metrics["vine/rollout_tokens_per_trained_token"] == 4.0  # 100 sampled and trained + 300 for values
    assert books.metrics(trained_tokens=100)["vine/rollout_tokens_per_trained_token"] == 1.0  # per step
    books.published += 1
    with pytest.raises(AssertionError, match="do not balance"):
        books.check()
    books.check(in_flight=1)
