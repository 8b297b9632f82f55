"""Mixed data (issue 38): weighted train_data lists and task_weights draw shares of each epoch, exactly and
resumably; an unweighted run's order is what it always was; default_checks and provenance rows."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from grpo.trainer.config import TrainerSettings
from grpo.trainer.data import DataError, PromptRow, load_sources, parse_row
from grpo.trainer.order import DataCursor, Mixture, mixture_of, shares, take
from grpo.trainer.publisher import row_of, task_id
from grpo.trainer.sources import Source, data_sources


def write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows_of(n: int, task_type: str = "math", source: int = 0, prefix: str = "") -> list[PromptRow]:
    return [
        PromptRow(f"{prefix}{i}", f"{prefix}{i}+1=", task_type, {"math": {"gold": str(i + 1)}}, source=source)
        for i in range(n)
    ]


def two_sources(a: int, b: int, weights: tuple[float, float]) -> tuple[list[PromptRow], Mixture]:
    rows = rows_of(a, source=0, prefix="a") + rows_of(b, source=1, prefix="b")
    mixture = mixture_of(rows, [Source(Path("a.jsonl"), weights[0]), Source(Path("b.jsonl"), weights[1])], {})
    assert mixture is not None
    return rows, mixture


def test_shares_round_by_largest_remainder() -> None:
    assert shares(10, [1, 1, 1]) == [4, 3, 3]  # a tie goes to the earlier group
    assert shares(40, [3, 1]) == [30, 10]
    assert shares(25, [1, 3]) == [6, 19]  # 6.25 / 18.75
    assert shares(7, [0.1, 0.2, 0.7]) == [1, 1, 5]  # 0.7 / 1.4 / 4.9: the largest remainders win
    for n in range(1, 30):
        assert sum(shares(n, [0.3, 2, 5.5])) == n


def test_weights_3_to_1_give_75_and_25_percent_and_each_row_once_per_pass() -> None:
    rows, mixture = two_sources(10, 30, (3, 1))  # 40 draws an epoch: a 30 (3 passes of 10), b 10 (a third of 30)
    picks, cursor = take(DataCursor(seed=5), len(rows), 4 * 40, mixture)
    assert cursor == DataCursor(epoch=3, index=40, seed=5)  # the next take wraps into epoch 4
    drawn = [rows[i].source for _, i in picks]
    assert Counter(drawn) == {0: 120, 1: 40}  # 75 % / 25 % of the draws, against 25 % / 75 % of the rows
    for epoch in range(4):
        in_epoch = [i for key, i in picks if key.startswith(f"e{epoch}-")]
        per_a = Counter(i for i in in_epoch if rows[i].source == 0)
        assert sorted(per_a.values()) == [3] * 10, "each of a's rows once per pass: 3 passes an epoch"
    b_draws = [i for _, i in picks if rows[i].source == 1]  # in epoch order: epochs 0-2 are b's first pass
    first_pass = [i for key, i in picks if rows[i].source == 1 and int(key.split("-")[0][1:]) < 3]
    assert sorted(first_pass) == list(range(10, 40)), "b's first pass: each of its 30 rows once"
    assert len(set(b_draws[30:])) == 10, "b's second pass starts with rows not yet repeated"


def test_the_order_is_deterministic_and_row_of_is_exact_after_a_resume_across_epochs() -> None:
    rows, mixture = two_sources(7, 5, (1, 2.5))
    whole, _ = take(DataCursor(seed=11), len(rows), 50, mixture)
    # The same run in steps of 3, each step a fresh process: the cursor from its saved state, the mixture rebuilt.
    resumed: list[tuple[str, int]] = []
    state = DataCursor(seed=11).to_state()
    while len(resumed) < 50:
        again_rows, again = two_sources(7, 5, (1, 2.5))
        picks, cursor = take(DataCursor.from_state(json.loads(json.dumps(state))), len(again_rows), 3, again)
        resumed += picks
        state = cursor.to_state()
    assert resumed[:50] == whole and len({key for key, _ in whole}) == 50
    fresh = two_sources(7, 5, (1, 2.5))[1]  # what a restarted trainer rebuilds to read its groups' task ids
    for key, i in whole:
        assert row_of(task_id("run", key, stage=4), len(rows), 11, fresh) == i
        assert row_of(task_id("run", key), len(rows), 11, mixture) == i
    assert [i for _, i in take(DataCursor(seed=12), len(rows), 50, mixture)[0]] != [i for _, i in whole]


def test_task_weights_split_the_draws_by_task_type() -> None:
    rows = rows_of(20, "math") + rows_of(5, "chat", prefix="c") + rows_of(5, "code", prefix="k")
    mixture = mixture_of(rows, [Source(Path("t.jsonl"))], {"chat": 3, "math": 1})  # code: unweighted, 1
    assert mixture is not None and mixture.names == ("chat", "code", "math")
    assert mixture.counts() == shares(30, [3, 1, 1]) == [18, 6, 6]
    picks, _ = take(DataCursor(seed=0), len(rows), 30 * 3, mixture)
    assert Counter(rows[i].task_type for _, i in picks) == {"chat": 54, "code": 18, "math": 18}
    with pytest.raises(DataError, match=r"task_weights names \['poetry'\].*task types: \['chat', 'code', 'math'\]"):
        mixture_of(rows, [Source(Path("t.jsonl"))], {"poetry": 2})


def test_without_weights_the_order_is_todays() -> None:
    # take's output before issue 38 (seed 7, 5 rows, 12 draws): a run resumed across the upgrade stays exact.
    assert take(DataCursor(seed=7), 5, 12)[0] == [
        ("e0-0", 4), ("e0-1", 2), ("e0-2", 1), ("e0-3", 3), ("e0-4", 0), ("e1-0", 2), ("e1-1", 1), ("e1-2", 3),
        ("e1-3", 4), ("e1-4", 0), ("e2-0", 0), ("e2-1", 3),
    ]  # fmt: skip
    rows = rows_of(3, source=0) + rows_of(2, source=1, prefix="b")
    assert mixture_of(rows, [Source(Path("a.jsonl")), Source(Path("b.jsonl"))], {}) is None  # joined, as one file


def test_a_source_too_light_to_be_drawn_or_left_empty_is_refused() -> None:
    rows = rows_of(10, source=0) + rows_of(2, source=1, prefix="b")
    with pytest.raises(DataError, match=r"train_data file b\.jsonl weighs 0\.01 of 1\.01: an epoch's 12 draws give it"):
        mixture_of(rows, [Source(Path("a.jsonl"), 1.0), Source(Path("b.jsonl"), 0.01)], {})
    with pytest.raises(DataError, match=r"train_data b.jsonl: none of its rows is left"):
        mixture_of(rows_of(4), [Source(Path("a.jsonl"), 1.0), Source(Path("b.jsonl"), 2.0)], {})


def test_sources_load_in_order_and_keep_their_file_and_line(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", [{"prompt": "1+1=", "gold": "2"}, {"prompt": "2+2=", "gold": "4"}])
    b = write(tmp_path / "b.jsonl", [{"prompt": "hi", "task_type": "chat", "checks": {"format": {}}}])
    s = TrainerSettings(train_data=[str(a), {"data": str(b), "weight": 3}])  # type: ignore[arg-type]
    assert data_sources(s) == [Source(a, 1.0), Source(b, 3.0)]  # a bare item of a weighted list weighs 1
    rows = load_sources([source.path for source in data_sources(s)])
    assert [(r.where, r.source) for r in rows] == [(f"{a} line 1", 0), (f"{a} line 2", 0), (f"{b} line 1", 1)]
    assert data_sources(TrainerSettings(train_data=[str(a), str(b)])) == [Source(a), Source(b)]  # type: ignore[arg-type]
    assert data_sources(TrainerSettings(train_data=a)) == [Source(a)]


def test_default_checks_score_rows_without_their_own(tmp_path: Path) -> None:
    rm = {"reward_model": {}}
    bare = {"prompt": "Write a haiku.", "task_type": "chat"}
    assert parse_row(bare, "x line 1", default_checks=rm).checks == rm
    assert parse_row({**bare, "checks": {}}, "x line 1", default_checks=rm).checks == rm
    assert parse_row({"prompt": "1+1=", "gold": "2"}, "x line 2", default_checks=rm).checks == {"math": {"gold": "2"}}
    with pytest.raises(DataError, match=r"x line 1: no 'checks' \(or 'gold'\).*set default_checks"):
        parse_row(bare, "x line 1")
    data = write(tmp_path / "t.jsonl", [bare])
    assert TrainerSettings(train_data=data, default_checks=rm).default_checks == rm
    with pytest.raises(ValueError, match=r"default_checks: checks\.math\.gold is missing"):
        TrainerSettings(train_data=data, default_checks={"math": {}})
    with pytest.raises(ValueError, match=r'default_checks: .*no field named "judge"'):
        TrainerSettings(train_data=data, default_checks={"judge": {}})


def test_provenance_is_a_known_key_kept_with_the_row() -> None:
    origin = {"task_id": "run-s3-e0-4", "sample_index": 2, "model_version": 7, "components": {"math": 1.0}}
    row = parse_row({"prompt": "1+1=", "response": "2", "gold": "2", "provenance": origin}, "d line 1",
                    need_response=True)  # fmt: skip
    assert row.provenance == origin and row.response == "2"
    with pytest.raises(DataError, match="'provenance' must be a mapping"):
        parse_row({"prompt": "1+1=", "gold": "2", "provenance": "stage 3"}, "d line 1")


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"train_data": []}, "train_data is an empty list"),
        ({"train_data": [{"data": "a.jsonl", "weight": 0}]}, "weight 0 must be a number > 0"),
        ({"train_data": [{"data": "a.jsonl", "weight": True}]}, "weight True must be a number > 0"),
        ({"train_data": [{"path": "a.jsonl"}]}, "unknown keys ['path']"),
        ({"task_weights": {"math": 0}}, "task_weights {'math': 0.0}"),
        ({"train_data": [{"data": "a", "weight": 2}], "task_weights": {"math": 1}}, "set one"),
    ],
)
def test_bad_mixing_settings_are_refused_naming_them(values: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError) as err:
        TrainerSettings(**{"train_data": Path("t.jsonl"), **values})  # type: ignore[arg-type]
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ({"normalize": "softmax"}, r"checks.reward_model.normalize must be none or sigmoid, got 'softmax'"),
        ({"normalize": "sigmoid", "scale": 0}, r"checks.reward_model.scale must be a finite number > 0, got 0"),
        ({"shift": "1"}, r"checks.reward_model.shift must be a finite number, got '1'"),
    ],
)
def test_a_reward_model_check_the_service_would_refuse_is_refused_at_load(check: dict, message: str) -> None:
    """Such a row would fail every group it is sampled in, ending the run after max_failed_steps."""
    with pytest.raises(DataError, match=r"rows.jsonl line 1: " + message):
        parse_row({"prompt": "hi", "checks": {"reward_model": check}}, "rows.jsonl line 1")
    parse_row({"prompt": "hi", "checks": {"reward_model": {"normalize": "sigmoid", "shift": -1, "scale": 2.5}}}, "x")
