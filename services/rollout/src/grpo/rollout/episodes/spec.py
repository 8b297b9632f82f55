"""A task's EpisodeSpec, checked and with its defaults filled in; the per-episode state the runner builds up."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from grpo.common.tool_formats import FORMATS, TAGGED, turn_stops
from grpo.rollout.episodes.tools import PYTHON, Limits, PythonSession
from grpo.v1 import queue_pb2

DEFAULT_TOOL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Rules:
    """An EpisodeSpec with defaults applied: 0 max_total_tokens = max_turns x the turn's max_new_tokens, 0
    tool_timeout_s = 5 s, 0 max_tool_output_chars = no cut (the trainer's publisher always sets them)."""

    tools: tuple[str, ...]
    tool_format: str
    max_turns: int
    max_tool_calls: int
    max_total_tokens: int
    limits: Limits
    python_session: bool = False  # an episode's python calls share their state (tools.PythonSession)

    @property
    def stops(self) -> tuple[str, ...]:
        return turn_stops(self.tool_format)


def episode_rules(spec: queue_pb2.EpisodeSpec, max_new_tokens: int, known_tools: set[str]) -> Rules:
    """Checked rules of `spec`; ValueError naming the field to change."""
    fmt = spec.tool_format or TAGGED
    if fmt not in FORMATS:
        raise ValueError(f"episode.tool_format {fmt!r} is not one of {', '.join(FORMATS)}")
    if spec.max_turns < 1:
        raise ValueError(f"episode.max_turns must be >= 1 (got {spec.max_turns})")
    if spec.max_tool_calls < 0 or spec.max_total_tokens < 0 or spec.max_tool_output_chars < 0:
        raise ValueError("episode.max_tool_calls, max_total_tokens and max_tool_output_chars must be >= 0")
    if spec.tool_timeout_s < 0 or spec.tool_memory_mb < 0:
        raise ValueError("episode.tool_timeout_s and tool_memory_mb must be >= 0 (0: the default)")
    if 0 < spec.tool_memory_mb < 16:  # the sandbox's floor (grpo.reward.schemas.MemoryMb)
        raise ValueError(f"episode.tool_memory_mb {spec.tool_memory_mb} is under the sandbox's 16 MB; 0 = its default")
    unknown = sorted(set(spec.tools) - known_tools)
    if unknown:
        raise ValueError(f"episode.tools names {unknown}, which this replica does not have (it has "
                         f"{sorted(known_tools)}; plug-ins come from the rollout's tool_plugins setting)")  # fmt: skip
    if spec.python_session and PYTHON not in spec.tools:
        raise ValueError(
            f"episode.python_session needs the {PYTHON!r} tool in episode.tools (it has {list(spec.tools)})"
        )
    limits = Limits(spec.tool_timeout_s or DEFAULT_TOOL_TIMEOUT_S, spec.tool_memory_mb, spec.max_tool_output_chars)
    total = spec.max_total_tokens or spec.max_turns * max_new_tokens
    return Rules(tuple(spec.tools), fmt, spec.max_turns, spec.max_tool_calls, total, limits, spec.python_session)


def episode_seed(seed: int, task: int, episode: int, turn: int) -> int:
    """The seed of one episode's turn: a hash of (sampling seed, task index in the batch, episode index, turn),
    so that it draws the same whichever other episodes are still running."""
    digest = hashlib.sha256(f"{seed}:{task}:{episode}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits, as engines.sampling.prompt_seed


@dataclass
class Episode:
    """One sample of a group: every token after the prompt, the model's (mask 1) and the environment's (mask 0)."""

    task: int
    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_mask: list[int] = field(default_factory=list)
    stats: queue_pb2.EpisodeStats = field(default_factory=queue_pb2.EpisodeStats)
    answer: str = ""  # the model's last turn, less any tool call in it: what the reward scores
    answer_start: int = 0  # where that turn's tokens begin in token_ids
    session: PythonSession = field(default_factory=PythonSession)  # its python calls so far, for python_session
    # per stateful plug-in (PluginTool.stateful), its state in this episode; LOST after a call past its deadline
    states: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"
    text: str = ""  # the whole episode decoded, once it has ended

    @property
    def done(self) -> bool:
        return bool(self.stats.end)

    def add(self, token_ids: list[int], logprobs: list[float] | None) -> None:
        """Append a model turn's tokens (with their log-probs) or the environment's (logprobs None: 0.0, mask 0)."""
        self.token_ids.extend(token_ids)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))
        self.token_mask.extend([1 if logprobs is not None else 0] * len(token_ids))

    def end(self, why: str, finish_reason: str = "stop") -> None:
        self.stats.end, self.finish_reason = why, finish_reason
