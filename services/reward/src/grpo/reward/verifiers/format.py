"""R1's format reward: `<think>…</think><answer>…</answer>`, tags configurable, prefilled `<think>` handled.

Scores: 1.0 for exactly one non-empty think block followed by exactly one non-empty answer
block and nothing else; 0.5 when that structure is there but a block is empty (an empty
think block must not earn full credit); 0.0 otherwise. Always judges.
"""

from __future__ import annotations

import re

from grpo.reward.verifiers.result import Judgement


def open_think(completion: str, think_tag: str = "think", think_prefilled: bool = False) -> str:
    """The completion with its `<think>` opener restored when the chat template already emitted it."""
    opener, closer = f"<{think_tag}>", f"</{think_tag}>"
    starts_open = completion.lstrip().startswith(opener)
    # A closer without an opener means the template prefilled it even when the caller did not say so.
    if (think_prefilled and not starts_open) or (opener not in completion and closer in completion):
        return opener + completion
    return completion


def split_think_answer(
    completion: str, think_tag: str = "think", answer_tag: str = "answer", think_prefilled: bool = False
) -> tuple[str | None, str | None]:
    """The (think, answer) block contents, each None when absent."""
    text = open_think(completion, think_tag, think_prefilled)
    think, answer = tag_blocks(text, think_tag)[:1], tag_blocks(text, answer_tag)[:1]
    return (text[slice(*think[0])] if think else None, text[slice(*answer[0])] if answer else None)


def tag_blocks(text: str, tag: str) -> list[tuple[int, int]]:
    """The content spans of `<tag>…</tag>` blocks, as re.finditer(r"<tag>(.*?)</tag>", DOTALL) finds them."""
    return delimited(text, f"<{tag}>", f"</{tag}>")


def delimited(text: str, opener: str, closer: str) -> list[tuple[int, int]]:
    """The content spans of `opener`…`closer` blocks, as a lazy regex `opener(.*?)closer` (DOTALL) finds them.

    With str.find, in linear time: that regex rescans to the end from every opener that has no closer after it,
    and a degenerate completion repeating `<think>` took minutes inline in the service's event loop."""
    spans, at = [], 0
    while (start := text.find(opener, at)) >= 0:
        end = text.find(closer, start + len(opener))
        if end < 0:  # no closer after this opener, so none after a later one either
            break
        spans.append((start + len(opener), end))
        at = end + len(closer)
    return spans


def format_reward(
    completion: str, think_tag: str = "think", answer_tag: str = "answer", think_prefilled: bool = False
) -> Judgement:
    """Score the R1 response format of one completion."""
    text = open_think(completion, think_tag, think_prefilled)
    tags = [f"<{think_tag}>", f"</{think_tag}>", f"<{answer_tag}>", f"</{answer_tag}>"]
    # Counted before the regex: with a tag repeated its lazy groups backtrack over every repeat (quadratic, minutes
    # for a degenerate completion, inline in the event loop); with each tag at most once it is linear.
    if any(text.count(tag) > 1 for tag in tags):
        return Judgement(0.0, "ok", "each tag must appear exactly once")
    t, a = re.escape(think_tag), re.escape(answer_tag)
    whole = re.fullmatch(rf"\s*<{t}>(.*?)</{t}>\s*<{a}>(.*?)</{a}>\s*", text, re.DOTALL)
    if whole is None:
        return Judgement(0.0, "ok", f"not <{think_tag}>…</{think_tag}><{answer_tag}>…</{answer_tag}>")
    think, answer = whole.group(1).strip(), whole.group(2).strip()
    if not think:
        return Judgement(0.5, "ok", f"empty <{think_tag}> block")
    if not answer:
        return Judgement(0.5, "ok", f"empty <{answer_tag}> block")
    return Judgement(1.0, "ok")
