"""Multi-turn tool episodes through the real worker: private Redis, the real reward service's sandbox, the tool model.

One worker run serves the whole module (every task is published at once; each test reads its own groups), and
each record is checked token by token against what the rules say it must hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo.common.queue import RunQueue, connect
from grpo.common.tiny_model import cache_root
from grpo.common.tool_formats import render_chat_result, render_markdown_result, render_tagged_result
from grpo.local.redis_server import RedisServer
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.service import RolloutService
from grpo.rollout.settings import RolloutSettings
from grpo.rollout.worker_wiring import run_worker
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2
from tests.support import tool_model as tm

RUN = "episodes"
LOGPROB_TOLERANCE = 1e-3


def episode_task(task_id: str, prompt: str, *, n: int = 2, max_new_tokens: int = 40, temperature: float = 0.0,
                 seed: int | None = None, probe: queue_pb2.ProbeSpec | None = None,
                 **episode: Any) -> queue_pb2.PromptTask:  # fmt: skip
    spec = {"tools": ["python"], "tool_format": "tagged", "max_turns": 4, "max_tool_calls": 3,
            "max_total_tokens": 160, "max_tool_output_chars": 200, "tool_timeout_s": 5.0, **episode}  # fmt: skip
    sampling = rollout_pb2.SamplingParams(n=n, temperature=temperature, max_new_tokens=max_new_tokens)
    if seed is not None:
        sampling.seed = seed
    return queue_pb2.PromptTask(
        task_id=task_id,
        prompt=rollout_pb2.Prompt(text=prompt),
        checks=reward_pb2.Checks(math=reward_pb2.MathCheck(gold="42")),
        sampling=sampling,
        task_type="math",
        episode=queue_pb2.EpisodeSpec(**spec),
        probe=probe,
    )


TASKS = [
    episode_task("tool", tm.TOOL_PROMPT),
    episode_task("error", tm.ERROR_PROMPT, n=1),
    episode_task("session", tm.STATE_PROMPT, n=2, python_session=True),  # the second call sees the first's x
    episode_task("no_session", tm.STATE_PROMPT, n=1),
    episode_task("unknown", tm.TOOL_PROMPT, n=1, tools=["echo"], max_turns=2),
    episode_task("turns", tm.TOOL_PROMPT, n=1, max_turns=1),
    episode_task("calls", tm.TOOL_PROMPT, n=1, max_tool_calls=0),
    episode_task("total", tm.TOOL_PROMPT, n=1, max_total_tokens=26),  # 21 for the call, 5 of its output
    episode_task("turn_length", tm.TOOL_PROMPT, n=1, max_new_tokens=5),
    episode_task("chat", tm.CHAT_PROMPT, n=1, tool_format="chat", max_new_tokens=80),
    episode_task("markdown", tm.MARKDOWN_PROMPT, n=1, tool_format="markdown", max_new_tokens=48),
    episode_task("seeded", tm.TOOL_PROMPT, n=3, temperature=2.0, seed=7),  # T=2: the sharp tool model still differs
    # Another batch (its rules differ in a way that changes nothing here), where it is again the first task: the
    # seeds of a task's episodes come from (seed, its index in the batch, the episode's index, the turn).
    episode_task("seeded_again", tm.TOOL_PROMPT, n=3, temperature=2.0, seed=7, max_tool_output_chars=201),
    # adaptive group size: 2 episodes of 4 first; greedy, they agree, so the group ends at the probe
    episode_task("probed", tm.TOOL_PROMPT, n=4, probe=queue_pb2.ProbeSpec(size=2, on="reward")),
]


def wait_groups(queue: RunQueue, ids: set[str], timeout: float) -> dict[str, queue_pb2.GroupRecord]:
    found: dict[str, queue_pb2.GroupRecord] = {}
    deadline = time.monotonic() + timeout
    while not ids <= found.keys():
        assert time.monotonic() < deadline, f"groups missing after {timeout}s: {sorted(ids - found.keys())}"
        entries = queue.read_groups("test-trainer", count=50, block_ms=200)
        for e in entries:
            assert e.message is not None and e.message.group_id not in found
            found[e.message.group_id] = e.message
        queue.ack_groups([e.entry_id for e in entries])
    return found


@pytest.fixture(scope="module")
def model_path() -> Path:
    return tm.tool_model_path(cache_root() / "test-models")


@pytest.fixture(scope="module")
def groups(model_path: Path, redis_server: RedisServer, reward_service: Any) -> Iterator[dict[str, Any]]:
    """Every task of TASKS run by one real worker (hf engine) on the tool model; the groups by task id."""
    service = RolloutService(HFEngine(str(model_path), torch_threads=1), str(model_path), "episodes")
    settings = RolloutSettings(
        redis_url=redis_server.url, reward_addr=reward_service.grpc_addr, replica_id="ep1", run=RUN,
        advertise_host="127.0.0.1", grpc_port=0, heartbeat_s=0.2, worker_block_ms=100, reward_timeout_s=10,
        tool_plugins={"echo": "builtins:repr"},
    )  # fmt: skip
    queue = RunQueue(connect(redis_server.url), RUN)
    queue.ensure_groups()
    queue.publish_tasks(TASKS)
    stop = threading.Event()
    thread = threading.Thread(target=run_worker, args=(service, settings, stop), name="episodes-worker")
    thread.start()
    try:
        found = wait_groups(queue, {t.task_id for t in TASKS}, timeout=240)
    finally:
        stop.set()
        thread.join(timeout=60)
        service.close()
    assert queue.stats()["tasks"].unacked == 0
    yield found


@pytest.fixture(scope="module")
def tokenizer(model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def expected(tokenizer: Any, segments: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """(token ids, mask) of an episode written out by hand: each segment encoded on its own; True = the model's."""
    ids: list[int] = []
    mask: list[int] = []
    for text, model in segments:
        seg = [tokenizer.eos_token_id] if text == "EOS" else encode(tokenizer, text)
        ids += seg
        mask += [int(model)] * len(seg)
    return ids, mask


