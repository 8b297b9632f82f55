"""The tool demo's cold start and its in-process measures: greedy episodes with the python tool, or without it.

The cold start trains on worked episodes (grpo.demo.tool_task) with the tool results masked out of the loss, until
the greedy held-out accuracy WITH the tool reaches a threshold. Tool calls are answered in-process by
tool_task.run_product (print of integer arithmetic; not the sandbox: no service runs before GRPO). The GRPO phase
and its evaluations run real episodes through the rollout and the reward service's sandbox.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.demo.sft import SftResult, train_until
from grpo.demo.tool_task import RESULT_TOKENS, TAGGED_STOP, TURN_TOKENS, Problem, check_answer, tool_answer


@dataclass(frozen=True)
class Episode:
    text: str  # everything after the prompt: model turns and tool results
    calls: int
    call_errors: int  # results reading `Error: …`
    token_ids: list[int]  # everything after the prompt, as generated and encoded
    token_mask: list[int]  # 1 per model token, 0 per tool-result token


def segment_pair(tokenizer: Any, prompt: str, segments: list[dict[str, str]]) -> Any:
    """An SftPair of a tool episode: segments encoded one by one, EOS after the last; tool segments masked (0)."""
    from grpo.trainer.learner import SftPair

    ids: list[int] = []
    mask: list[int] = []
    for seg in segments:
        part = tokenizer.encode(seg["content"], add_special_tokens=False)
        ids += part
        mask += [0 if seg["role"] == "tool" else 1] * len(part)
    return SftPair(tokenizer.encode(prompt, add_special_tokens=False), [*ids, tokenizer.eos_token_id], [*mask, 1])


def _generate(
    model: Any, tokenizer: Any, rows: list[list[int]], max_new_tokens: int, stop: bool, temperature: float = 0.0
) -> list[list[int]]:
    """Continuations of left-padded rows (greedy, or sampled at `temperature`), each cut after its EOS or the
    tool's stop string."""
    import torch

    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=attention, max_new_tokens=max_new_tokens,
            **({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0
               else {"do_sample": False}),
            eos_token_id=tokenizer.eos_token_id, pad_token_id=pad,
            **({"stop_strings": [TAGGED_STOP], "tokenizer": tokenizer} if stop else {}),
        )  # fmt: skip
    cut = []
    for row in out[:, width:].tolist():
        end = next((i for i, t in enumerate(row) if t in (pad, tokenizer.eos_token_id)), len(row))
        cut.append(row[: end + 1] if end < len(row) and row[end] == tokenizer.eos_token_id else row[:end])
    return cut


def greedy_episodes(
    model: Any,
    tokenizer: Any,
    problems: list[Problem],
    *,
    use_tool: bool = True,
    max_turns: int = 2,
    temperature: float = 0.0,
) -> list[Episode]:
    """Greedy episodes: with the tool, each turn stops at `</code>` and the call is answered (a call in the last
    turn ends the episode unanswered); without it, one turn long enough for a whole episode, so the model writes
    its own `<output>` (what it can do by itself)."""
    rows = [tokenizer.encode(p.prompt, add_special_tokens=False) for p in problems]
    starts = [len(r) for r in rows]
    masks: list[list[int]] = [[] for _ in problems]
    texts, calls, errors = [""] * len(problems), [0] * len(problems), [0] * len(problems)
    active = list(range(len(problems)))
    turns = max_turns if use_tool else 1
    budget = TURN_TOKENS if use_tool else max_turns * TURN_TOKENS + RESULT_TOKENS
    for turn in range(turns):
        if not active:
            break
        outs = _generate(model, tokenizer, [rows[i] for i in active], budget, stop=use_tool, temperature=temperature)
        still = []
        for i, new in zip(active, outs, strict=True):
            said = tokenizer.decode(new, skip_special_tokens=True)
            texts[i] += said
            rows[i] = rows[i] + new
            masks[i] += [1] * len(new)
            answer = tool_answer(said) if use_tool and turn < turns - 1 else None
            if answer is not None:
                calls[i] += 1
                errors[i] += answer.startswith("<output>Error: ")
                texts[i] += answer
                result = tokenizer.encode(answer, add_special_tokens=False)
                rows[i] += result
                masks[i] += [0] * len(result)
                still.append(i)
        active = still
    return [Episode(texts[i], calls[i], errors[i], rows[i][starts[i] :], masks[i]) for i in range(len(problems))]


@dataclass(frozen=True)
class Measure:
    accuracy: float
    calls_per_episode: float
    call_success: float  # share of calls whose result is not an error


def measure(model: Any, tokenizer: Any, problems: list[Problem], *, use_tool: bool = True, chunk: int = 256) -> Measure:
    model.eval()
    episodes: list[Episode] = []
    for i in range(0, len(problems), chunk):
        episodes += greedy_episodes(model, tokenizer, problems[i : i + chunk], use_tool=use_tool)
    model.train()
    hits = sum(check_answer(e.text, p.gold) for e, p in zip(episodes, problems, strict=True))
    calls = sum(e.calls for e in episodes)
    return Measure(hits / max(len(problems), 1), calls / max(len(episodes), 1),
                   (calls - sum(e.call_errors for e in episodes)) / max(calls, 1))  # fmt: skip


def measure_folder(model_dir: Path, problems: list[Problem]) -> dict[str, float]:
    """The in-process measures of a saved model: greedy accuracy with the tool (and its calls) and without it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    with_tool, alone = measure(model, tokenizer, problems), measure(model, tokenizer, problems, use_tool=False)
    return {"accuracy_with_tool": with_tool.accuracy, "accuracy_without_tool": alone.accuracy,
            "calls_per_episode": with_tool.calls_per_episode, "call_success": with_tool.call_success}  # fmt: skip


def run_tool_sft(
    model_dir: Path,
    out_dir: Path,
    train: list[Problem],
    evals: list[Problem],
    *,
    lr: float,
    batch_size: int,
    threshold: float,
    max_steps: int,
    eval_every: int,
    seed: int,
    on_eval: Callable[[dict[str, float]], None] | None = None,
) -> SftResult:
    """SFT on worked tool episodes until the greedy held-out accuracy with the tool ≥ threshold (or max_steps)."""
    from transformers import AutoTokenizer

    from grpo.demo.tool_task import worked_segments

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pairs = [segment_pair(tokenizer, p.prompt, worked_segments(p)) for p in train]
    return train_until(
        model_dir, out_dir, pairs, lambda model: measure(model, tokenizer, evals).accuracy, lr=lr,
        batch_size=batch_size, threshold=threshold, max_steps=max_steps, eval_every=eval_every, seed=seed,
        on_eval=on_eval,
    )  # fmt: skip
