"""The episode runner: G multi-turn episodes per task, the tool calls of some overlapping the turns of others.

The runner keeps the episodes that are READY for a turn and the tool calls in flight (on a thread pool). Each
step is ONE engine call for every ready episode (n=1, its prompt ids + its tokens so far: continuation by token
ids, never by re-encoded text); the calls that turn makes are sent to the pool without waiting, and every call
that has finished by then is collected: its result is encoded once and appended as environment tokens (mask 0,
log-prob 0.0), and its episode is ready again. When nothing is ready the runner waits for the first call to
finish, then up to one engine call's duration (`gather`) for more, so that calls finishing close together share
an engine call instead of each starting its own. An episode whose tool is running thus never holds up the
others, and the engine runs while tools run (`overlap=False`: the old synchronous turns, every call answered
before the next engine call, kept to compare; bench/bench_episodes.py measures the schedules). An episode's turn k draws from a seed of (seed, task, episode, k), and the
engines seed each prompt on its own, so what an episode samples does not depend on which others share its engine
call. The rules of an episode's end are in docs/multi-turn.md (answer | max_turns | max_tool_calls |
max_total_tokens | length).

Every turn of a batch must come from one weight version. The engine lock is NOT held across turns: a batch spans
tool calls (up to max_turns x tool_timeout_s), longer than a weight update waits for the lock before giving up
(UpdateBusy), so holding it would turn pushes away. Instead each engine call's version is compared with the
first's; on a change the batch starts over (the update has landed; a fresh start is under the new weights; calls
still out are abandoned), and after `restarts` such starts WeightsChanged (retryable) goes to the worker.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

from grpo.common.tool_formats import (
    MARKDOWN,
    ToolCall,
    cut_result,
    error_text,
    parse_call,
    render_result,
    without_calls,
)
from grpo.rollout.engines.base import PromptOutput, Sample, SamplingParams
from grpo.rollout.episodes.spec import Episode, Rules, episode_seed
from grpo.rollout.episodes.tools import PluginTool, PythonSession, PythonTool, Tool, ToolResult

LOST = object()  # an episode's state of a stateful plug-in after one of its calls ran past its deadline

log = logging.getLogger(__name__)

Generate = Callable[[list[list[int]], SamplingParams], tuple[list[PromptOutput], int, str]]
STOP_POLL_S = 0.25  # how often a wait for tool calls looks at `stopping`


class WeightsChanged(RuntimeError):
    """New weights arrived between two turns of an episode batch, again and again: retry the batch."""


class Interrupted(RuntimeError):
    """The caller is stopping: the batch is abandoned between two steps (nothing is written)."""


@dataclass
class EpisodeBatch:
    episodes: list[list[Episode]]  # per task, its G episodes
    weight_version: int
    weight_checksum: str


@dataclass(eq=False)  # compared by identity
class _InFlight:
    """A tool call sent to the pool; a plug-in's result reads as timed out `limit` seconds after the call started
    (not after it was queued: a call waiting for a pool thread is not running late). A python call has no deadline
    here: its sandbox bounds the run itself."""

    episode: Episode
    limit: float
    tool: str  # the called tool's name
    timed: bool  # a plug-in's: past its deadline, its result reads as timed out
    started: float | None = None  # set by the pool thread when the call starts
    future: Future[tuple[ToolResult, float, float]] = field(init=False)  # (result, seconds it ran, when it finished)

    @property
    def deadline(self) -> float | None:
        return self.started + self.limit if self.timed and self.started is not None else None


class EpisodeRunner:
    """Runs episode batches on `generate` (RolloutService.generate's signature, without `source`) with `tools`.

    `overlap` (default) lets tool calls run while the engine generates other episodes' turns; False answers every
    call of a turn before the next engine call (synchronous turns, kept to compare: docs/multi-turn.md#benchmark).
    `gather`: once a call has finished and no episode is ready, how long after that call's end to wait for more
    before the next engine call, in multiples of the last engine call's duration. A call finishing within that
    would wait about as long for an engine call started without it, and then need one of its own; so it joins
    this one (0: go with whatever has finished: on a GPU, where a call for one episode costs about as much as for
    many, results arriving a little apart would each start a full-length turn)."""

    def __init__(
        self,
        generate: Generate,
        tokenizer: Any,
        tools: Mapping[str, Tool],
        concurrency: int = 8,
        restarts: int = 2,
        stopping: Callable[[], bool] = lambda: False,
        overlap: bool = True,
        gather: float = 1.0,
    ) -> None:
        self.generate, self.tokenizer, self.tools = generate, tokenizer, dict(tools)
        self.restarts, self.stopping, self.overlap, self.gather = restarts, stopping, overlap, gather
        self.generate_s = 0.0  # the last engine call's duration
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="episode-tool")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def run(self, prompt_ids: list[list[int]], rules: Rules, params: SamplingParams) -> EpisodeBatch:
        """`params.n` episodes per prompt, under `rules`; raises ToolInfrastructureError when a tool could not run
        (the batch must fail, never be scored), WeightsChanged, Interrupted."""
        for attempt in range(self.restarts + 1):
            try:
                return self._run_once(prompt_ids, rules, params)
            except WeightsChanged as exc:
                if attempt == self.restarts:
                    raise
                log.info("episode batch starts over: %s", exc)
        raise AssertionError("unreachable")

    def _run_once(self, prompt_ids: list[list[int]], rules: Rules, params: SamplingParams) -> EpisodeBatch:
        episodes = [
            [Episode(t, i, session=PythonSession(session_seed(params.seed, t, i))) for i in range(params.n)]
            for t in range(len(prompt_ids))
        ]
        ready = [e for group in episodes for e in group]
        in_flight: list[_InFlight] = []
        version: tuple[int, str] | None = None
        calls = 0
        try:
            while ready or in_flight:
                if ready:
                    if self.stopping():
                        raise Interrupted("stopping between two turns of an episode batch")
                    started = time.monotonic()
                    outputs, got_version, got_checksum = self._generate_turn(ready, prompt_ids, rules, params)
                    self.generate_s, calls = time.monotonic() - started, calls + 1
                    if version is None:
                        version = (got_version, got_checksum)
                    elif (got_version, got_checksum) != version:
                        raise WeightsChanged(
                            f"weights went from v{version[0]} to v{got_version} at engine call {calls}"
                        )
                    for e, out in zip(ready, outputs, strict=True):
                        if call := self._turn(e, out.samples[0], rules):
                            in_flight.append(self._submit(e, call, rules))
                ready = self._collect(in_flight, rules)
        finally:
            for f in in_flight:  # abandoned (a failed or restarted batch): a call not started never runs
                f.future.cancel()
        for e in (e for group in episodes for e in group):
            e.text = self.decode(e.token_ids)
        assert version is not None
        return EpisodeBatch(episodes, *version)

    def _generate_turn(
        self, ready: list[Episode], prompt_ids: list[list[int]], rules: Rules, params: SamplingParams
    ) -> tuple[list[PromptOutput], int, str]:
        room = max(rules.max_total_tokens - len(e.token_ids) for e in ready)
        seeds = None
        if params.seed is not None:  # the episode's own turn: the same draws whichever episodes share the call
            seeds = tuple(episode_seed(params.seed, e.task, e.index, e.stats.turns) for e in ready)
        turn_params = replace(
            params,
            n=1,
            max_new_tokens=min(params.max_new_tokens, room),
            stop=tuple(dict.fromkeys(rules.stops + params.stop)),
            seeds=seeds,
        )
        return self.generate([prompt_ids[e.task] + e.token_ids for e in ready], turn_params)

    def _turn(self, e: Episode, sample: Sample, rules: Rules) -> ToolCall | None:
        """Append the model's turn; the tool call to answer, or None when the episode ended here."""
        room = rules.max_total_tokens - len(e.token_ids)
        cut = len(sample.token_ids) > room  # the engine call's budget was another episode's, larger
        tokens, logprobs = list(sample.token_ids[:room]), list(sample.logprobs[:room])
        e.answer_start = len(e.token_ids)
        e.add(tokens, logprobs)
        e.stats.turns += 1
        e.answer = self.decode(tokens) if cut else sample.text
        full = len(e.token_ids) >= rules.max_total_tokens
        call = parse_call(e.answer, rules.tool_format)
        stopped = cut or sample.finish_reason == "length"
        if call is not None or stopped or rules.tool_format == MARKDOWN:
            # Code is never the answer: should the episode end on this turn (a limit, or the call's result filling
            # the budget), it is scored without its calls, a cut-off one too. Should it go on, the next turn's text
            # replaces this. A markdown answer turn may hold python blocks it never ran (its stop is ```output, not
            # the block's end): they go too (`print(4821*317 - 1528257)` was paid as 1528257). Other answer turns
            # hold no call and are scored as written.
            e.answer = without_calls(e.answer, rules.tool_format)
        if stopped:
            e.end("max_total_tokens" if full else "length", "length")
            return None
        if call is None:
            e.end("answer")
            return None
        if e.stats.turns >= rules.max_turns:
            e.end("max_turns")
        elif e.stats.tool_calls >= rules.max_tool_calls:
            e.end("max_tool_calls")  # the call past the limit is not run
        elif full:
            e.end("max_total_tokens", "length")  # no room for the result
        else:
            return call
        return None

    def _submit(self, e: Episode, call: ToolCall, rules: Rules) -> _InFlight:
        """Send the call to the pool. The sandbox bounds a python run itself (and its client the rpc); a plug-in
        gets tool_timeout_s from when it starts, then its result reads as timed out (its thread runs on)."""
        python = isinstance(self.tools.get(call.name), PythonTool)
        f = _InFlight(e, rules.limits.timeout_s, call.name, timed=not python)
        f.future = self.pool.submit(self._call, call, rules, f)
        return f

    def _collect(self, in_flight: list[_InFlight], rules: Rules) -> list[Episode]:
        """Answer the calls that have finished (or are past their deadline), taking them out of `in_flight`; the
        episodes that go on, ready for their next turn. Overlapping, this waits when no call has finished (an
        engine call needs an episode), then up to `gather` engine calls' time from the first finish for more;
        synchronous, it waits for every call."""
        while in_flight:
            now = time.monotonic()
            done = [f for f in in_flight if f.future.done() or (f.deadline is not None and now >= f.deadline)]
            running = [f for f in in_flight if f not in done]
            until = float("inf")  # when to go with what has finished
            if done and self.overlap:
                until = min(_finished_at(f, now) for f in done) + self.gather * self.generate_s
            failed = any(f.future.done() and f.future.exception() is not None for f in done)
            if done and (failed or not running or now >= until):  # a failed call fails the batch at once
                return self._answer_all(done, in_flight, rules)
            if self.stopping():
                raise Interrupted("stopping while an episode batch waits for its tool calls")
            deadlines = [f.deadline for f in running if f.deadline is not None]
            timeout = min([STOP_POLL_S, until - now, *(d - now for d in deadlines)])
            wait([f.future for f in running], timeout=max(0.0, timeout), return_when=FIRST_COMPLETED)
        return []

    def _answer_all(self, done: list[_InFlight], in_flight: list[_InFlight], rules: Rules) -> list[Episode]:
        ready = []
        for f in done:
            in_flight.remove(f)
            self._answer(f, rules)  # ToolInfrastructureError propagates: the batch fails
            if not f.episode.done:
                ready.append(f.episode)
        return sorted(ready, key=lambda e: (e.task, e.index))  # a stable order for the engine call

    def _answer(self, f: _InFlight, rules: Rules) -> None:
        """Append the call's result to its episode as environment tokens, encoded once."""
        if f.future.done():
            result, seconds, _ = f.future.result()
        else:  # a plug-in past its deadline
            f.future.cancel()  # past a deadline the call has started: this only keeps a finished one's result out
            result = ToolResult(error_text(f"timed out after {f.limit:g}s"), error=True, timeout=True)
            seconds = f.limit
            tool = self.tools.get(f.tool)
            if isinstance(tool, PluginTool) and tool.stateful:  # its thread runs on and may change the state
                f.episode.states[f.tool] = LOST
        e = f.episode
        e.stats.tool_calls += 1
        e.stats.tool_errors += result.error
        e.stats.tool_timeouts += result.timeout
        e.stats.malformed_calls += result.malformed
        e.stats.tool_s += seconds
        text = cut_result(result.text, rules.limits.output_chars)
        rendered = render_result(text, rules.tool_format, self.tokenizer)
        ids = list(self.tokenizer.encode(rendered, add_special_tokens=False))  # encoded once, kept as is
        room = rules.max_total_tokens - len(e.token_ids)
        e.add(ids[:room], None)
        if len(ids) >= room:
            e.end("max_total_tokens", "length")

    def _call(self, call: ToolCall, rules: Rules, f: _InFlight) -> tuple[ToolResult, float, float]:
        """Run one call (on the pool: an episode has one call at a time, so its session is this thread's alone)."""
        started = f.started = time.monotonic()
        e = f.episode
        tool = self.tools.get(call.name)
        if call.error is not None:
            result = ToolResult(error_text(call.error), error=True, malformed=True)
        elif call.name not in rules.tools or tool is None:
            known = ", ".join(rules.tools) or "none"
            result = ToolResult(error_text(f"unknown tool {call.name!r} (tools: {known})"), error=True, malformed=True)
        elif rules.python_session and isinstance(tool, PythonTool):
            result = tool(call.arguments, rules.limits, e.session)
        elif isinstance(tool, PluginTool) and tool.stateful:
            state = e.states.setdefault(call.name, {})
            if state is LOST:
                result = ToolResult(error_text(f"{call.name}'s state is lost: an earlier call ran past "
                                               f"{rules.limits.timeout_s:g}s"), error=True)  # fmt: skip
            else:
                result = tool(call.arguments, rules.limits, state)
        else:
            result = tool(call.arguments, rules.limits)
        finished = time.monotonic()
        return result, finished - started, finished


def session_seed(seed: int | None, task: int, episode: int) -> int:
    """An episode's python_session seed: from the sampling seed when there is one (as its turns' seeds are), else
    drawn; either way its own, so that the episodes of a group draw differently."""
    return episode_seed(seed, task, episode, -1) if seed is not None else random.getrandbits(63)


def _finished_at(f: _InFlight, now: float) -> float:
    """When the call finished (`now` for one past its deadline, or one that raised)."""
    if f.future.done() and f.future.exception() is None:
        return f.future.result()[2]
    return now
