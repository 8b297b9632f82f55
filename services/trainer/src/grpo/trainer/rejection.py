"""Rejection sampling (DeepSeek-R1's stage 3): which sampled answers become SFT rows, and the stage's summary. Pure.

A prompt's k samples come back as one scored group (GroupRecord). Each sample is a `Candidate`; `select` keeps
those that

1. pass every required component (score >= rs_pass_score): the names in rs_require, or by default every component
   the row's checks ask for except `overlong` and `reward_model`, which are not pass/fail;
2. pass every readability filter (rs_filters): `mixed_language`, `truncated`, `overlong`, or a plug-in predicate
   `package.module:function`;
3. are not a duplicate of an answer already kept for the prompt (text equal after stripping and collapsing
   whitespace), taken in sample order, or shortest first (rs_shortest_first);
4. fit the prompt's quota (rs_keep_per_prompt).

Every sample that is not kept is counted under the first reason it failed, so a summary's `sampled` is always
`kept` plus every rejection. A group that failed or came back unscored keeps no rows: its k samples are counted as
rejected for `group failed` / `group unscored` (the rollout's failure is never read as a wrong answer).

The run that feeds groups through this module is rejection_run.py.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo.common.plugins import import_function
from grpo.trainer.data import PromptRow
from grpo.v1 import queue_pb2

DATA_FILE = "data.jsonl"
SUMMARY_FILE = "rs_summary.json"
BUILTIN_FILTERS = ("mixed_language", "truncated", "overlong")
# Components that grade rather than pass or fail: never required unless rs_require names them.
NOT_PASS_FAIL = ("overlong", "reward_model")
MAX_NONE_IDS = 50  # prompts with none kept: the summary names this many
# How an episode ends when it ran out of length (EpisodeStats.end): it was cut, as a completion at max_new_tokens.
CUT_ENDS = ("length", "max_total_tokens")

Text = str | tuple[tuple[str, str], ...]  # a prompt or response: text, or (role, content) messages / segments


@dataclass(frozen=True)
class Candidate:
    """One sampled answer to one prompt, with everything the filters and the SFT row need."""

    task_id: str
    prompt_id: str  # the row's id, or the task id for a row without one
    sample_index: int  # its place in the group (the order the rollout sampled)
    prompt: Text
    response: Text  # the completion's text, or an episode's (role, content) segments
    text: str  # the whole completion text (de-duplication compares it)
    task_type: str
    checks: dict[str, Any]
    reward: float | None
    components: dict[str, float | None]  # name -> score (None: the component could not judge)
    tokens: int  # the tokens the model sampled (an episode's tool results are not its)
    truncated: bool  # hit the length limit
    weight_version: int
    ended: str = ""  # why it stopped: the completion's finish reason (stop | length), or an episode's end

    @property
    def model_text(self) -> str:
        """What the model wrote: an episode's assistant segments (a tool's output is not its answer)."""
        if isinstance(self.response, str):
            return self.response
        return "".join(content for role, content in self.response if role == "assistant")

    def plugin_view(self) -> dict[str, Any]:
        """What a plug-in predicate receives (documented: prompt, response, row_id, task_type, components, tokens,
        truncated); prompt and response as they appear in the SFT row."""
        return {
            "prompt": jsonable(self.prompt, "content"),
            "response": jsonable(self.response, "content"),
            "row_id": self.prompt_id,
            "task_type": self.task_type,
            "components": dict(self.components),
            "tokens": self.tokens,
            "truncated": self.truncated,
        }


def jsonable(value: Text, key: str = "content") -> str | list[dict[str, str]]:
    """Text as the data files spell it: a string, or a list of {"role", "content"} objects."""
    if isinstance(value, str):
        return value
    return [{"role": role, key: content} for role, content in value]


def episode_segments(token_ids: Sequence[int], mask: Sequence[int], decode: Callable[[list[int]], str]) -> Text:
    """An episode's completion as SFT segments: each run of the model's tokens (mask 1) an assistant segment, each
    run of the environment's (mask 0) a tool segment, decoded run by run (as sft.to_pair encodes them)."""
    if len(mask) != len(token_ids):
        raise ValueError(f"a token mask of {len(mask)} entries for {len(token_ids)} tokens")
    segments: list[tuple[str, str]] = []
    start = 0
    for i in range(1, len(token_ids) + 1):
        if i == len(token_ids) or mask[i] != mask[start]:
            text = decode(list(token_ids[start:i]))
            if text:
                segments.append(("assistant" if mask[start] else "tool", text))
            start = i
    return tuple(segments)