def reference_logprobs(model_path: Path, prompt: list[int], completion: list[int]) -> list[float]:
    """log_softmax of the model's logits (temperature 1) at each completion token, in one forward pass."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    logps = torch.log_softmax(logits.float(), dim=-1)
    return [float(logps[i, t]) for i, t in enumerate(completion)]


def check_episode(sample: Any, ids: list[int], mask: list[int], ref: list[float] | None = None) -> None:
    """The record holds exactly `ids` with `mask`; env tokens have log-prob 0; model tokens the sampler's."""
    c = sample.completion
    assert list(c.token_ids) == ids
    assert list(sample.token_mask) == mask
    assert len(c.logprobs) == len(ids)
    for i, (m, lp) in enumerate(zip(mask, c.logprobs, strict=True)):
        if m == 0:
            assert lp == 0.0, f"environment token {i} has log-prob {lp}"
        elif ref is not None:
            assert abs(lp - ref[i]) < LOGPROB_TOLERANCE, f"token {i}: sampler {lp}, model {ref[i]}"


def test_a_tool_call_runs_in_the_sandbox_and_its_output_is_fed_back(
    groups: dict[str, Any], tokenizer: Any, model_path: Path
) -> None:
    group = groups["tool"]
    assert (group.status, group.error) == ("ok", "")
    assert list(group.prompt_token_ids) == encode(tokenizer, tm.TOOL_PROMPT)
    ids, mask = expected(tokenizer, [("<code>print(6*7)</code>", True), ("<output>42</output>", False),
                                     ("<answer>42</answer>", True), ("EOS", True)])  # fmt: skip
    assert encode(tokenizer, render_tagged_result("42")) == ids[21:37]  # the env tokens, encoded once
    ref = reference_logprobs(model_path, list(group.prompt_token_ids), ids)
    assert len(group.samples) == 2
    for sample in group.samples:
        check_episode(sample, ids, mask, ref)
        assert sample.completion.text == "<code>print(6*7)</code><output>42</output><answer>42</answer>"
        assert sample.completion.finish_reason == "stop"
        e = sample.episode
        assert (e.turns, e.tool_calls, e.tool_errors, e.tool_timeouts, e.malformed_calls, e.end) == (
            2, 1, 0, 0, 0, "answer")  # fmt: skip
        assert 0 < e.tool_s < 5
        # Scored on the final answer: the math check finds 42 there.
        assert sample.components["math"].score == 1.0 and sample.reward == 1.0


def test_a_probe_of_episodes_that_agree_ends_the_group(groups: dict[str, Any], tokenizer: Any) -> None:
    """Adaptive group size over episodes: the probe's 2 episodes get the same reward, so the group is written with
    those 2 (the trainer drops it as zero-variance), each a whole episode with its mask."""
    group = groups["probed"]
    assert (group.status, len(group.samples), group.discarded_samples) == ("ok", 2, 0)
    ids, mask = expected(tokenizer, [("<code>print(6*7)</code>", True), ("<output>42</output>", False),
                                     ("<answer>42</answer>", True), ("EOS", True)])  # fmt: skip
    for sample in group.samples:
        check_episode(sample, ids, mask)
        assert sample.reward == 1.0 and sample.episode.tool_calls == 1


