"""Prompt datasets (JSONL, or Parquet through pyarrow), validated rows, and a resumable cursor.

A row is `{"prompt": str | [{"role", "content"}, ...], "task_type": "math", "checks": {...},
"id": optional, "response": optional (SFT)}`. `checks` is the reward service's Checks shape
(`{"math": {"gold": "42"}, "format": {}}`, `{"code": {"tests": [{"stdio": {...}}]}}`); a
top-level `gold` is shorthand for `{"math": {"gold": gold}}`.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from grpo.v1 import reward_pb2, rollout_pb2

log = logging.getLogger(__name__)

KNOWN_KEYS = {"id", "prompt", "task_type", "checks", "gold", "response"}


class DataError(ValueError):
    """A dataset file or row that cannot be used; the message names the file and the row."""


@dataclass(frozen=True)
class PromptRow:
    """One validated dataset row."""

    row_id: str
    prompt: str | tuple[tuple[str, str], ...]  # text, or (role, content) messages
    task_type: str
    checks: dict[str, Any]  # reward.Checks as a JSON mapping (validated)
    response: str | None = None

    def prompt_proto(self, apply_chat_template: bool) -> rollout_pb2.Prompt:
        if isinstance(self.prompt, str):
            return rollout_pb2.Prompt(text=self.prompt, apply_chat_template=apply_chat_template)
        messages = [rollout_pb2.ChatMessage(role=r, content=c) for r, c in self.prompt]
        return rollout_pb2.Prompt(
            messages=rollout_pb2.Messages(messages=messages), apply_chat_template=apply_chat_template
        )

    def messages(self) -> list[dict[str, str]] | None:
        return None if isinstance(self.prompt, str) else [{"role": r, "content": c} for r, c in self.prompt]

    def checks_proto(self) -> reward_pb2.Checks:
        return json_format.ParseDict(self.checks, reward_pb2.Checks())


def _strip_nones(value: Any) -> Any:
    """Arrow fills keys missing in some rows with None; the Checks shape has no meaningful nulls."""
    if isinstance(value, dict):
        return {k: _strip_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nones(v) for v in value]
    return value


def parse_row(raw: dict[str, Any], where: str, *, need_response: bool = False) -> PromptRow:
    """Validate one raw row; `where` ("file.jsonl row 7") goes into every error."""
    raw = _strip_nones(raw)
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise DataError(f"{where}: unknown field(s) {unknown}; expected {sorted(KNOWN_KEYS)}")
    prompt = raw.get("prompt")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where}: 'prompt' is empty")
        parsed_prompt: str | tuple[tuple[str, str], ...] = prompt
    elif isinstance(prompt, list) and prompt:
        msgs = []
        for i, m in enumerate(prompt):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise DataError(f"{where}: prompt message {i} must be {{'role': str, 'content': str}}, got {m!r}")
            msgs.append((m["role"], m["content"]))
        parsed_prompt = tuple(msgs)
    else:
        raise DataError(f"{where}: 'prompt' must be a non-empty string or list of chat messages, got {prompt!r}")
    task_type = raw.get("task_type", "math")
    if not isinstance(task_type, str) or not task_type:
        raise DataError(f"{where}: 'task_type' must be a non-empty string (math, code, ...), got {task_type!r}")
    checks = raw.get("checks") or {}
    if not isinstance(checks, dict):
        raise DataError(f"{where}: 'checks' must be a mapping like {{'math': {{'gold': '42'}}}}, got {checks!r}")
    if "gold" in raw:
        checks = {**checks, "math": {"gold": str(raw["gold"])}}
    if not need_response and not checks:
        raise DataError(f"{where}: no 'checks' (or 'gold'): nothing could score the completions")
    try:
        json_format.ParseDict(checks, reward_pb2.Checks())
    except json_format.ParseError as exc:
        raise DataError(f"{where}: bad 'checks': {exc}") from exc
    response = raw.get("response")
    if need_response and not (isinstance(response, str) and response):
        raise DataError(f"{where}: SFT rows need a non-empty 'response' string")
    row_id = raw.get("id")
    return PromptRow(
        row_id=str(row_id) if row_id is not None else "",
        prompt=parsed_prompt,
        task_type=task_type,
        checks=checks,
        response=response if isinstance(response, str) else None,
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """One JSON object per line (blank lines skipped); a `.json` file may also hold one array of objects."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc
        lines = [(n, item) for n, item in enumerate(items, start=1)]
    else:
        lines = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    lines.append((n, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path} row {n}: not valid JSON ({exc.msg})") from exc
    for n, obj in lines:  # each row's fields are validated by parse_row, which names the row
        if not isinstance(obj, dict):
            raise DataError(f"{path} row {n}: each line must be a JSON object, got {type(obj).__name__}")
    return [obj for _, obj in lines]


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow (pip install 'grpo-trainer[parquet]')") from None
    try:
        return pq.read_table(path).to_pylist()  # type: ignore[no-any-return]
    except Exception as exc:
        raise DataError(f"{path}: could not be read as Parquet: {exc}") from exc


def _read_raw(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .jsonl or .parquet")


def load_rows(path: Path, *, need_response: bool = False) -> list[PromptRow]:
    """All rows of a JSONL/Parquet file, validated; raises DataError naming the file and row."""
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    raw_rows = _read_raw(path)
    if not raw_rows:
        raise DataError(f"{path}: no rows")
    rows = [parse_row(raw, f"{path} row {i + 1}", need_response=need_response) for i, raw in enumerate(raw_rows)]
    log.info("loaded %d rows from %s", len(rows), path)
    return rows


@dataclass(frozen=True)
class DataCursor:
    """Where the next prompt comes from: the epoch, the position in that epoch's shuffled order, the seed."""

    epoch: int = 0
    index: int = 0
    seed: int = 0

    def to_state(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, int]) -> DataCursor:
        return cls(**{k: int(v) for k, v in state.items()})


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The row order of one epoch: a permutation that depends only on (seed, epoch)."""
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def take(cursor: DataCursor, n_rows: int, k: int) -> tuple[list[tuple[str, int]], DataCursor]:
    """The next `k` (position key, row index) pairs and the advanced cursor; wraps into new epochs.

    The position key `e<epoch>-<index>` is unique within a run and the same after a resume,
    so it makes a stable task id.
    """
    if n_rows < 1:
        raise ValueError("cannot take from an empty dataset")
    out: list[tuple[str, int]] = []
    epoch, index = cursor.epoch, cursor.index
    order = epoch_order(n_rows, cursor.seed, epoch)
    while len(out) < k:
        if index >= n_rows:
            epoch, index = epoch + 1, 0
            order = epoch_order(n_rows, cursor.seed, epoch)
        out.append((f"e{epoch}-{index}", order[index]))
        index += 1
    return out, DataCursor(epoch=epoch, index=index, seed=cursor.seed)
