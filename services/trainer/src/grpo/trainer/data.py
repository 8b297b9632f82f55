"""Prompt datasets (JSONL, or Parquet through pyarrow), validated rows, and a resumable cursor.

A row is `{"prompt": str | [{"role", "content"}, ...], "task_type": "math", "checks": {...},
"id": optional, "response": optional (SFT)}`. An SFT response is a string, or a tool episode's segments
`[{"role": "assistant" | "tool", "content": str}, ...]` (assistant segments are trained, tool segments are not). `checks` is the reward service's Checks shape
(`{"math": {"gold": "42"}, "format": {}}`, `{"code": {"tests": [{"stdio": {...}}]}}`); a
top-level `gold` is shorthand for `{"math": {"gold": gold}}` (merged into a `math` check that has other
settings; a number is written out in positional notation).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from grpo.trainer.config import Source
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

    With the model's `tokenizer`, every row's text must also survive it (check_encodable). `source`: the file's index
    in the run's train_data list, kept on each row (PromptRow.source)."""
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


VOCABULARY_DOCS = 'README.md, "Train your own task"'
ENCODE_BATCH = 1024  # texts per tokenizer call: batched for speed, bounded for memory


def _texts(row: PromptRow) -> Iterator[tuple[str, str]]:
    """(what, text) of everything in a row the model reads or must write: prompt, gold answer, SFT response."""
    if isinstance(row.prompt, str):
        yield "prompt", row.prompt
    else:
        for i, (_, content) in enumerate(row.prompt):
            yield f"prompt message {i}", content
    gold = (row.checks.get("math") or {}).get("gold")
    if isinstance(gold, str):
        yield "gold answer", gold
    if isinstance(row.response, str):
        yield "response", row.response
    elif row.response:
        for i, (role, content) in enumerate(row.response):
            yield f"response segment {i} ({role})", content


def _visible(text: str) -> Counter[str]:
    """The characters that must survive a round trip: tokenizers may re-space text (SentencePiece's `▁`, a BERT
    decode around punctuation) and apply Unicode compatibility forms, neither of which loses anything."""
    return Counter(c for c in unicodedata.normalize("NFKC", text) if not c.isspace() and c != "\u2581")


def lost_character(text: str, decoded: str, normalize: Callable[[str], str] = str) -> str | None:
    """The first character of `text` that its round trip (`decoded`) lost or changed, or None.

    `normalize` is the tokenizer's own normalizer (lower-casing, accent stripping, NFC): what it changes is the
    tokenizer's choice, not a loss, so the round trip is held to the normalized text."""
    short = _visible(normalize(text)) - _visible(decoded)
    if not short:
        return None
    return next((c for c in text if _visible(normalize(c)) & short), next(iter(short)))


