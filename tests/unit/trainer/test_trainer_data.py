"""Dataset rows (JSONL, and Parquet through pyarrow), errors that name file and row, the cursor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo.trainer.data import DataError, load_rows, parse_row
from grpo.trainer.order import DataCursor, epoch_order, take

ROWS = [
    {"id": "a", "prompt": "What is 2+3?", "task_type": "math", "checks": {"math": {"gold": "5"}, "format": {}}},
    {"prompt": [{"role": "user", "content": "Add 1 and 1"}], "gold": "2"},
    {
        "prompt": "Print hi",
        "task_type": "code",
        "checks": {"code": {"tests": [{"stdio": {"stdin": "", "expected_stdout": "hi\n"}}]}},
    },
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_rows(tmp_path: Path) -> None:
    rows = load_rows(write_jsonl(tmp_path / "d.jsonl", ROWS))
    assert [r.task_type for r in rows] == ["math", "math", "code"]
    assert rows[0].row_id == "a" and rows[0].checks == {"math": {"gold": "5"}, "format": {}}
    assert rows[1].prompt == (("user", "Add 1 and 1"),) and rows[1].checks == {"math": {"gold": "2"}}
    assert rows[2].checks_proto().code.tests[0].stdio.expected_stdout == "hi\n"
    assert rows[1].prompt_proto(True).messages.messages[0].content == "Add 1 and 1"


def test_a_json_array_file_reads_like_jsonl(tmp_path: Path) -> None:
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    assert load_rows(tmp_path / "d.json") == load_rows(write_jsonl(tmp_path / "d.jsonl", ROWS))


def test_parquet_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    row = {"prompt": "1+1?", "task_type": "math", "checks": {"math": {"gold": "2"}}}
    pq.write_table(pa.Table.from_pylist([row] * 3), path)
    rows = load_rows(path)
    assert len(rows) == 3 and rows[0].checks == {"math": {"gold": "2"}}  # arrow's nulls stripped


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "", "gold": "1"}, "'prompt' is empty"),
        ({"prompt": "x"}, "no 'checks'"),
        ({"prompt": "x", "checks": {"math": {"gld": "1"}}}, "bad 'checks'"),
        ({"prompt": [{"role": "user"}], "gold": "1"}, "prompt message 0"),
        ({"prompt": "x", "gold": "1", "colour": "red"}, "unknown field"),
    ],
)
def test_bad_row_is_named(tmp_path: Path, row: dict, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], row])
    with pytest.raises(DataError, match=message) as exc:
        load_rows(path)
    assert f"{path} line 2" in str(exc.value)


def test_invalid_json_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"broken.jsonl line 2: not valid JSON"):
        load_rows(path)


def test_missing_file_and_wrong_type(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_rows(tmp_path / "nope.jsonl")
    other = tmp_path / "d.csv"
    other.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type"):
        load_rows(other)


def test_sft_rows_need_a_response() -> None:
    with pytest.raises(DataError, match="response"):
        parse_row({"prompt": "x"}, "f row 1", need_response=True)
    assert parse_row({"prompt": "x", "response": "y"}, "f row 1", need_response=True).response == "y"


def test_cursor_is_deterministic_and_wraps() -> None:
    first, cur = take(DataCursor(seed=3), 5, 7)
    again, _ = take(DataCursor(seed=3), 5, 7)
    assert first == again
    assert [k for k, _ in first] == ["e0-0", "e0-1", "e0-2", "e0-3", "e0-4", "e1-0", "e1-1"]
    assert sorted(i for _, i in first[:5]) == list(range(5))  # one epoch is a permutation
    assert cur == DataCursor(epoch=1, index=2, seed=3)
    assert [i for _, i in first[:5]] == epoch_order(5, 3, 0)


def test_cursor_resume_continues_exactly() -> None:
    whole, _ = take(DataCursor(seed=1), 4, 10)
    part1, cur = take(DataCursor(seed=1), 4, 6)
    part2, _ = take(DataCursor.from_state(cur.to_state()), 4, 4)
    assert part1 + part2 == whole


@pytest.mark.parametrize(
    ("checks", "message"),
    [
        ({"math": {}}, "checks.math.gold is missing"),  # proto3 would send "": unparseable_gold on every epoch
        ({"math": {"gold": ""}}, r"checks.math.gold must be a non-empty string"),
        ({"math": {"gold": "  "}}, r"checks.math.gold must be a non-empty string"),
        ({"code": {"tests": []}}, r"checks.code.tests must be a non-empty list"),
        ({"code": {"language": "python"}}, "checks.code.tests is missing"),
        ({"overlong": {"max_tokens": 0, "buffer_tokens": 0}}, r"checks.overlong.max_tokens must be a positive"),
        ({"overlong": {"max_tokens": 64}}, "checks.overlong.buffer_tokens is missing"),
        ({"math": {"gold": "1"}, "steps": {"rule": "column_addition"}}, "checks.steps.source is missing"),
        ({"math": {"gold": "1"}, "steps": {"source": "rules"}}, r"checks.steps.source must be rule, prm or cut"),
    ],
)
def test_a_check_without_what_the_reward_service_needs_is_refused(tmp_path: Path, checks: dict, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], {"prompt": "2+2=", "checks": checks}])
    with pytest.raises(DataError, match=message) as exc:
        load_rows(path)
    assert str(exc.value).startswith(f"{path} line 2: ")


def test_gold_must_be_text_or_a_number(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gold.jsonl", [{"prompt": "2+2=", "gold": {"x": 1}}])
    with pytest.raises(DataError, match=r"gold.jsonl line 1: 'gold' must be a string \(or a number\)"):
        load_rows(path)  # was stringified to "{'x': 1}" and never matched
    for gold in (True, [], [4]):
        with pytest.raises(DataError):
            parse_row({"prompt": "2+2=", "checks": {"format": {}}, "gold": gold}, "f line 1")
    assert parse_row({"prompt": "2+2=", "gold": 4}, "f line 1").checks == {"math": {"gold": "4"}}
    overlong = {"overlong": {"max_tokens": 64, "buffer_tokens": 0}}  # a zero buffer is valid
    assert parse_row({"prompt": "x", "checks": overlong}, "f line 1").checks == overlong


def test_a_file_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "a", "gold": "1"}\n\n{"prompt": "caf\xe9", "gold": "1"}\n')
    with pytest.raises(DataError, match=r"latin1.jsonl line 3: not UTF-8 text"):
        load_rows(path)


def test_rows_are_named_by_their_line_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "blank.jsonl"
    good = json.dumps(ROWS[0])
    path.write_text(f"{good}\n\n{good}\n" + json.dumps({"prompt": "", "gold": "1"}) + "\n")
    with pytest.raises(DataError, match=r"blank.jsonl line 4: 'prompt' is empty"):
        load_rows(path)
    path.write_text(f"\n{good}\n\n{good}\n")
    assert [row.where for row in load_rows(path)] == [f"{path} line 2", f"{path} line 4"]
    # A JSON string may hold U+2028 raw; it is not a line break of the file.
    path.write_text(json.dumps({"prompt": "a\u2028b", "gold": "1"}, ensure_ascii=False) + f"\n\n{good}\n")
    rows = load_rows(path)
    assert rows[0].prompt == "a\u2028b" and rows[1].where == f"{path} line 3"


def test_parquet_and_json_array_rows_are_named_by_position(tmp_path: Path) -> None:
    (tmp_path / "d.json").write_text(json.dumps([ROWS[0], {"prompt": "x", "checks": {"math": {}}}]))
    with pytest.raises(DataError, match=r"d.json row 2: checks.math.gold is missing"):
        load_rows(tmp_path / "d.json")


@pytest.mark.parametrize(("gold", "text", "answer"), [(1e-07, "0.0000001", "0.0000001"), (1e16, "10000000000000000", "10^{16}"),
                                                     (0.00001, "0.00001", "0.00001"), (2.5, "2.5", "\\frac{5}{2}")])  # fmt: skip
def test_a_number_gold_is_written_out_so_the_verifier_reads_it(gold: float, text: str, answer: str) -> None:
    """str(1e-07) is "1e-07", which the math verifier reads as 1·e - 7 (Euler's e): every right answer scored 0."""
    from grpo.reward.verifiers.math import verify_math

    checks = parse_row({"prompt": "?", "gold": gold}, "f line 1").checks
    assert checks == {"math": {"gold": text}}
    assert verify_math(f"\\boxed{{{answer}}}", checks["math"]["gold"]).status == "correct"
    for bad in (float("nan"), float("inf")):
        with pytest.raises(DataError, match="finite"):
            parse_row({"prompt": "?", "gold": bad}, "f line 1")


def test_a_top_level_gold_keeps_the_math_checks_settings() -> None:
    """`gold` is shorthand for math.gold: it replaced the whole math check (precision, extraction) before."""
    row = {"prompt": "?", "gold": "0.33", "checks": {"math": {"precision": 2, "extraction": ["expr"]}, "format": {}}}
    assert parse_row(row, "f line 1").checks == {
        "math": {"precision": 2, "extraction": ["expr"], "gold": "0.33"},
        "format": {},
    }
    same = {"prompt": "?", "gold": 7, "checks": {"math": {"gold": "7"}}}
    assert parse_row(same, "f line 1").checks == {"math": {"gold": "7"}}
    with pytest.raises(DataError, match=r"f line 1: 'gold' \('7'\) and checks.math.gold \('8'\) differ"):
        parse_row({"prompt": "?", "gold": 7, "checks": {"math": {"gold": "8"}}}, "f line 1")


def test_a_folder_is_named_as_a_folder(tmp_path: Path) -> None:
    (tmp_path / "hf-dataset").mkdir()
    with pytest.raises(DataError, match=r"hf-dataset is a folder: give one \.jsonl, \.json or \.parquet file"):
        load_rows(tmp_path / "hf-dataset")
