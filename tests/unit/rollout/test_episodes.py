"""The episode runner in-process on the hf engine and the tool model: plug-in tools (results, exceptions,
deadlines), the rules' checks, weights changing between turns, a stop between turns, tool calls overlapping other
episodes' turns, and seeded episodes that do not depend on the schedule."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from grpo.common.tiny_model import cache_root
from grpo.common.tool_formats import ToolCall
from grpo.rollout.engines.base import PromptOutput, SamplingParams
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.episodes.runner import EpisodeRunner, Interrupted, WeightsChanged
from grpo.rollout.episodes.spec import Episode, Rules, episode_rules, episode_seed
from grpo.rollout.episodes.tools import PluginTool, ToolInfrastructureError, ToolResult, load_tools
from grpo.rollout.service import RolloutService
from grpo.rollout.settings import RolloutSettings
from grpo.v1 import queue_pb2
from tests.support import tool_model as tm

GREEDY = SamplingParams(n=2, temperature=0.0, max_new_tokens=40)


@pytest.fixture(scope="module")
def service() -> Iterator[RolloutService]:
    path = tm.tool_model_path(cache_root() / "test-models")
    svc = RolloutService(HFEngine(str(path), torch_threads=1), str(path), "unit")
    yield svc
    svc.close()


def rules(tools: tuple[str, ...] = ("python",), **changes: Any) -> Rules:
    spec = queue_pb2.EpisodeSpec(tools=list(tools), tool_format="tagged", max_turns=3, max_tool_calls=2,
                                 max_total_tokens=120, tool_timeout_s=0.5)  # fmt: skip
    for name, value in changes.items():
        setattr(spec, name, value)
    return episode_rules(spec, GREEDY.max_new_tokens, set(tools))


def runner(service: RolloutService, fn: Any, **kwargs: Any) -> EpisodeRunner:
    """A runner whose `python` tool is the plug-in `fn` (no reward service in unit tests)."""
    return EpisodeRunner(lambda p, s: service.generate(p, s), service.tokenizer, {"python": PluginTool("python", fn)},
                         **kwargs)  # fmt: skip


def prompt(service: RolloutService) -> list[list[int]]:
    return [service.tokenizer.encode(tm.TOOL_PROMPT, add_special_tokens=False)]


def env_tokens(service: RolloutService, episode: Any) -> list[int]:
    return [t for t, m in zip(episode.token_ids, episode.token_mask, strict=True) if m == 0]


def test_a_plug_ins_result_is_fed_back_as_tokens(service: RolloutService) -> None:
    seen: list[dict[str, Any]] = []

    def answer(args: dict[str, Any]) -> str:
        seen.append(args)
        return "42"

    r = runner(service, answer)
    batch = r.run(prompt(service), rules(), GREEDY)
    r.close()
    assert seen == [{"code": "print(6*7)"}] * 2
    for episode in batch.episodes[0]:
        assert env_tokens(service, episode) == service.tokenizer.encode("<output>42</output>", add_special_tokens=False)
        assert episode.answer == "<answer>42</answer>" and episode.stats.end == "answer"
        assert episode.text == "<code>print(6*7)</code><output>42</output><answer>42</answer>"
    assert (batch.weight_version, batch.weight_checksum) == (service.version, service.checksum)


def test_a_plug_ins_exception_and_its_deadline_are_errors_the_model_sees(service: RolloutService) -> None:
    def boom(args: dict[str, Any]) -> str:
        raise ValueError("no such variable")

    def slow(args: dict[str, Any]) -> str:
        time.sleep(2.0)
        return "42"

    for fn, text, timeouts in (
        (boom, "Error: ValueError: no such variable", 0),
        (slow, "Error: timed out after 0.5s", 1),
    ):
        r = runner(service, fn)
        (episode, _) = r.run(prompt(service), rules(), GREEDY).episodes[0]
        r.close()
        wanted = service.tokenizer.encode(f"<output>{text}</output>", add_special_tokens=False)
        assert env_tokens(service, episode)[: len(wanted)] == wanted
        assert episode.stats.tool_errors >= 1 and (episode.stats.tool_timeouts > 0) == bool(timeouts)
        assert episode.stats.malformed_calls == 0


def test_weights_that_change_between_turns_restart_the_batch(service: RolloutService) -> None:
    weights = {name: tensor.clone() for name, tensor in service.engine.weights().items()}  # type: ignore[attr-defined]
    calls = {"n": 0}

    def generate(prompts: list[list[int]], params: SamplingParams) -> tuple[list[PromptOutput], int, str]:
        out = service.generate(prompts, params)
        calls["n"] += 1
        if calls["n"] == 1:  # a push lands between turn 1 and turn 2
            service.load_weights(service.version + 1, f"v{service.version + 1}", weights)
        return out

    tools = {"python": PluginTool("python", lambda args: "42")}
    with pytest.raises(WeightsChanged, match="weights went from"):
        EpisodeRunner(generate, service.tokenizer, tools, restarts=0).run(prompt(service), rules(), GREEDY)
    calls["n"] = 0
    batch = EpisodeRunner(generate, service.tokenizer, tools, restarts=1).run(prompt(service), rules(), GREEDY)
    assert batch.weight_version == service.version  # the second start, all under the new weights
    assert all(e.stats.end == "answer" for e in batch.episodes[0])


def test_a_stop_between_turns_abandons_the_batch(service: RolloutService) -> None:
    r = runner(service, lambda args: "42", stopping=lambda: True)
    with pytest.raises(Interrupted):
        r.run(prompt(service), rules(), GREEDY)
    r.close()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tool_format": "xml"}, "episode.tool_format 'xml' is not one of tagged, chat"),
        ({"max_turns": 0}, "episode.max_turns must be >= 1"),
        ({"max_tool_calls": -1}, "must be >= 0"),
        ({"tool_timeout_s": -1.0}, "tool_timeout_s and tool_memory_mb must be >= 0"),
        ({"tool_memory_mb": 8}, "episode.tool_memory_mb 8 is under the sandbox's 16 MB"),
        ({"python_session": True, "tools": ["echo"]}, "episode.python_session needs the 'python' tool"),
    ],
)
def test_bad_rules_name_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rules(**changes)


def test_rules_defaults_and_unknown_tools() -> None:
    spec = queue_pb2.EpisodeSpec(tools=["python"], max_turns=3)
    r = episode_rules(spec, 50, {"python"})
    assert (r.tool_format, r.max_total_tokens, r.limits.timeout_s, r.stops) == ("tagged", 150, 5.0, ("</code>",))
    assert episode_rules(queue_pb2.EpisodeSpec(max_turns=1, tool_format="chat"), 8, set()).stops == ()
    with pytest.raises(ValueError, match=r"episode.tools names \['calc'\], which this replica does not have"):
        episode_rules(queue_pb2.EpisodeSpec(tools=["calc"], max_turns=2), 8, {"python"})


def test_episode_seeds_differ_by_every_part_and_repeat() -> None:
    seeds = {episode_seed(1, t, e, turn) for t in range(3) for e in range(3) for turn in range(3)}
    assert len(seeds) == 27 and all(0 <= s < 2**63 for s in seeds)
    assert episode_seed(1, 2, 0, 1) == episode_seed(1, 2, 0, 1) != episode_seed(2, 2, 0, 1)


def test_tool_plugins_are_checked(tmp_path: Path) -> None:
    tools = load_tools({"echo": "builtins:repr", "notes": "tests.support.notes_tool:notes"}, execute=None)
    assert tools["echo"]({"x": 1}, rules().limits).text == "{'x': 1}"
    notes, state = tools["notes"], {}
    assert isinstance(notes, PluginTool) and notes.stateful and not cast(PluginTool, tools["echo"]).stateful
    assert notes({"write": "a"}, rules().limits, state).text == "noted (1)"
    assert notes({"read": True}, rules().limits, state).text == "a"
    assert notes({"read": True}, rules().limits, {}).text == "no notes"  # another episode's state
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        load_tools({"x": "no_such_module:fn"}, None)
    with pytest.raises(ValueError, match="'builtins' has no callable 'nothing'"):
        load_tools({"x": "builtins:nothing"}, None)
    with pytest.raises(ValueError, match="'python' is the built-in sandbox tool"):
        RolloutSettings(tool_plugins={"python": "builtins:repr"})
    with pytest.raises(ValueError, match=r"must look like 'package\.module:function'"):
        RolloutSettings(tool_plugins={"calc": "calc"})


def test_an_episode_is_scored_on_its_last_turn_and_recorded_with_its_mask(service: RolloutService) -> None:
    from grpo.rollout.records import Generated, group_records, score_items
    from grpo.v1 import reward_pb2, rollout_pb2

    r = runner(service, lambda args: "42")
    batch = r.run(prompt(service), rules(), GREEDY)
    r.close()
    task = queue_pb2.PromptTask(task_id="t", prompt=rollout_pb2.Prompt(text=tm.TOOL_PROMPT),
                                checks=reward_pb2.Checks(overlong=reward_pb2.OverlongCheck(max_tokens=100)),
                                episode=queue_pb2.EpisodeSpec(max_turns=3))  # fmt: skip
    decode = r.decode
    generated = Generated(prompt(service), batch.episodes, batch.weight_version, batch.weight_checksum, decode)
    items = score_items([task], generated)
    episode = batch.episodes[0][0]
    assert [i.completion for i in items] == ["<answer>42</answer>"] * 2  # the final answer, not the tool output
    assert items[0].checks.overlong.completion_tokens == len(episode.token_ids)  # every token, the env's too
    # The reward's step on the answer's "42" lands on the answer's tokens, after the call and its output.
    result = reward_pb2.ScoreResult(id="t/0", reward=1.0, steps=[reward_pb2.StepScore(start=8, end=10, score=1.0)])
    (group,) = group_records([task], generated, [result, reward_pb2.ScoreResult(id="t/1", reward=1.0)],
                             replica_id="x", generate_s=1.0, score_s=0.1)  # fmt: skip
    sample = group.samples[0]
    assert list(sample.token_mask) == episode.token_mask and sample.episode == episode.stats
    assert list(sample.completion.token_ids) == episode.token_ids and sample.completion.text == episode.text
    (end,) = sample.step_token_ends
    assert episode.answer_start < end <= len(episode.token_ids)
    assert decode(episode.token_ids[episode.answer_start : end]) == "<answer>42"


@pytest.mark.parametrize(
    ("limit", "end", "text"),
    [
        ({"max_turns": 1}, "max_turns", "<code>print(6*7)</code>"),
        ({"max_tool_calls": 0}, "max_tool_calls", "<code>print(6*7)</code>"),
        ({"max_total_tokens": 10}, "max_total_tokens", "<code>print"),  # the call cut off by the budget
    ],
)
def test_an_episode_a_limit_ends_on_a_call_is_scored_without_the_call(
    service: RolloutService, limit: dict[str, int], end: str, text: str
) -> None:
    """The tool model's first turn is `<code>print(6*7)</code>`; a limit ends the episode there, the call not run.
    The model gave no answer, so the code is not scored as one (a call's literal number was paid as the answer)."""
    from grpo.rollout.records import Generated, score_items
    from grpo.v1 import rollout_pb2

    r = runner(service, lambda args: "42")
    batch = r.run(prompt(service), rules(**limit), GREEDY)
    r.close()
    for episode in batch.episodes[0]:
        assert episode.stats.end == end and episode.stats.tool_calls == 0
        assert episode.text == text  # recorded whole, as the model wrote it
        assert episode.answer == ""
    task = queue_pb2.PromptTask(task_id="t", prompt=rollout_pb2.Prompt(text=tm.TOOL_PROMPT))
    generated = Generated(prompt(service), batch.episodes, batch.weight_version, batch.weight_checksum, r.decode)
    assert [i.completion for i in score_items([task], generated)] == ["", ""]


class CountingGenerate:
    """service.generate, recording how many episodes each engine call held; `on_call(k)` runs as call k starts."""

    def __init__(self, service: RolloutService, on_call: Any = None) -> None:
        self.service, self.on_call = service, on_call
        self.sizes: list[int] = []

    def __call__(self, prompts: list[list[int]], params: SamplingParams) -> tuple[list[PromptOutput], int, str]:
        self.sizes.append(len(prompts))
        if self.on_call is not None:
            self.on_call(len(self.sizes))
        return self.service.generate(prompts, params)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_running_tool_call_does_not_hold_up_the_other_episodes(service: RolloutService, overlap: bool) -> None:
    """The first tool call blocks until a second engine call has started: overlapping, the other episode's answer
    turn is that call, made while the first tool still runs; synchronous, no engine call starts before every
    call has answered, so the blocked call is never released (the test's reason to hold both schedules)."""
    second_call = threading.Event()
    arrivals: list[bool] = []  # per tool call in arrival order: released by the second engine call
    lock = threading.Lock()

    def tool(args: dict[str, Any]) -> str:
        with lock:
            first = not arrivals
            arrivals.append(False)
        if first:
            arrivals[0] = second_call.wait(timeout=1.5)
        return "42"

    generate = CountingGenerate(service, lambda k: second_call.set() if k == 2 else None)
    r = EpisodeRunner(generate, service.tokenizer, {"python": PluginTool("python", tool)}, overlap=overlap)
    batch = r.run(prompt(service), rules(tool_timeout_s=5.0), GREEDY)
    r.close()
    assert all(e.stats.end == "answer" and e.answer == "<answer>42</answer>" for e in batch.episodes[0])
    assert len(arrivals) == 2
    if overlap:
        assert arrivals[0], "the blocked tool call was not released: the engine waited for it"
        assert generate.sizes == [2, 1, 1]  # both calls; one episode's answer turn; the other's
    else:
        assert not arrivals[0] and generate.sizes == [2, 2]


def test_results_that_finish_close_together_share_one_engine_call(service: RolloutService) -> None:
    """The second call finishes 20 ms after the first, well within one engine call's time: waiting for it costs
    less than it would wait for an engine call started without it, so both answer turns go in one call. The window is
    four engine calls here, not the default one: on a loaded host (CI, 3 test workers on 2 cores) the 20 ms sleep once
    woke after a whole engine call's time, and the sizes came out [2, 1, 1]."""
    arrivals = iter([0.0, 0.02])
    lock = threading.Lock()

    def tool(args: dict[str, Any]) -> str:
        with lock:
            delay = next(arrivals)
        time.sleep(delay)
        return "42"

    generate = CountingGenerate(service)
    r = EpisodeRunner(generate, service.tokenizer, {"python": PluginTool("python", tool)}, gather=4.0)
    batch = r.run(prompt(service), rules(tool_timeout_s=5.0), GREEDY)
    r.close()
    assert all(e.stats.end == "answer" for e in batch.episodes[0])
    assert generate.sizes == [2, 2]  # the first turn's engine call takes well over 20 ms (21 tokens)


class BrokenTool:
    """The first call fails as infrastructure; the second blocks until released (a call still running)."""

    def __init__(self) -> None:
        self.release, self.calls, self.lock = threading.Event(), 0, threading.Lock()

    def __call__(self, arguments: Any, limits: Any) -> ToolResult:
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            raise ToolInfrastructureError("python tool: reward service: unavailable")
        self.release.wait(timeout=10.0)
        return ToolResult("42")


@pytest.mark.parametrize("overlap", [True, False])
def test_an_infrastructure_failure_fails_the_batch_without_waiting_for_other_calls(
    service: RolloutService, overlap: bool
) -> None:
    tool = BrokenTool()
    r = EpisodeRunner(lambda p, s: service.generate(p, s), service.tokenizer, {"python": tool}, overlap=overlap)
    started = time.monotonic()
    try:
        with pytest.raises(ToolInfrastructureError, match="reward service: unavailable"):
            r.run(prompt(service), rules(tool_timeout_s=8.0), GREEDY)
        assert time.monotonic() - started < 5.0  # not held up by the call still running (released at 10 s)
    finally:
        tool.release.set()
        r.close()


def seeded_episodes(service: RolloutService, delays: list[float], overlap: bool) -> tuple[list[Any], list[int]]:
    """Four seeded episodes (T=1) of two tasks; the k-th tool call to arrive sleeps delays[k] (so the episodes
    come back in another order and share engine calls with others); the episodes and the engine calls' sizes."""
    arrivals = iter(delays)
    lock = threading.Lock()

    def tool(args: dict[str, Any]) -> str:
        with lock:
            delay = next(arrivals, 0.0)
        time.sleep(delay)
        return "42"

    generate = CountingGenerate(service)
    r = EpisodeRunner(generate, service.tokenizer, {"python": PluginTool("python", tool)}, overlap=overlap)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=40, seed=11)
    batch = r.run(prompt(service) * 2, rules(tool_timeout_s=5.0), params)
    r.close()
    return [e for group in batch.episodes for e in group], generate.sizes