def test_a_python_session_carries_state_from_call_to_call(groups: dict[str, Any], tokenizer: Any) -> None:
    """python_session: the second call prints the x the first set (as a notebook's cells); without it each call is
    a fresh program and the second one's result is a NameError."""
    first, second = (f"<code>{code}</code>" for code in tm.STATE_CALLS)
    ids, mask = expected(tokenizer, [(first, True), ("<output></output>", False), (second, True),
                                     ("<output>42</output>", False), ("<answer>42</answer>", True),
                                     ("EOS", True)])  # fmt: skip
    assert groups["session"].status == "ok" and len(groups["session"].samples) == 2
    for sample in groups["session"].samples:
        check_episode(sample, ids, mask)
        e = sample.episode
        assert (e.turns, e.tool_calls, e.tool_errors, e.end) == (3, 2, 0, "answer")
        assert sample.reward == 1.0
    (alone,) = groups["no_session"].samples
    head, _ = expected(tokenizer, [(first, True), ("<output></output>", False), (second, True),
                                   ("<output>Error: NameError: name 'x' is not defined</output>", False)])  # fmt: skip
    assert list(alone.completion.token_ids[: len(head)]) == head
    assert alone.episode.tool_errors == 1


def test_a_failing_program_is_a_result_the_model_sees(groups: dict[str, Any], tokenizer: Any) -> None:
    (sample,) = groups["error"].samples
    ids, mask = expected(tokenizer, [("<code>print(6/0)</code>", True),
                                     ("<output>Error: ZeroDivisionError: division by zero</output>", False),
                                     ("<answer>none</answer>", True), ("EOS", True)])  # fmt: skip
    check_episode(sample, ids, mask)
    e = sample.episode
    assert (e.turns, e.tool_calls, e.tool_errors, e.tool_timeouts, e.malformed_calls, e.end) == (
        2,
        1,
        1,
        0,
        0,
        "answer",
    )
    assert groups["error"].status == "ok" and sample.components["math"].score == 0.0


def test_an_unknown_tool_is_answered_as_an_error(groups: dict[str, Any], tokenizer: Any) -> None:
    (sample,) = groups["unknown"].samples  # the task offers only "echo"; the model calls python
    call = encode(tokenizer, "<code>print(6*7)</code>")
    error = encode(tokenizer, "<output>Error: unknown tool 'python' (tools: echo)</output>")
    ids = list(sample.completion.token_ids)
    assert ids[: len(call) + len(error)] == call + error
    assert list(sample.token_mask[: len(call) + len(error)]) == [1] * len(call) + [0] * len(error)
    assert set(sample.token_mask[len(call) + len(error) :]) == {1}  # then the model's second (last) turn
    e = sample.episode
    assert (e.turns, e.tool_calls, e.tool_errors, e.malformed_calls) == (2, 1, 1, 1)
    assert e.end in ("answer", "max_turns", "length")


def test_max_turns_and_max_tool_calls_end_the_episode_without_running_the_call(
    groups: dict[str, Any], tokenizer: Any
) -> None:
    for task_id, end in (("turns", "max_turns"), ("calls", "max_tool_calls")):
        (sample,) = groups[task_id].samples
        ids, mask = expected(tokenizer, [("<code>print(6*7)</code>", True)])
        check_episode(sample, ids, mask)
        assert (sample.episode.turns, sample.episode.tool_calls, sample.episode.end) == (1, 0, end)
        assert sample.completion.finish_reason == "stop"
        assert sample.components["math"].score == 0.0  # scored on the last turn: a call, no answer


def test_token_budgets_cut_the_episode(groups: dict[str, Any], tokenizer: Any) -> None:
    (sample,) = groups["total"].samples  # max_total_tokens 26: the call (21) and 5 tokens of its output
    call, output = encode(tokenizer, "<code>print(6*7)</code>"), encode(tokenizer, "<output>42</output>")
    assert len(call) == 21
    check_episode(sample, call + output[:5], [1] * 21 + [0] * 5)
    assert (sample.episode.end, sample.completion.finish_reason, sample.episode.tool_calls) == (
        "max_total_tokens", "length", 1)  # fmt: skip
    (sample,) = groups["turn_length"].samples  # a turn's own max_new_tokens: 5
    check_episode(sample, call[:5], [1] * 5)
    assert (sample.episode.end, sample.completion.finish_reason, sample.episode.turns) == ("length", "length", 1)


