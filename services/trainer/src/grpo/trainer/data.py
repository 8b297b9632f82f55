"""Prompt datasets (JSONL, or Parquet through pyarrow) and their validated rows.

A row is `{"prompt": str | [{"role", "content"}, ...], "task_type": "math", "checks": {...},
"id": optional, "response": optional (SFT)}`. An SFT response is a string, or a tool episode's segments
`[{"role": "assistant" | "tool", "content": str}, ...]` (assistant segments are trained, tool segments are not). `checks` is the reward service's Checks shape
(`{"math": {"gold": "42"}, "format": {}}`, `{"code": {"tests": [{"stdio": {...}}]}}`); a
top-level `gold` is shorthand for `{"math": {"gold": gold}}` (merged into a `math` check that has other
settings; a number is written out in positional notation).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from grpo.v1 import reward_pb2, rollout_pb2

log = logging.getLogger(__name__)

# `provenance`: where a rejection-sampling stage's row came from (task, model version, rewards); kept with the row,
# never trained on.
KNOWN_KEYS = {"id", "prompt", "task_type", "checks", "gold", "response", "provenance"}
# The checks that are reward components (the reward service's Checks.names()): `steps` only reports step scores,
# and plug-ins are components under their own names.
NOT_COMPONENTS = ("steps", "plugins")


def _non_empty_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


# What the reward service requires of each check (its schemas): proto3 turns a missing field into "" or 0, which
# the service then cannot score, so the row would be dropped as unscored or failed on every epoch instead.
REQUIRED_FIELDS: dict[tuple[str, str], tuple[Callable[[Any], bool], str]] = {
    ("math", "gold"): (_non_empty_text, "a non-empty string (the reference answer)"),
    ("code", "tests"): (lambda v: isinstance(v, list) and bool(v), "a non-empty list of tests"),
    ("overlong", "max_tokens"): (lambda v: type(v) is int and v > 0, "a positive integer"),
    ("overlong", "buffer_tokens"): (lambda v: type(v) is int and v >= 0, "an integer >= 0"),
    ("steps", "source"): (lambda v: v in ("rule", "prm", "cut"), "rule, prm or cut"),
}


# Optional fields with a fixed set of values, checked when present (the reward service would fail every such task).
OPTIONAL_FIELDS: dict[tuple[str, str], tuple[Callable[[Any], bool], str]] = {
    ("reward_model", "normalize"): (lambda v: v in ("none", "sigmoid"), "none or sigmoid"),
    ("reward_model", "scale"): (
        lambda v: type(v) in (int, float) and math.isfinite(v) and v > 0,
        "a finite number > 0",
    ),
    ("reward_model", "shift"): (lambda v: type(v) in (int, float) and math.isfinite(v), "a finite number"),
}


class DataError(ValueError):
    """A dataset file or row that cannot be used (alone, or with the run's settings); the message names the file and
    the row."""


@dataclass(frozen=True)
class PromptRow:
    """One validated dataset row."""

    row_id: str
    prompt: str | tuple[tuple[str, str], ...]  # text, or (role, content) messages
    task_type: str
    checks: dict[str, Any]  # reward.Checks as a JSON mapping (validated)
    response: str | tuple[tuple[str, str], ...] | None = None  # text, or a tool episode's (role, content) segments
    where: str = field(default="", compare=False)  # "file.jsonl line 7": for errors found after loading
    source: int = field(default=0, compare=False)  # the index of its train_data file (a mixture's group)
    provenance: dict[str, Any] | None = field(default=None, compare=False)  # a rejection-sampling row's origin

    def components(self) -> set[str]:
        """The reward components the row's checks ask for (what reward_weights may name)."""
        return {k for k in self.checks if k not in NOT_COMPONENTS} | set(self.checks.get("plugins", {}))

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


def parse_row(
    raw: dict[str, Any], where: str, *, need_response: bool = False, default_checks: dict[str, Any] | None = None
) -> PromptRow:
    """Validate one raw row; `where` ("file.jsonl line 7") goes into every error and stays with the row.

    `default_checks` (the setting): the checks of a row without its own (or a gold), instead of refusing it."""
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
        checks = _with_gold(checks, gold_text(raw["gold"], where), where)
    if not checks and default_checks:
        checks = dict(default_checks)
    if not need_response and not checks:
        raise DataError(f"{where}: no 'checks' (or 'gold'): nothing could score the completions (or set "
                        "default_checks, e.g. {reward_model: {}}, for rows without their own)")  # fmt: skip
    try:
        json_format.ParseDict(checks, reward_pb2.Checks())
    except json_format.ParseError as exc:
        raise DataError(f"{where}: bad 'checks': {exc}") from exc
    check_required(checks, where)
    response = parse_response(raw.get("response"), where)
    if need_response and not response:
        raise DataError(f"{where}: SFT rows need a 'response': a non-empty string, or a list of segments "
                        f"{SEGMENT_SHAPE}")  # fmt: skip
    provenance = raw.get("provenance")
    if provenance is not None and not isinstance(provenance, dict):
        raise DataError(f"{where}: 'provenance' must be a mapping (where the row came from), got {provenance!r}")
    row_id = raw.get("id")
    return PromptRow(
        row_id=str(row_id) if row_id is not None else "",
        prompt=parsed_prompt,
        task_type=task_type,
        checks=checks,
        response=response or None,
        where=where,
        provenance=provenance,
    )


SEGMENT_ROLES = ("assistant", "tool")
SEGMENT_SHAPE = '{"role": "assistant" | "tool", "content": str}'


def parse_response(value: Any, where: str) -> str | tuple[tuple[str, str], ...] | None:
    """An SFT response: text, or a tool episode as segments; the episode starts and ends with the assistant (a tool
    answers a call, and the last turn is the answer, followed by EOS as a plain response is)."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: 'response' must be a string or a non-empty list of segments {SEGMENT_SHAPE}, "
                        f"got {value!r}")  # fmt: skip
    segments = []
    for i, seg in enumerate(value):
        if not (isinstance(seg, dict) and set(seg) == {"role", "content"} and isinstance(seg["content"], str)):
            raise DataError(f"{where}: response segment {i} must be {SEGMENT_SHAPE}, got {seg!r}")
        if seg["role"] not in SEGMENT_ROLES:
            raise DataError(f"{where}: response segment {i} has role {seg['role']!r}; it must be assistant (trained) "
                            "or tool (a tool's result, not trained)")  # fmt: skip
        if not seg["content"]:
            raise DataError(f"{where}: response segment {i} ({seg['role']}) is empty")
        segments.append((seg["role"], seg["content"]))
    if segments[0][0] != "assistant" or segments[-1][0] != "assistant":
        raise DataError(f"{where}: a response's segments must start and end with an assistant segment (a tool "
                        "answers the assistant's call; the last turn is the answer)")  # fmt: skip
    return tuple(segments)


def gold_text(gold: Any, where: str) -> str:
    """A top-level gold as the text the math verifier reads. A number is written out in positional notation:
    str(1e-07) is "1e-07", which a LaTeX reader takes for 1·e - 7 (Euler's e), and every answer would be wrong."""
    if isinstance(gold, str):
        return gold
    if isinstance(gold, bool) or not isinstance(gold, int | float):  # a number is its text; a dict is not
        raise DataError(f"{where}: 'gold' must be a string (or a number), the reference answer; got {gold!r}")
    if isinstance(gold, float) and not math.isfinite(gold):
        raise DataError(f"{where}: 'gold' must be a finite number, got {gold!r}")
    return str(gold) if isinstance(gold, int) else format(Decimal(repr(gold)).normalize(), "f")


def _with_gold(checks: dict[str, Any], gold: str, where: str) -> dict[str, Any]:
    """`checks` with math.gold set to the top-level gold, keeping the math check's other settings."""
    math_check = checks.get("math") or {}
    if not isinstance(math_check, dict):
        raise DataError(f"{where}: checks.math must be a mapping, got {math_check!r}")
    if "gold" in math_check and str(math_check["gold"]) != gold:
        raise DataError(f"{where}: 'gold' ({gold!r}) and checks.math.gold ({math_check['gold']!r}) differ; keep one")
    return {**checks, "math": {**math_check, "gold": gold}}


def check_required(checks: dict[str, Any], where: str) -> None:
    """Each check the row asks for has the fields the reward service needs to score it (REQUIRED_FIELDS)."""
    for (check, name), (valid, what) in REQUIRED_FIELDS.items():
        if check not in checks:
            continue
        if name not in checks[check]:
            raise DataError(f"{where}: checks.{check}.{name} is missing; it must be {what}")
        if not valid(checks[check][name]):
            raise DataError(f"{where}: checks.{check}.{name} must be {what}, got {checks[check][name]!r}")
    for (check, name), (valid, what) in OPTIONAL_FIELDS.items():
        value = (checks.get(check) or {}).get(name)
        if value is not None and not valid(value):
            raise DataError(f"{where}: checks.{check}.{name} must be {what}, got {value!r}")


Located = list[tuple[str, dict[str, Any]]]  # (where: "file line 7", raw row)


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{path} line {line}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                        "save the file as UTF-8") from None  # fmt: skip


def _read_jsonl(path: Path) -> Located:
    """One JSON object per line (blank lines skipped); a `.json` file may also hold one array of objects.

    JSONL rows are named by their line in the file (what an editor shows), array items by their position."""
    text = _read_text(path)
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc
        rows = [(f"{path} row {n}", item) for n, item in enumerate(items, start=1)]
    else:
        rows = []
        # split("\n"), not splitlines(): JSON strings may hold U+2028 and other characters splitlines() breaks at.
        for n, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    rows.append((f"{path} line {n}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path} line {n}: not valid JSON ({exc.msg})") from exc
    for where, obj in rows:  # each row's fields are validated by parse_row, which names the row
        if not isinstance(obj, dict):
            raise DataError(f"{where}: each row must be a JSON object, got {type(obj).__name__}")
    return rows


def _read_parquet(path: Path) -> Located:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow (pip install 'grpo-trainer[parquet]')") from None
    try:
        table = pq.read_table(path).to_pylist()
    except Exception as exc:
        raise DataError(f"{path}: could not be read as Parquet: {exc}") from exc
    return [(f"{path} row {n}", raw) for n, raw in enumerate(table, start=1)]


def _read_raw(path: Path) -> Located:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .jsonl or .parquet")


def load_rows(
    path: Path,
    *,
    need_response: bool = False,
    tokenizer: Any = None,
    default_checks: dict[str, Any] | None = None,
    source: int = 0,
) -> list[PromptRow]:
    """All rows of a JSONL/Parquet file, validated; raises DataError naming the file and row.

    With the model's `tokenizer`, every row's text must also survive it (encodable.check_encodable). `source`: the
    file's index in the run's train_data list, kept on each row (PromptRow.source)."""
    if path.is_dir():
        raise DataError(f"{path} is a folder: give one .jsonl, .json or .parquet file")
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    raw_rows = _read_raw(path)
    if not raw_rows:
        raise DataError(f"{path}: no rows")
    rows = [
        parse_row(raw, where, need_response=need_response, default_checks=default_checks) for where, raw in raw_rows
    ]
    if source:
        rows = [replace(row, source=source) for row in rows]
    if tokenizer is not None:
        # Imported here: encodable raises this module's DataError about its PromptRows, so a top-level import is a cycle.
        from grpo.trainer.encodable import check_encodable

        check_encodable(rows, tokenizer)
    log.info("loaded %d rows from %s", len(rows), path)
    return rows


def load_sources(
    paths: Sequence[Path],
    *,
    need_response: bool = False,
    tokenizer: Any = None,
    default_checks: dict[str, Any] | None = None,
) -> list[PromptRow]:
    """The rows of every train_data file, joined in the list's order; each row keeps its file's index (source)."""
    rows: list[PromptRow] = []
    for i, path in enumerate(paths):
        rows += load_rows(path, need_response=need_response, tokenizer=tokenizer, default_checks=default_checks,
                          source=i)  # fmt: skip
    return rows