def test_seeded_episodes_do_not_depend_on_the_schedule(service: RolloutService) -> None:
    reference, sync_sizes = seeded_episodes(service, [], overlap=False)
    assert len({tuple(e.token_ids) for e in reference}) > 1  # sampled: the episodes differ
    assert sum(e.stats.tool_calls for e in reference) >= 2
    sizes = {tuple(sync_sizes)}
    for delays in ([0.0, 0.3, 0.6, 0.9, 0.0, 0.0, 0.0, 0.0], [0.9, 0.6, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0]):
        episodes, got = seeded_episodes(service, delays, overlap=True)
        sizes.add(tuple(got))
        for a, b in zip(reference, episodes, strict=True):
            assert (a.task, a.index) == (b.task, b.index)
            assert a.token_ids == b.token_ids and a.token_mask == b.token_mask and _stats(a) == _stats(b)
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)  # padding differs with the cohort
    assert len(sizes) > 1, f"every schedule batched the engine calls alike: {sizes}"


def _stats(e: Any) -> dict[str, Any]:
    """EpisodeStats but the tool time (which the delays change)."""
    return {f.name: getattr(e.stats, f.name) for f in e.stats.DESCRIPTOR.fields if f.name != "tool_s"}


def test_the_engine_seeds_each_prompt_apart_from_its_batch(service: RolloutService) -> None:
    """What the runner's seeds rely on: a prompt with seed s draws the same tokens alone, first or last, beside
    shorter or longer prompts (another padding)."""
    p = prompt(service)[0]
    longer, shorter = p + service.tokenizer.encode("<code>", add_special_tokens=False), p[:5]
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=30, seeds=(5,))
    (alone,), _, _ = service.generate([p], params)
    for batch, at in (([longer, p], 1), ([p, shorter, longer], 0), ([shorter, longer, p], 2)):
        seeds = tuple(5 if i == at else 100 + i for i in range(len(batch)))
        outputs, _, _ = service.generate(batch, replace(params, seeds=seeds))
        assert outputs[at].samples[0].token_ids == alone.samples[0].token_ids
        assert outputs[at].samples[0].logprobs == pytest.approx(alone.samples[0].logprobs, abs=1e-4)