def test_chat_format_episode(groups: dict[str, Any], tokenizer: Any) -> None:
    (sample,) = groups["chat"].samples
    tool_message = render_chat_result("42", tokenizer)
    assert tool_message == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"  # the tiny template's
    ids, mask = expected(tokenizer, [(tm.CHAT_CALL, True), ("EOS", True), (tool_message, False),
                                     ("<answer>42</answer>", True), ("EOS", True)])  # fmt: skip
    check_episode(sample, ids, mask)
    assert (sample.episode.turns, sample.episode.tool_calls, sample.episode.end) == (2, 1, "answer")
    assert sample.reward == 1.0


def markdown_episode(tokenizer: Any) -> tuple[list[int], list[int]]:
    return expected(tokenizer, [(tm.MARKDOWN_CALL, True), (render_markdown_result("42"), False),
                                ("<answer>42</answer>", True), ("EOS", True)])  # fmt: skip


def test_markdown_format_episode(groups: dict[str, Any], tokenizer: Any, model_path: Path) -> None:
    """The turn stops at ```output; the last ```python block runs; its result and a closing fence follow."""
    (sample,) = groups["markdown"].samples
    ids, mask = markdown_episode(tokenizer)
    check_episode(sample, ids, mask, reference_logprobs(model_path, list(groups["markdown"].prompt_token_ids), ids))
    assert sample.completion.text == tm.MARKDOWN_CALL + "\n42\n```\n<answer>42</answer>"
    assert (sample.episode.turns, sample.episode.tool_calls, sample.episode.tool_errors) == (2, 1, 0)
    assert sample.reward == 1.0


def test_seeded_episodes_are_reproducible(groups: dict[str, Any]) -> None:
    first, again = groups["seeded"], groups["seeded_again"]
    assert first.status == again.status == "ok"
    assert len({tuple(s.completion.token_ids) for s in first.samples}) > 1  # sampled: the episodes differ
    for a, b in zip(first.samples, again.samples, strict=True):
        assert list(a.completion.token_ids) == list(b.completion.token_ids)
        assert list(a.token_mask) == list(b.token_mask)
        assert len(a.token_mask) == len(a.completion.token_ids) == len(a.completion.logprobs)
        assert all(lp < 0 or m == 0 for lp, m in zip(a.completion.logprobs, a.token_mask, strict=True))


VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


@pytest.mark.vllm
def test_the_same_episodes_through_vllm(
    model_path: Path, redis_server: RedisServer, reward_service: Any, tokenizer: Any, tmp_path: Path
) -> None:
    """A replica process on vLLM's CPU build, its worker on the same Redis and reward service: the same tokens,
    masks and sampler log-probs, continuation by token ids through vLLM."""
    from grpo.local.services import start_rollout

    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/setup_vllm_venv.sh (or `make test`, which runs it)")
    run = "episodes-vllm"
    queue = RunQueue(connect(redis_server.url), run)
    queue.ensure_groups()
    tasks = [t for t in TASKS if t.task_id in ("tool", "error", "chat", "markdown")]
    queue.publish_tasks(tasks)
    args = ("--engine", "vllm", "--model", str(model_path), "--redis-url", redis_server.url, "--reward-addr",
            reward_service.grpc_addr, "--replica-id", "vllm1", "--advertise-host", "127.0.0.1")  # fmt: skip
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "GRPO_ROLLOUT_RUN": run, "GRPO_ROLLOUT_WORKER_BLOCK_MS": "100"}
    started = start_rollout(*args, log_dir=tmp_path, env=env, timeout_s=240, python=str(VLLM_PYTHON))
    try:
        found = wait_groups(queue, {t.task_id for t in tasks}, timeout=240)
    finally:
        started.stop()
    assert all(g.status == "ok" for g in found.values()), {k: g.error for k, g in found.items()}
    tool, error = found["tool"], found["error"]
    ids, mask = expected(tokenizer, [("<code>print(6*7)</code>", True), ("<output>42</output>", False),
                                     ("<answer>42</answer>", True), ("EOS", True)])  # fmt: skip
    ref = reference_logprobs(model_path, list(tool.prompt_token_ids), ids)
    for sample in tool.samples:
        check_episode(sample, ids, mask, ref)
        assert (sample.episode.end, sample.reward) == ("answer", 1.0)
    ids, mask = expected(tokenizer, [("<code>print(6/0)</code>", True),
                                     ("<output>Error: ZeroDivisionError: division by zero</output>", False),
                                     ("<answer>none</answer>", True), ("EOS", True)])  # fmt: skip
    check_episode(error.samples[0], ids, mask)
    ids, mask = expected(tokenizer, [(tm.CHAT_CALL, True), ("EOS", True), (render_chat_result("42", tokenizer), False),
                                     ("<answer>42</answer>", True), ("EOS", True)])  # fmt: skip
    check_episode(found["chat"].samples[0], ids, mask)
    check_episode(found["markdown"].samples[0], *markdown_episode(tokenizer))