def candidates(
    record: queue_pb2.GroupRecord, row: PromptRow, decode: Callable[[list[int]], str] | None = None
) -> list[Candidate]:
    """The group's samples as candidates, in sample order. An episode's sample (a token mask with tool tokens)
    becomes segments, for which `decode` (the model's tokenizer) is needed."""
    out = []
    for i, s in enumerate(record.samples):
        c = s.completion
        mask = list(s.token_mask)
        response: Text = c.text
        if mask and not all(mask):
            if decode is None:
                raise ValueError(f"group {record.group_id}: an episode's sample needs the tokenizer to split it")
            response = episode_segments(list(c.token_ids), mask, decode)
        components = {
            name: (float(comp.score) if comp.HasField("score") else None) for name, comp in sorted(s.components.items())
        }
        ended = s.episode.end if s.HasField("episode") else ""
        out.append(
            Candidate(
                task_id=record.group_id,
                prompt_id=row.row_id or record.group_id,
                sample_index=i,
                prompt=row.prompt,
                response=response,
                text=c.text,
                task_type=row.task_type,
                checks=row.checks,
                reward=float(s.reward) if s.HasField("reward") else None,
                components=components,
                tokens=sum(mask) if mask else len(c.token_ids),
                truncated=c.finish_reason == "length" or ended in CUT_ENDS,
                weight_version=int(record.weight_version),
                ended=ended or c.finish_reason,
            )
        )
    return out


# ---- readability filters -------------------------------------------------------------------------------------
# A filter returns None to keep a candidate, or the reason it rejects it.
Filter = Callable[[Candidate], str | None]
# Scripts that write without spaces between words, or mix with each other in one language (Japanese: kanji, kana).
_ONE_SCRIPT = {"CJK": "CJK", "HIRAGANA": "CJK", "KATAKANA": "CJK"}
_LETTERS = re.compile(r"[^\W\d_]+")


def script_of(ch: str) -> str:
    """The Unicode script of a letter, from its name (LATIN, CYRILLIC, GREEK, CJK, ...)."""
    name = unicodedata.name(ch, "UNKNOWN").split(" ", 1)[0]
    return _ONE_SCRIPT.get(name, name)


def scripts(text: str) -> set[str]:
    """The scripts `text`'s words are written in. A word is a run of letters of one script, of 2 or more letters
    (CJK: every character): a lone letter of another script (x, π, θ in a formula) is a symbol, not language."""
    found: set[str] = set()
    for run in _LETTERS.findall(unicodedata.normalize("NFKC", text)):
        start = 0
        for i in range(1, len(run) + 1):
            if i == len(run) or script_of(run[i]) != script_of(run[start]):
                script = script_of(run[start])
                if i - start >= 2 or script == "CJK":
                    found.add(script)
                start = i
    return found


def mixed_language(c: Candidate) -> str | None:
    """R1's language-mixing filter: words of more than one script in what the model wrote."""
    found = scripts(c.model_text)
    return None if len(found) <= 1 else "mixed_language"


def truncated(c: Candidate) -> str | None:
    return "truncated" if c.truncated else None


def overlong_filter(max_tokens: int) -> Filter:
    def overlong(c: Candidate) -> str | None:
        return "overlong" if c.tokens > max_tokens else None

    return overlong