def state_prompt(service: RolloutService) -> list[list[int]]:
    return [service.tokenizer.encode(tm.STATE_PROMPT, add_special_tokens=False)]


def test_a_stateful_plug_in_keeps_one_state_per_episode(service: RolloutService) -> None:
    """A plug-in with a `state` parameter gets one dict per episode, the same at each of its calls: the tool model's
    two-call episode (x = 6*7, then print(x)) reads in its second call what its first stored, and no other
    episode's state."""
    seen: list[tuple[str, int]] = []

    def notebook(args: dict[str, Any], state: dict[str, Any]) -> str:
        seen.append((args["code"], id(state)))
        if args["code"] == "x = 6*7":
            state["x"] = 42
            return ""
        return str(state.get("x", "NameError: name 'x' is not defined"))

    r = runner(service, notebook)
    batch = r.run(state_prompt(service), rules(), GREEDY)
    r.close()
    result = [t for text in ("<output></output>", "<output>42</output>")
              for t in service.tokenizer.encode(text, add_special_tokens=False)]  # fmt: skip
    for episode in batch.episodes[0]:
        assert env_tokens(service, episode) == result
        assert episode.answer == "<answer>42</answer>" and episode.stats.tool_calls == 2
    assert [code for code, _ in seen].count("print(x)") == 2
    states = {}
    for code, state in seen:
        states.setdefault(state, []).append(code)
    assert sorted(states.values()) == [["x = 6*7", "print(x)"]] * 2  # two episodes, a state each, both calls in it


