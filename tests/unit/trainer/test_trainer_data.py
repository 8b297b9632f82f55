"""Dataset rows (JSONL, and Parquet through pyarrow), errors that name file and row, the cursor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo.trainer.data import DataCursor, DataError, epoch_order, load_rows, parse_row, take

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
    assert f"{path} row 2" in str(exc.value)


def test_invalid_json_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"broken.jsonl row 2: not valid JSON"):
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
