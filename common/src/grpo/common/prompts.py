"""How a prompt becomes token ids: one function, so the rollout's samples and the trainer's SFT pairs start from
the same tokens for the same row."""

from __future__ import annotations

from typing import Any


def chat_template_mode(messages: list[dict[str, str]]) -> dict[str, bool]:
    """apply_chat_template's mode: continue a final assistant message (a begun answer, as TRL and vLLM do),
    else open a new assistant turn after the conversation."""
    if messages and messages[-1].get("role") == "assistant":
        return {"continue_final_message": True, "add_generation_prompt": False}
    return {"add_generation_prompt": True}


def encode_prompt(tokenizer: Any, prompt: str | list[dict[str, str]], chat: bool) -> list[int]:
    """Token ids of a text prompt or a message list; messages always go through the chat template, text when
    `chat` (as one user message).

    Plain text keeps the tokenizer's special tokens (Llama's, Gemma's, Mistral's BOS: the model was trained with
    them); templated text does not add them, since the template's text already holds the BOS it wants."""
    if isinstance(prompt, str) and not chat:
        return list(tokenizer.encode(prompt, add_special_tokens=True))
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    text = tokenizer.apply_chat_template(messages, tokenize=False, **chat_template_mode(messages))
    return list(tokenizer.encode(text, add_special_tokens=False))