def load_plugin(spec: str) -> Callable[[dict[str, Any]], Any]:
    """The function `package.module:function` names; ValueError naming rs_filters when it cannot be found."""
    if ":" not in spec:
        raise ValueError(
            f"rs_filters: {spec!r} is neither a built-in filter ({', '.join(BUILTIN_FILTERS)}) nor a plug-in "
            "`package.module:function`"
        )
    return import_function(spec, "rs_filters")


def plugin_filter(spec: str, func: Callable[[dict[str, Any]], Any]) -> Filter:
    """A plug-in predicate as a filter: True keeps, False or a reason string rejects (`filter <spec>: <reason>`).
    Anything else it returns, and any exception it raises, is an error naming it: never read as keep or reject."""

    def plugin(c: Candidate) -> str | None:
        try:
            verdict = func(c.plugin_view())
        except Exception as exc:
            raise PluginError(f"rs_filters plug-in {spec!r} raised {type(exc).__name__}: {exc}") from exc
        if verdict is True:
            return None
        if verdict is False:
            return spec
        if isinstance(verdict, str) and verdict:
            return f"{spec}: {verdict}"
        raise PluginError(
            f"rs_filters plug-in {spec!r} returned {verdict!r}; it must return True (keep), False or a non-empty "
            "reason string (reject)"
        )

    return plugin


class PluginError(RuntimeError):
    """A plug-in predicate misbehaved: the stage stops rather than keep or drop answers on a guess."""


@dataclass(frozen=True)
class Rules:
    """The stage's selection rules (the rs_* settings, plug-ins resolved)."""

    require: tuple[str, ...] | None = None  # None: the row's pass/fail components
    pass_score: float = 1.0
    keep_per_prompt: int = 1
    shortest_first: bool = False
    filters: tuple[tuple[str, Filter], ...] = ()


def make_rules(
    *,
    require: Sequence[str] | None = None,
    pass_score: float = 1.0,
    keep_per_prompt: int = 1,
    shortest_first: bool = False,
    filters: Sequence[str] = (),
    max_tokens: int = 0,
) -> Rules:
    """Rules from the settings' values; ValueError naming the setting for an unknown filter, a plug-in that cannot
    be imported, or `overlong` without rs_max_tokens."""
    if keep_per_prompt < 1:
        raise ValueError(f"rs_keep_per_prompt={keep_per_prompt}: keep at least 1 answer per prompt")
    if require is not None and not [name for name in require if name]:
        raise ValueError("rs_require is empty: name the components that must pass, or leave it unset (every "
                         "pass/fail component of each row)")  # fmt: skip
    if len(set(filters)) != len(filters):
        raise ValueError(f"rs_filters {list(filters)}: each filter once")
    made: list[tuple[str, Filter]] = []
    for name in filters:
        if name == "mixed_language":
            made.append((name, mixed_language))
        elif name == "truncated":
            made.append((name, truncated))
        elif name == "overlong":
            if max_tokens <= 0:
                raise ValueError("rs_filters names overlong but rs_max_tokens is 0: set rs_max_tokens, the most "
                                 "tokens an answer kept may have")  # fmt: skip
            made.append((name, overlong_filter(max_tokens)))
        else:
            made.append((name, plugin_filter(name, load_plugin(name))))
    return Rules(
        require=None if require is None else tuple(require),
        pass_score=pass_score,
        keep_per_prompt=keep_per_prompt,
        shortest_first=shortest_first,
        filters=tuple(made),
    )


def rules_from(settings: Any) -> Rules:
    """Rules from a TrainerSettings' rs_* fields."""
    return make_rules(
        require=settings.rs_require,
        pass_score=settings.rs_pass_score,
        keep_per_prompt=settings.rs_keep_per_prompt,
        shortest_first=settings.rs_shortest_first,
        filters=settings.rs_filters,
        max_tokens=settings.rs_max_tokens,
    )


def required_components(rules: Rules, row_components: Iterable[str]) -> tuple[str, ...]:
    """The components every kept answer to this row must pass, in a fixed order (the first failing one is the
    rejection's reason)."""
    if rules.require is not None:
        return rules.require
    return tuple(sorted(set(row_components) - set(NOT_PASS_FAIL)))