def _normalizer(tokenizer: Any) -> Callable[[str], str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    normalizer = getattr(backend, "normalizer", None)
    return (lambda text: str(normalizer.normalize_str(text))) if normalizer is not None else str


def _round_trips(tokenizer: Any, texts: list[str]) -> list[str]:
    """Each text encoded (no special tokens added) and decoded back as written, unknown tokens left out: a
    character that became `<unk>` is as lost as a dropped one (and `<unk>`'s own letters must not stand in)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's Rust side: batches in parallel
    unk = getattr(tokenizer, "unk_token", None)
    out: list[str] = []
    for start in range(0, len(texts), ENCODE_BATCH):
        part = texts[start : start + ENCODE_BATCH]
        if backend is not None:
            ids = [e.ids for e in backend.encode_batch(part, add_special_tokens=False)]
            decoded = backend.decode_batch(ids, skip_special_tokens=False)
        else:
            ids = tokenizer(part, add_special_tokens=False)["input_ids"]
            decoded = tokenizer.batch_decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        out += [d.replace(unk, "") if unk and unk not in t else d for t, d in zip(part, decoded, strict=True)]
    return out


def _byte_level_alphabet() -> set[str]:
    """The 256 characters a byte-level BPE spells bytes with (GPT-2's map, tokenizers' ByteLevel.alphabet())."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    return {chr(b) for b in kept} | {chr(256 + i) for i in range(256 - len(kept))}


def covers_every_text(tokenizer: Any) -> bool:
    """Whether nothing can be lost, so no row needs encoding (a large dataset's check would cost seconds): a byte-level
    BPE holding all 256 byte symbols (Qwen's, GPT-2's, Llama 3's, the built-in tiny model's), or byte fallback with
    all 256 byte tokens (Llama 2's). The demo model's character tokenizer is byte-level without most of them."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    vocab = backend.get_vocab()
    if type(backend.decoder).__name__ == "ByteLevel" and _byte_level_alphabet() <= vocab.keys():
        return True
    byte_tokens = {f"<0x{b:02X}>" for b in range(256)}
    return bool(getattr(backend.model, "byte_fallback", False)) and byte_tokens <= vocab.keys()


def check_encodable(rows: Sequence[PromptRow], tokenizer: Any) -> None:
    """DataError naming the first row whose text the tokenizer cannot encode losslessly: a character its vocabulary
    lacks is dropped (or turned into an unknown token) without a word, so the model would train on text it never
    sees, e.g. `12*34=` read as `1234=`. Prompt, gold answer and SFT response are each encoded and decoded back."""
    if covers_every_text(tokenizer):
        return
    where_of: dict[str, tuple[PromptRow, str]] = {}
    for row in rows:
        for what, text in _texts(row):
            where_of.setdefault(text, (row, what))
    texts, normalize = list(where_of), _normalizer(tokenizer)
    for text, decoded in zip(texts, _round_trips(tokenizer, texts), strict=True):
        lost = None if decoded == text else lost_character(text, decoded, normalize)
        if lost is None:
            continue
        row, what = where_of[text]
        at = text.find(lost)
        column = f", column {at + 1}" if at >= 0 else ""
        shown = f"{text!r} reads back as {decoded!r}" if len(text) <= 60 else f"around it: {_excerpt(text, at)!r}"
        raise DataError(
            f"{row.where}: the {what} holds {lost!r} (U+{ord(lost):04X}{column}), which the model's tokenizer "
            f"cannot encode: it is dropped or changed ({shown}), so the model would train on text it never sees. "
            f"Rewrite the text, or use a model whose vocabulary covers it (the built-in models' vocabularies: "
            f"{VOCABULARY_DOCS})"
        )


def _excerpt(text: str, at: int, width: int = 24) -> str:
    return text[max(0, at - width) : at + width] if at >= 0 else text[: 2 * width]


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
    return list(_permutation(n, seed, epoch))


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    # Cached: a run looks up the row of every group it settles (row_of), and a shuffle of 100k rows takes ~50 ms.
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tuple(order)


@dataclass(frozen=True)
class Mixture:
    """Weighted groups of a run's rows (its train_data files, or its task types). Each epoch has one draw per row;
    group g gets weight_g / sum(weights) of them (largest-remainder rounding), taken from its own endless stream of
    seeded permutations of its rows (each row once per pass), and the epoch's draws are then shuffled. The order
    depends only on (seed, epoch, the groups, the weights), so a task id's position finds its row after a resume."""

    names: tuple[str, ...]  # each group's name (a file, or a task type), for the logs and errors
    groups: tuple[tuple[int, ...], ...]  # each group's row indices
    weights: tuple[float, ...]
    _epochs: dict[tuple[int, int], list[int]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_rows(self) -> int:
        return sum(len(g) for g in self.groups)

    def counts(self) -> list[int]:
        """Each group's draws per epoch."""
        return shares(self.n_rows, self.weights)

    def epoch_order(self, seed: int, epoch: int) -> list[int]:
        """The rows drawn in epoch `epoch`, in order (a row may appear more than once, or not at all)."""
        order = self._epochs.get((seed, epoch))
        if order is None:  # a run reads one or two epochs at a time: a small cache spares a recomputation per task
            if len(self._epochs) >= 4:
                self._epochs.clear()
            order = mixed_order(self.groups, self.counts(), seed, epoch)
            self._epochs[(seed, epoch)] = order
        return order


def shares(n: int, weights: Sequence[float]) -> list[int]:
    """`n` draws split by `weights`: largest-remainder rounding of n × w / sum(w) (ties to the earlier group)."""
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    quotas = [n * w / total for w in exact]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda g: (counts[g] - quotas[g], g))
    for g in by_remainder[: n - sum(counts)]:
        counts[g] += 1
    return counts


def group_stream(rows: Sequence[int], seed: int, group: int, start: int, count: int) -> list[int]:
    """Positions [start, start + count) of group `group`'s endless stream: pass p is a permutation of its rows seeded
    by (seed, group, p), so each row comes once per pass."""
    out: list[int] = []
    position = start
    while len(out) < count:
        pass_index, offset = divmod(position, len(rows))
        permutation = list(rows)
        random.Random(f"{seed}:group{group}:pass{pass_index}").shuffle(permutation)
        chunk = permutation[offset : offset + count - len(out)]
        out += chunk
        position += len(chunk)
    return out


def mixed_order(groups: Sequence[Sequence[int]], counts: Sequence[int], seed: int, epoch: int) -> list[int]:
    """Epoch `epoch`'s draws: group g's positions [epoch × c_g, (epoch + 1) × c_g) of its stream, shuffled together
    with (seed, epoch)."""
    draws: list[int] = []
    for g, (rows, count) in enumerate(zip(groups, counts, strict=True)):
        draws += group_stream(rows, seed, g, epoch * count, count)
    random.Random(f"{seed}:{epoch}").shuffle(draws)
    return draws


def mixture_of(rows: Sequence[PromptRow], sources: Sequence[Source], task_weights: dict[str, float]) -> Mixture | None:
    """How the run draws `rows` (train_data's rows, joined in the list's order): by task_weights over task types, by
    the weights of a weighted train_data list over its files, or (None) as they come: `epoch_order`, a plain
    shuffle per epoch. DataError for a weight that names no task type of the data, a weighted file none of whose
    rows is left, or a group too light to get one draw per epoch (its rows would never be trained on)."""
    if task_weights:
        present = sorted({row.task_type for row in rows})
        unknown = sorted(set(task_weights) - set(present))
        if unknown:
            raise DataError(f"task_weights names {unknown}, but no train_data row has that task_type; the rows' task "
                            f"types: {present}")  # fmt: skip
        names = tuple(present)
        groups = tuple(tuple(i for i, row in enumerate(rows) if row.task_type == t) for t in present)
        weights = tuple(float(task_weights.get(t, 1.0)) for t in present)
        what = "task_type"
    elif any(source.weight is not None for source in sources):
        names = tuple(str(source.path) for source in sources)
        groups = tuple(tuple(i for i, row in enumerate(rows) if row.source == s) for s in range(len(sources)))
        weights = tuple(float(source.weight or 1.0) for source in sources)
        empty = [name for name, group in zip(names, groups, strict=True) if not group]
        if empty:
            raise DataError(f"train_data {empty[0]}: none of its rows is left to draw (overlong_prompts: drop left "
                            "them all out), so its weight cannot be met; fix or remove the file")  # fmt: skip
        what = "train_data file"
    else:
        return None
    mixture = Mixture(names, groups, weights)
    counts = mixture.counts()
    for name, weight, count in zip(names, weights, counts, strict=True):
        if count == 0:
            raise DataError(f"{what} {name} weighs {weight:g} of {sum(weights):g}: an epoch's {len(rows)} draws give "
                            "it none, so its rows would never be trained on; raise its weight")  # fmt: skip
    log.info("mixing by %s, draws per epoch of %d: %s", what, len(rows), ", ".join(
        f"{name} {count} ({100 * count / len(rows):.1f} %, {len(group)} rows)"
        for name, count, group in zip(names, counts, groups, strict=True)))  # fmt: skip
    return mixture


def draw_order(n_rows: int, seed: int, epoch: int, mixture: Mixture | None = None) -> list[int]:
    """Epoch `epoch`'s rows in order: the mixture's, or a plain permutation (epoch_order)."""
    if mixture is None:
        return epoch_order(n_rows, seed, epoch)
    if mixture.n_rows != n_rows:
        raise ValueError(f"the mixture holds {mixture.n_rows} rows, the data {n_rows}")
    return mixture.epoch_order(seed, epoch)


@dataclass(frozen=True)
class Taken:
    """What `take_eligible` drew: the (position key, row index) pairs, the advanced cursor, the draws it passed over,
    and whether it ran out of eligible rows (a whole epoch's worth of draws in a row skipped) and drew anyway."""

    picks: list[tuple[str, int]]
    cursor: DataCursor
    skipped: int = 0
    exhausted: bool = False


def take_eligible(
    cursor: DataCursor,
    n_rows: int,
    k: int,
    mixture: Mixture | None = None,
    skip: Callable[[int, int, int], bool] | None = None,
) -> Taken:
    """`take`, passing over each draw whose (row, epoch, index) `skip` says to skip (difficulty buckets): the cursor moves
    past it, no task is made of it. When a whole epoch's worth of draws (n_rows) comes up skipped in a row, every row
    is set aside: that draw and the rest are taken as they come (`exhausted`), so a run never spins through epochs
    without sampling."""
    if n_rows < 1:
        raise ValueError("cannot take from an empty dataset")
    out: list[tuple[str, int]] = []
    epoch, index, skipped, in_a_row, exhausted = cursor.epoch, cursor.index, 0, 0, False
    order = draw_order(n_rows, cursor.seed, epoch, mixture)
    while len(out) < k:
        if index >= n_rows:
            epoch, index = epoch + 1, 0
            order = draw_order(n_rows, cursor.seed, epoch, mixture)
        row = order[index]
        if skip is not None and not exhausted and skip(row, epoch, index):
            if in_a_row + 1 < n_rows:
                skipped, in_a_row, index = skipped + 1, in_a_row + 1, index + 1
                continue
            exhausted = True
        in_a_row = 0
        out.append((f"e{epoch}-{index}", row))
        index += 1
    return Taken(out, DataCursor(epoch=epoch, index=index, seed=cursor.seed), skipped, exhausted)


def take(
    cursor: DataCursor, n_rows: int, k: int, mixture: Mixture | None = None
) -> tuple[list[tuple[str, int]], DataCursor]:
    """The next `k` (position key, row index) pairs and the advanced cursor; wraps into new epochs (of n_rows draws,
    in the mixture's order when the run mixes its data).

    The position key `e<epoch>-<index>` is unique within a run and the same after a resume,
    so it makes a stable task id.
    """
    taken = take_eligible(cursor, n_rows, k, mixture)
    return taken.picks, taken.cursor
