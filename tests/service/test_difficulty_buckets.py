"""Difficulty buckets through the real services: a private Redis, the reward service, an hf rollout replica and the
trainer as a process, training the answer model (tests/support/answer_model.py: it answers easy sums, right three
times in four).

Half the rows ask for the sum the model gives (solved by some or every sample of a group), half for a sum it never
gives (gold + 50: solved by none). With set_aside_after = skip_solved_after = 1, each unsolved row is set aside after
its one group of epoch 0 and passed over in epoch 1, and so is each row every sample solved; the rest are drawn;
epoch 2 draws them all again. The ledger, the metrics and the checkpoint's buckets must tell the same story.

skip_flat_above = 0.5 with G = 4 sets aside the same rows by prediction: a last group of 0 or 4 of 4 makes the next
one flat 56 % likely, 1 or 3 of 4 only 32 %, so it must pass over exactly what the two streak rules at 1 do (the
rows stay `medium`: no streak rule is on).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grpo.common.tiny_model import cache_root
from grpo.trainer.checkpoint import latest_checkpoint
from grpo.trainer.ledger import read_ledger
from grpo.trainer.publisher import position_of, row_of
from tests.support.answer_model import PROBLEMS, answer_model_path, prompt
from tests.support.trainer_proc import read_metrics, run_trainer, trainer_config, write_rows

pytestmark = pytest.mark.slow
RUN = "buckets"
SOLVABLE = 4  # rows 0-3: gold a + b; rows 4-7: the same prompts, gold a + b + 50


def rows() -> list[dict[str, Any]]:
    problems = PROBLEMS[:SOLVABLE]
    right = [{"id": f"p{a}{b}", "prompt": prompt(a, b), "gold": str(a + b)} for a, b in problems]
    never = [{"id": f"n{a}{b}", "prompt": prompt(a, b), "gold": str(a + b + 50)} for a, b in problems]
    return right + never


RULES = {
    "streaks": {"skip_solved_after": 1, "set_aside_after": 1},
    "predicted_flat": {"skip_flat_above": 0.5},
}


@pytest.mark.parametrize("rules", list(RULES))
def test_rows_solved_every_time_or_never_are_passed_over_for_an_epoch(
    tmp_path: Path, redis_url: str, rollout_for: Callable[..., Any], rules: str
) -> None:
    model = answer_model_path(cache_root() / "test-models")
    rollout_for(RUN)
    train = rows()
    config = trainer_config(
        tmp_path, RUN, redis_url, model=str(model), train_data=str(write_rows(tmp_path / "buckets.jsonl", train)),
        steps=5, prompts_per_step=4, group_size=4, max_new_tokens=24, stop=[], overlong_soft_penalty=False,
        reward_weights={"math": 1.0}, checkpoint_every=1, revisit_after_epochs=1, **RULES[rules],
    )  # fmt: skip
    run_trainer(config, tmp_path / "trainer.log", timeout=240)
    out = tmp_path / "out"
    metrics = read_metrics(out)
    ledger = read_ledger(out / "ledger")
    drawn = [(position_of(str(e["task_id"]))[0], row_of(str(e["task_id"]), len(train), 0), e["outcome"])
             for e in ledger]  # fmt: skip
    by_epoch = {e: sorted(r for ee, r, _ in drawn if ee == e) for e in {e for e, _, _ in drawn}}
    assert by_epoch[0] == list(range(len(train)))  # epoch 0 draws every row once

    # the never-solved rows: one group each in epoch 0 (zero variance: no sample right), none in epoch 1
    assert all(o == "zero_variance" for e, r, o in drawn if r >= SOLVABLE and e == 0)
    assert not [r for r in by_epoch.get(1, []) if r >= SOLVABLE], by_epoch
    # the rows every sample solved in epoch 0 were passed over in epoch 1 too; the others were drawn
    state = json.loads((latest_checkpoint(out / "checkpoints") / "trainer_state.json").read_text())  # type: ignore[operator]
    records = {int(r): rec for r, rec in state["difficulty"]["records"].items()}
    assert all(records[r]["unsolved_streak"] >= 1 and records[r]["correct"] == 0 for r in range(SOLVABLE, 8))
    assert all(records[r]["last_solved"] == 0 and records[r]["last_size"] == 4 for r in range(SOLVABLE, 8))
    # a zero-variance group was solved by every sample or by none: either way its row sat out epoch 1, and only then
    flat = {r for e, r, o in drawn if e == 0 and o == "zero_variance"}
    assert set(by_epoch.get(1, [])) <= set(range(len(train))) - flat
    if 2 in by_epoch:  # epoch 1 ran to its end: every other row was drawn in it, and epoch 2 draws any row again
        assert set(by_epoch[1]) == set(range(len(train))) - flat

    # the metrics: every step counts all 8 rows; after epoch 0 (steps 1-2) the 4 unsolved rows are hard (medium by
    # prediction alone)
    for row in metrics:
        assert sum(row[f"buckets/{b}"] for b in ("easy", "medium", "hard", "unseen")) == len(train), row
    after_epoch0 = next(r for r in metrics if r["buckets/unseen"] == 0)
    assert after_epoch0["buckets/hard"] == (len(train) - SOLVABLE if rules == "streaks" else 0)
    if rules == "predicted_flat":  # the never-solved rows (0 of 4) at least, and only with the rule on
        assert after_epoch0["buckets/predicted_flat"] >= len(train) - SOLVABLE
    else:
        assert "buckets/predicted_flat" not in after_epoch0
    epoch1_passed_over = len(train) - len(by_epoch.get(1, []))
    assert sum(r["buckets/skipped"] for r in metrics) >= epoch1_passed_over >= len(train) - SOLVABLE
    # skipped draws made no task: the cursor moved past as many draws as were published and passed over
    cursor = state["data_cursor"]
    last = metrics[-1]
    assert cursor["epoch"] * len(train) + cursor["index"] == last["tasks/published"] + sum(
        r["buckets/skipped"] for r in metrics
    )
    assert last["tasks/published"] == len(ledger) + last["tasks/in_flight"] and last["tasks/balanced"] == 1.0