def rows_problem(rules: Rules, rows: Sequence[PromptRow], added: Iterable[str] = ()) -> str | None:
    """Why these rows cannot be rejection-sampled with these rules (else None): a row with nothing to pass (only
    graded components, so every answer would be kept), or one lacking a component rs_require names. `added`: the
    components every task gets besides the row's checks (the overlong penalty)."""
    extra = set(added)
    for row in rows:
        have = row.components() | extra
        if rules.require is None and not required_components(rules, have):
            return (f"{row.where}: its checks {sorted(have)} have no pass/fail component, so every answer would be "
                    "kept; give the row a rule (math, code, format, ...) or name what must pass in rs_require "
                    "(e.g. [reward_model] with rs_pass_score)")  # fmt: skip
        missing = [name for name in rules.require or () if name not in have]
        if missing:
            return (f"{row.where}: rs_require names {missing}, which its checks {sorted(have)} do not ask for: no "
                    "answer to it could pass")  # fmt: skip
    return None


def failed_component(c: Candidate, required: Sequence[str], pass_score: float) -> str | None:
    """`failed component <name>` for the first required component the candidate did not pass (missing or unjudged
    too)."""
    for name in required:
        score = c.components.get(name)
        if score is None or score < pass_score:
            return f"failed component {name}"
    return None


def filter_reason(c: Candidate, filters: Sequence[tuple[str, Filter]]) -> str | None:
    """`filter <name>` (a plug-in's own reason after it) for the first filter that rejects the candidate."""
    for _, check in filters:
        why = check(c)
        if why is not None:
            return f"filter {why}"
    return None


def dedup_key(text: str) -> str:
    """The text with whitespace stripped and every run of it collapsed to one space."""
    return " ".join(text.split())


@dataclass(frozen=True)
class Selection:
    kept: list[Candidate]
    rejected: Counter[str]  # reason -> samples


def select(cands: Sequence[Candidate], rules: Rules, required: Sequence[str]) -> Selection:
    """The answers to one prompt that the rules keep, and why each other one was rejected (its first reason)."""
    rejected: Counter[str] = Counter()
    passing: list[Candidate] = []
    for c in cands:
        reason = failed_component(c, required, rules.pass_score) or filter_reason(c, rules.filters)
        if reason is None:
            passing.append(c)
        else:
            rejected[reason] += 1
    if rules.shortest_first:
        passing.sort(key=lambda c: c.tokens)  # stable: equal lengths stay in sample order
    kept: list[Candidate] = []
    seen: set[str] = set()
    for c in passing:
        key = dedup_key(c.text)
        if key in seen:
            rejected["duplicate"] += 1
        elif len(kept) >= rules.keep_per_prompt:
            rejected["over quota"] += 1
        else:
            kept.append(c)
        seen.add(key)
    return Selection(kept, rejected)


def sft_row(c: Candidate, *, model: str, stage: int) -> dict[str, Any]:
    """The SFT row of a kept answer, with its provenance (data.py reads `provenance` as a known key)."""
    return {
        "id": f"{c.prompt_id}#{c.sample_index}",
        "prompt": jsonable(c.prompt),
        "response": jsonable(c.response),
        "task_type": c.task_type,
        "checks": c.checks,
        "provenance": {
            "task_id": c.task_id,
            "prompt_id": c.prompt_id,
            "sample_index": c.sample_index,
            "model": model,
            "model_version": c.weight_version,
            "reward": c.reward,
            "components": dict(c.components),
            "tokens": c.tokens,
            "ended": c.ended,
            "stage": stage,
        },
    }