def test_a_stateful_plug_in_past_its_deadline_loses_its_state(service: RolloutService) -> None:
    """A call past tool_timeout_s runs on in its thread and may still change the state: the episode's later calls
    to that tool are answered with an error saying so, never with a state that may be half-written. (The tool model
    never calls again after an error, so the runner's own submit and collect drive the two calls here.)"""
    release = threading.Event()

    def slow_first(args: dict[str, Any], state: dict[str, Any]) -> str:
        if args["code"] == "slow":
            release.wait(10)
            state["x"] = "half-written"
        return str(state.get("x", "fresh"))

    r = runner(service, slow_first)
    episode, limits = Episode(0, 0), rules(tool_timeout_s=0.3)
    in_flight = [r._submit(episode, ToolCall("python", {"code": "slow"}), limits)]
    r._collect(in_flight, limits)  # past the deadline: answered as timed out while the call runs on
    release.set()
    assert episode.stats.tool_timeouts == 1 and not in_flight
    result = r._submit(episode, ToolCall("python", {"code": "print(x)"}), limits).future.result()[0]
    assert result.error and result.text == "Error: python's state is lost: an earlier call ran past 0.3s"
    fresh = r._submit(Episode(0, 1), ToolCall("python", {"code": "print(x)"}), limits).future.result()[0]
    r.close()
    assert fresh.text == "fresh" and not fresh.error  # another episode's state


def test_a_plug_ins_deadline_counts_from_when_its_call_starts(service: RolloutService) -> None:
    """Four episodes' 0.3 s calls on one pool thread under a 0.5 s limit: each waits for the ones before it, and
    none is timed out for that wait (a stateful plug-in would lose its state to it)."""

    def slow(args: dict[str, Any], state: dict[str, Any]) -> str:
        time.sleep(0.3)
        return "done"

    r = runner(service, slow, concurrency=1)
    limits = rules(tool_timeout_s=0.5)
    episodes = [Episode(0, i) for i in range(4)]
    in_flight = [r._submit(e, ToolCall("python", {"code": "x"}), limits) for e in episodes]
    while in_flight:
        r._collect(in_flight, limits)
    r.close()
    assert [e.stats.tool_timeouts for e in episodes] == [0, 0, 0, 0]
    assert all(e.token_ids for e in episodes)
