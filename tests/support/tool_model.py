"""A tiny model that uses the python tool: the built-in tiny Qwen2, fine-tuned in seconds on five fixed episodes.

Greedy decoding, with the episode runner feeding tool results back as tokens, gives:

* TOOL_PROMPT (tagged): ``<code>print(6*7)</code>``; after ``<output>42</output>``: ``<answer>42</answer>`` + EOS.
* ERROR_PROMPT (tagged): ``<code>print(6/0)</code>``; after the error result: ``<answer>none</answer>`` + EOS.
* STATE_PROMPT (tagged): ``<code>x = 6*7</code>``; after ``<output></output>``: ``<code>print(x)</code>``; after
  ``<output>42</output>`` (a python session's answer; a fresh program's is a NameError): ``<answer>42</answer>`` + EOS.
* MARKDOWN_PROMPT (markdown): ``MARKDOWN_CALL`` (a ```python block, then ```output); after the result and its closing
  fence: ``<answer>42</answer>`` + EOS.
* CHAT_PROMPT (chat): ``<tool_call>\\n{"name": "python", "arguments": {"code": "print(6*7)"}}\\n</tool_call>`` + EOS;
  after the chat template's tool message: ``<answer>42</answer>`` + EOS.

Each training sequence is built exactly as the runner builds an episode (each segment encoded on its own with
add_special_tokens=False), so the tokens the model samples are the ones it was trained on. Only the model's
segments are in the loss. The folder is cached under `cache_dir`, keyed by a hash of the recipe below.

>>> path = tool_model_path(Path("/tmp/grpo-test-cache"))        # doctest: +SKIP
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from grpo.common.tiny_model import recipe_hash
from grpo.common.tool_formats import (
    QWEN_TOOL_MESSAGE,
    render_chat_result,
    render_markdown_result,
    render_tagged_result,
)
from tests.support.trained_model import fit, trained_once

log = logging.getLogger(__name__)

TOOL_PROMPT = "What is 6 * 7? Use python.\n"
TOOL_CODE, TOOL_RESULT, TOOL_ANSWER = "print(6*7)", "42", "<answer>42</answer>"
ERROR_PROMPT = "What is 6 / 0? Use python.\n"
ERROR_CODE, ERROR_RESULT, ERROR_ANSWER = (
    "print(6/0)",
    "Error: ZeroDivisionError: division by zero",
    "<answer>none</answer>",
)
STATE_PROMPT = "Set x to 6 * 7, then print x. Use python.\n"
STATE_CALLS = ("x = 6*7", "print(x)")
MARKDOWN_PROMPT = "What is 6 * 7? Use a python block.\n"
MARKDOWN_CALL = "```python\nprint(6*7)\n```\n```output"
CHAT_PROMPT = "Compute 6 * 7 with a tool call.\n"
CHAT_CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'

RECIPE: dict[str, Any] = {
    "version": 3,
    "steps": 120,
    "lr": 3e-3,
    "seed": 0,
    "tiny": recipe_hash(),
    "qwen": QWEN_TOOL_MESSAGE,
}


def episodes(tokenizer: Any) -> list[tuple[str, list[tuple[str, bool]]]]:
    """(prompt, [(segment text, trained?)]) of the five training episodes; EOS is added after the last segment
    (and after the chat call, which ends its turn)."""
    eos = tokenizer.eos_token
    return [
        (TOOL_PROMPT, [(f"<code>{TOOL_CODE}</code>", True), (render_tagged_result(TOOL_RESULT), False),
                       (TOOL_ANSWER + eos, True)]),
        (ERROR_PROMPT, [(f"<code>{ERROR_CODE}</code>", True), (render_tagged_result(ERROR_RESULT), False),
                        (ERROR_ANSWER + eos, True)]),
        (STATE_PROMPT, [(f"<code>{STATE_CALLS[0]}</code>", True), (render_tagged_result(""), False),
                        (f"<code>{STATE_CALLS[1]}</code>", True), (render_tagged_result(TOOL_RESULT), False),
                        (TOOL_ANSWER + eos, True)]),
        (MARKDOWN_PROMPT, [(MARKDOWN_CALL, True), (render_markdown_result(TOOL_RESULT), False),
                           (TOOL_ANSWER + eos, True)]),
        (CHAT_PROMPT, [(CHAT_CALL + eos, True), (render_chat_result(TOOL_RESULT, tokenizer), False),
                       (TOOL_ANSWER + eos, True)]),
    ]  # fmt: skip


def _encoded(tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """(token ids, labels) per episode; labels are -100 on the prompt and the environment's segments."""
    rows = []
    for prompt, segments in episodes(tokenizer):
        ids = list(tokenizer.encode(prompt, add_special_tokens=False))
        labels = [-100] * len(ids)
        for text, trained in segments:
            seg = list(tokenizer.encode(text, add_special_tokens=False))
            ids += seg
            labels += seg if trained else [-100] * len(seg)
        rows.append((ids, labels))
    return rows


def _train(source: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(RECIPE["seed"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~10x faster than 2 threads on a shared 2-core machine, for a model this small
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    rows = _encoded(tokenizer)
    loss = fit(model, rows, tokenizer.pad_token_id, RECIPE["lr"], int(RECIPE["steps"]))
    torch.set_num_threads(threads)
    log.info("tool model trained: final loss %.4f", loss)
    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, target / name)


def tool_model_path(cache_dir: Path) -> Path:
    """The tool model's folder (a standard Hugging Face folder, loadable by the hf and vLLM engines), trained
    once into `cache_dir` and reused while RECIPE is unchanged. Safe when several processes race."""
    return trained_once(cache_dir, "tool-model", RECIPE, _train)