# ---- the stage's tally and summary ------------------------------------------------------------------------------
@dataclass
class Tally:
    """What the stage has sampled, kept and rejected so far; checkpointed with the data file's length."""

    prompts: int = 0
    sampled: int = 0
    kept: int = 0
    kept_per_prompt: Counter[int] = field(default_factory=Counter)  # answers kept -> prompts
    none_kept: int = 0
    none_ids: list[str] = field(default_factory=list)  # the first MAX_NONE_IDS prompts with none kept
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> samples
    seconds: float = 0.0  # wall time of the stage's earlier processes (the run adds its own)

    def add(self, prompt_id: str, sampled: int, kept: int, rejected: Mapping[str, int]) -> None:
        if sampled != kept + sum(rejected.values()):
            raise ValueError(
                f"prompt {prompt_id}: {sampled} sampled != {kept} kept + {sum(rejected.values())} rejected"
            )
        self.prompts += 1
        self.sampled += sampled
        self.kept += kept
        self.kept_per_prompt[kept] += 1
        self.rejected.update(rejected)
        if kept == 0:
            self.none_kept += 1
            if len(self.none_ids) < MAX_NONE_IDS:
                self.none_ids.append(prompt_id)

    def add_dropped(self, prompt_id: str, samples: int, reason: str) -> None:
        """A prompt whose group keeps no rows (failed, unscored, timed out, stale): its k samples are rejected."""
        self.add(prompt_id, samples, 0, {f"group {reason}": samples})

    def to_state(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "sampled": self.sampled,
            "kept": self.kept,
            "kept_per_prompt": {str(k): v for k, v in sorted(self.kept_per_prompt.items())},
            "none_kept": self.none_kept,
            "none_ids": list(self.none_ids),
            "rejected": dict(sorted(self.rejected.items())),
            "seconds": self.seconds,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Tally:
        return cls(
            prompts=int(state["prompts"]),
            sampled=int(state["sampled"]),
            kept=int(state["kept"]),
            kept_per_prompt=Counter({int(k): int(v) for k, v in state["kept_per_prompt"].items()}),
            none_kept=int(state["none_kept"]),
            none_ids=[str(x) for x in state["none_ids"]],
            rejected=Counter({str(k): int(v) for k, v in state["rejected"].items()}),
            seconds=float(state.get("seconds", 0.0)),
        )

    def summary(self, seconds: float, **extra: Any) -> dict[str, Any]:
        """rs_summary.json: the counts, the kept-per-prompt histogram, the prompts with none kept, the rejections by
        reason (most frequent first) and the stage's wall time; `extra` (settings, model, ...) is added."""
        return {
            "prompts": self.prompts,
            "sampled": self.sampled,
            "kept": self.kept,
            "kept_per_prompt": {str(k): v for k, v in sorted(self.kept_per_prompt.items())},
            "prompts_with_none": self.none_kept,
            "prompts_with_none_ids": list(self.none_ids),
            "rejected": dict(sorted(self.rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
            "wall_seconds": round(seconds, 1),
            **extra,
        }


def outcome_text(kept: int, sampled: int, none: int, prompts: int) -> str:
    return f"kept {kept} of {sampled} samples ({none} of {prompts} prompts with none)"


def rs_outcome(folder: Path, seconds: float) -> dict[str, Any]:
    """A finished rejection-sampling stage's outcome (for stage.json), from its rs_summary.json. `seconds`: this
    process's share of the stage; the summary's wall time spans its restarts."""
    summary = json.loads((Path(folder) / SUMMARY_FILE).read_text())
    wall = max(float(seconds), float(summary.get("wall_seconds", 0.0)))
    out: dict[str, Any] = {"steps": summary["steps"]} if "steps" in summary else {}
    return {
        **out,
        "prompts": summary["prompts"],
        "sampled": summary["sampled"],
        "kept": summary["kept"],
        "prompts_with_none": summary["prompts_with_none"],
        "data": str(Path(folder) / DATA_FILE),
        "seconds": round(wall, 1),
        "outcome": outcome_text(summary["kept"], summary["sampled"], summary["prompts_with_none"], summary["prompts"]),
    }


def rs_finished(folder: Path) -> bool:
    """Whether a rejection-sampling run (or stage) in `folder` has written its data and summary to the end (the
    summary is renamed in last)."""
    return (Path(folder) / DATA_FILE).is_file() and (Path(folder) / SUMMARY_FILE).is_file()
