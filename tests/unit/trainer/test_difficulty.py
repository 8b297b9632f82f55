"""Difficulty buckets: the tracker's rules on hand-made group outcomes, the sampler passing set-aside rows over, the
state through JSON and a checkpoint, and a resumed run making the skip decisions an uninterrupted one makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.checkpoint import resume, save_checkpoint
from grpo.trainer.config import parse_settings
from grpo.trainer.difficulty import BucketRules, DifficultyTracker, bucket_metrics, flat_chance, uniform
from grpo.trainer.learner import Learner, LearnerConfig
from grpo.trainer.order import DataCursor, draw_order, take, take_eligible
from grpo.trainer.publisher import position_of, row_of

SOLVED, NONE, HALF, UNJUDGED = [1.0] * 4, [0.0] * 4, [1.0, 0.0, 1.0, 0.0], [None] * 4


def tracker(skip: int = 2, aside: int = 3, revisit: int = 1) -> DifficultyTracker:
    return DifficultyTracker(BucketRules(skip, aside, revisit))


def test_a_row_solved_by_every_sample_k_groups_in_a_row_is_easy() -> None:
    t = tracker(skip=2)
    assert t.bucket(5) == "unseen"
    assert t.observe(5, epoch=0, step=0, correctness=SOLVED) == "unseen"  # the bucket it was drawn in
    assert t.bucket(5) == "medium"
    t.observe(5, epoch=1, step=3, correctness=HALF)  # one miss: the streak starts again
    t.observe(5, epoch=2, step=6, correctness=SOLVED)
    assert t.bucket(5) == "medium"
    assert t.observe(5, epoch=3, step=9, correctness=SOLVED) == "medium"
    assert t.bucket(5) == "easy"
    rec = t.records[5]
    assert (rec.groups, rec.samples, rec.correct, rec.last_step, rec.last_epoch, rec.aside_epoch) == (
        4, 16, 14, 9, 3, 3,
    )  # fmt: skip


def test_a_row_never_solved_after_k_tries_is_hard_and_one_solved_sample_brings_it_back() -> None:
    t = tracker(aside=3)
    for epoch in range(3):
        t.observe(1, epoch, epoch, NONE)
    assert t.bucket(1) == "hard"
    t.observe(1, 5, 5, [0.0, 0.0, 1.0, 0.0])
    assert t.bucket(1) == "medium"
    # a partial code score (some tests passed) solves nothing, but is not "none solved" either
    t.observe(2, 0, 0, [0.5] * 4)
    assert t.records[2].solved_streak == 0 and t.records[2].unsolved_streak == 1


def test_rules_at_zero_are_off_and_unjudged_groups_are_never_skipped() -> None:
    off = tracker(skip=0, aside=0)
    for epoch in range(5):
        off.observe(1, epoch, epoch, SOLVED)
        off.observe(2, epoch, epoch, NONE)
    assert off.bucket(1) == off.bucket(2) == "medium" and not off.rules.active
    t = tracker(skip=1, aside=1)
    for epoch in range(5):  # a reward-model row: its samples are counted, no streak moves
        t.observe(3, epoch, epoch, UNJUDGED)
        t.observe(4, epoch, epoch, [1.0, None, 1.0, 1.0])
    assert t.bucket(3) == t.bucket(4) == "unseen"
    assert t.records[3].samples == 20 and not t.skips(3, 9) and not t.skips(4, 9)


def test_a_set_aside_row_is_skipped_for_revisit_epochs_then_decided_again() -> None:
    t = tracker(skip=1, aside=1, revisit=2)
    t.observe(7, epoch=4, step=10, correctness=SOLVED)  # easy, set aside in epoch 4
    assert [t.skips(7, e) for e in range(4, 9)] == [True, True, True, False, False]
    t.observe(7, epoch=7, step=20, correctness=SOLVED)  # drawn again in epoch 7: still easy, aside again
    assert t.skips(7, 9) and not t.skips(7, 10)
    t.observe(7, epoch=10, step=30, correctness=HALF)  # no longer easy: drawn every epoch
    assert t.bucket(7) == "medium" and not t.skips(7, 11)


def test_the_flat_chance_is_the_beta_posteriors_and_matches_a_simulation() -> None:
    # by hand: last group 8/8 -> p ~ Beta(9, 1), E[p^8] = 9/17; E[(1-p)^8] = 8! 9! / 17!
    assert flat_chance(8, 8) == pytest.approx(9 / 17 + 40320 * 362880 / 355687428096000)
    assert flat_chance(0, 8) == pytest.approx(flat_chance(8, 8))  # symmetric
    assert flat_chance(4, 8) < flat_chance(3, 8) < flat_chance(2, 8) < flat_chance(1, 8) < flat_chance(0, 8)
    # and by sampling: draw p from the posterior, then a group of 8; the share of flat groups
    gen = torch.Generator().manual_seed(0)
    p = torch.distributions.Beta(torch.tensor(8.0), torch.tensor(2.0)).sample((200_000,))  # last group 7/8
    solved = torch.bernoulli(p.unsqueeze(1).expand(-1, 8), generator=gen).sum(1)
    flat = ((solved == 0) | (solved == 8)).float().mean().item()
    assert flat == pytest.approx(flat_chance(7, 8), abs=0.005)


def test_a_row_likely_to_come_back_flat_is_set_aside_for_revisit_epochs() -> None:
    t = DifficultyTracker(BucketRules(skip_flat_above=0.25, revisit_after_epochs=1))
    assert t.rules.active
    seven, two = [1.0] * 7 + [0.0], [1.0] * 2 + [0.0] * 6
    t.observe(1, epoch=3, step=5, correctness=seven)  # flat next time 26.5 % likely: aside in epoch 4
    t.observe(2, epoch=3, step=5, correctness=two)  # 12.5 %: drawn
    t.observe(3, epoch=3, step=5, correctness=[0.0] * 8)  # 53 %: aside, though not `hard` (no such rule)
    assert [t.skips(1, e) for e in (4, 5)] == [True, False] and not t.skips(2, 4) and t.skips(3, 4)
    assert t.bucket(1) == t.bucket(3) == "medium"
    t.observe(1, epoch=5, step=9, correctness=[1.0] * 4 + [0.0] * 4)  # drawn again: decided anew
    assert not t.skips(1, 6)
    t.observe(4, epoch=3, step=5, correctness=[None] * 8)  # nothing judges it: never set aside
    assert not t.skips(4, 4)
    assert bucket_metrics(t, 5, 2, [])["buckets/predicted_flat"] == 1  # row 3 (row 1 came back 4 of 8)
    # the prediction's data goes through a checkpoint's JSON
    restored = DifficultyTracker.from_state(t.rules, json.loads(json.dumps(t.to_state())))
    assert [restored.skips(r, 4) for r in (1, 2, 3, 4)] == [t.skips(r, 4) for r in (1, 2, 3, 4)]


def test_the_sampler_passes_over_skipped_rows_and_the_keys_still_find_their_rows() -> None:
    n, seed = 10, 3
    skipped_rows = {2, 5, 7}
    taken = take_eligible(DataCursor(seed=seed), n, 12, skip=lambda row, epoch, index: row in skipped_rows)
    eligible = [(f"e{e}-{i}", r) for e in (0, 1) for i, r in enumerate(draw_order(n, seed, e)) if r not in skipped_rows]
    assert taken.picks == eligible[:12]  # the same positions as without skipping, the skipped ones left out
    for key, row in taken.picks:  # a task id still leads back to its row (the run's row_of)
        assert row_of(f"run-{key}", n, seed) == row
    # the cursor moved past every draw it looked at: the picks and the draws passed over
    assert taken.cursor.epoch * n + taken.cursor.index == len(taken.picks) + taken.skipped
    assert taken.skipped >= 3 and not taken.exhausted
    # without a skip it is plain `take`
    assert take_eligible(DataCursor(seed=seed), n, 12).picks == take(DataCursor(seed=seed), n, 12)[0]


def test_when_every_row_is_set_aside_they_are_drawn_anyway() -> None:
    n = 4
    taken = take_eligible(DataCursor(), n, 3, skip=lambda row, epoch, index: True)
    assert taken.exhausted and len(taken.picks) == 3
    assert taken.skipped == n - 1  # one epoch's worth of draws came up skipped, then the guard took them


def test_bucket_weights_take_that_share_of_a_buckets_draws_the_same_after_a_resume() -> None:
    rules = BucketRules(skip_solved_after=1, revisit_after_epochs=1, weights=(("easy", 0.25), ("medium", 1.0)))
    t = DifficultyTracker(rules, seed=5)
    t.observe(0, epoch=0, step=0, correctness=SOLVED)  # easy: set aside in epoch 1, weighed from epoch 2 on
    t.observe(1, epoch=0, step=0, correctness=HALF)  # medium: weight 1, always taken
    assert t.skips(0, 1, 3)
    later = [(e, i) for e in range(2, 60) for i in range(10)]
    taken = [not t.skips(0, e, i) for e, i in later]
    assert 0.2 < sum(taken) / len(taken) < 0.3  # a quarter of the easy row's draws
    assert taken == [uniform(5, e, i) < 0.25 for e, i in later]  # a coin of the position alone
    restored = DifficultyTracker.from_state(rules, json.loads(json.dumps(t.to_state())), seed=5)
    assert [not restored.skips(0, e, i) for e, i in later] == taken
    assert not any(t.skips(1, e, i) for e, i in later)
    assert not any(t.skips(7, e, i) for e, i in later)  # unseen: unnamed, weight 1


def test_bucket_metrics_count_every_row_once() -> None:
    t = tracker(skip=1, aside=1)
    t.observe(0, 0, 0, SOLVED)
    t.observe(1, 0, 0, NONE)
    t.observe(2, 0, 0, HALF)
    m = bucket_metrics(t, 6, skipped=3, groups=[("medium", 1.0, 1.0), ("medium", 0.0, 0.5), ("unseen", 0.5, None)])
    assert {k: m[k] for k in ("buckets/easy", "buckets/hard", "buckets/medium", "buckets/unseen")} == {
        "buckets/easy": 1.0, "buckets/hard": 1.0, "buckets/medium": 1.0, "buckets/unseen": 3.0,
    }  # fmt: skip
    assert m["buckets/skipped"] == 3.0
    assert m["buckets/medium/reward_mean"] == 0.5 and m["buckets/medium/accuracy"] == 0.75
    assert m["buckets/unseen/reward_mean"] == 0.5 and "buckets/unseen/accuracy" not in m
    assert "buckets/easy/reward_mean" not in m


def outcome(row: int, seen: int) -> list[float | None]:
    """A hand-made policy: rows 0-3 always solved, 4-6 never, 7-8 solved from their third group on, 9 unjudged,
    10-11 half solved."""
    if row == 9:
        return [None] * 4
    if row < 4 or (row in (7, 8) and seen >= 2):
        return [1.0] * 4
    return [0.0] * 4 if row < 7 else [1.0, 0.0, 0.0, 1.0]


Run = tuple[DataCursor, DifficultyTracker, dict[int, int]]  # the cursor, the buckets, groups seen per row


def simulate(run: Run, steps: range, n: int = 12, k: int = 3) -> tuple[list[tuple[str, int]], Run]:
    """Steps of a run: draw k rows past the skipped ones, then judge each group (in draw order)."""
    cursor, t, seen = run
    picks: list[tuple[str, int]] = []
    for step in steps:
        taken = take_eligible(cursor, n, k, skip=t.skips)
        for key, row in taken.picks:
            t.observe(row, position_of(f"r-{key}")[0], step, outcome(row, seen.get(row, 0)))
            seen[row] = seen.get(row, 0) + 1
        picks += taken.picks
        cursor = taken.cursor
    return picks, (cursor, t, seen)


def test_a_resumed_run_makes_the_same_skip_decisions_as_an_uninterrupted_one() -> None:
    rules = BucketRules(skip_solved_after=2, set_aside_after=2, revisit_after_epochs=1)
    whole, _ = simulate((DataCursor(seed=1), DifficultyTracker(rules), {}), range(30))
    first, (cursor, t, seen) = simulate((DataCursor(seed=1), DifficultyTracker(rules), {}), range(13))
    saved = json.loads(json.dumps({"cursor": cursor.to_state(), "difficulty": t.to_state()}))  # the checkpoint
    restored = DifficultyTracker.from_state(rules, saved["difficulty"])
    assert restored.records == t.records
    rest, _ = simulate((DataCursor.from_state(saved["cursor"]), restored, seen), range(13, 30))
    assert first + rest == whole
    # and the decisions are not trivial: set-aside rows were passed over, the unjudged and the learnt ones were not
    rows_taken = [row for _, row in whole]
    counts = [rows_taken.count(r) for r in range(12)]
    # unjudged, and half solved: drawn every epoch; solved every time, never solved, or learnt: passed over some
    assert max(counts[:9]) + 2 <= min(counts[9:]), counts


def test_the_state_goes_through_a_checkpoint(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    learner = Learner(LearnerConfig(model=str(ensure_tiny_model()), lr=1e-3, total_steps=2, beta=0.0))
    t = tracker()
    t.observe(3, 1, 2, SOLVED)
    save_checkpoint(tmp_path, learner, step=1, data_cursor=DataCursor(seed=2).to_state(), difficulty=t.to_state())
    info = resume(tmp_path, learner, "auto")
    assert info is not None and info.difficulty == t.to_state()
    assert DifficultyTracker.from_state(t.rules, info.difficulty).records == t.records
    save_checkpoint(tmp_path, learner, step=2)  # a run without buckets keeps none
    info = resume(tmp_path, learner, "auto")
    assert info is not None and info.difficulty is None


def test_the_settings_are_checked(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "gold": "2"}\n')
    base = ["--train-data", str(data)]
    s = parse_settings([*base, "--skip-solved-after", "2", "--set-aside-after", "4"])
    assert (s.skip_solved_after, s.set_aside_after, s.revisit_after_epochs) == (2, 4, 1)
    with pytest.raises(ValidationError, match="skip_solved_after"):
        parse_settings([*base, "--skip-solved-after", "-1"])
    with pytest.raises(ValidationError, match="revisit_after_epochs"):
        parse_settings([*base, "--revisit-after-epochs", "0"])
    with pytest.raises(ValidationError, match="mode sft samples no groups"):
        parse_settings([*base, "--mode", "sft", "--set-aside-after", "2"])
    s = parse_settings([*base, "--skip-solved-after", "2", "--bucket-weights", '{"easy": 0.5, "unseen": 1}'])
    assert s.bucket_weights == {"easy": 0.5, "unseen": 1.0}
    with pytest.raises(ValidationError, match="skip_solved_after is 0, so no row is ever easy"):
        parse_settings([*base, "--bucket-weights", '{"easy": 0.5}'])
    with pytest.raises(ValidationError, match=r"in \[0, 1\]"):
        parse_settings([*base, "--set-aside-after", "2", "--bucket-weights", '{"hard": 2}'])
    with pytest.raises(ValidationError, match="every row starts unseen"):
        parse_settings([*base, "--bucket-weights", '{"unseen": 0}'])
    with pytest.raises(ValidationError, match="bucket_weights"):
        parse_settings([*base, "--bucket-weights", '{"tricky": 0.5}'])
    assert parse_settings([*base, "--skip-flat-above", "0.25"]).skip_flat_above == 0.25
    with pytest.raises(ValidationError, match="skip_flat_above"):
        parse_settings([*base, "--skip-flat-above", "1.5"])
    with pytest.raises(ValidationError, match="mode sft samples no groups"):
        parse_settings([*base, "--mode", "sft", "--skip-flat-above", "0.25"])
