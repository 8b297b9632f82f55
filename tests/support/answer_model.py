"""A tiny model that answers easy sums, sometimes wrongly: the built-in tiny Qwen2 fine-tuned in seconds.

For each prompt of PROBLEMS (``What is a + b?``) it was trained on four responses, so sampling at temperature 1 gives
roughly: ``<answer>s</answer>`` half the time, ``<think>a + b = s</think><answer>s</answer>`` a quarter, and the
wrong ``<answer>s+1</answer>`` a quarter. A group of samples therefore holds right and wrong answers, equal answers
(duplicates) and right answers of two lengths: what rejection sampling's filters sort out. Cached under `cache_dir`,
keyed by a hash of the recipe.

>>> path = answer_model_path(Path("/tmp/grpo-test-cache"))        # doctest: +SKIP
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from grpo.common.tiny_model import recipe_hash
from tests.support.trained_model import fit, trained_once

log = logging.getLogger(__name__)

PROBLEMS = ((2, 3), (4, 1), (3, 3), (5, 2), (1, 6), (2, 2), (7, 1), (4, 4))
RECIPE: dict[str, Any] = {"version": 1, "steps": 120, "lr": 3e-3, "seed": 0, "tiny": recipe_hash(),
                          "problems": PROBLEMS}  # fmt: skip


def prompt(a: int, b: int) -> str:
    return f"What is {a} + {b}?\n"


def responses(a: int, b: int) -> list[str]:
    """The trained responses of one prompt; the short right one twice (a half of the probability mass)."""
    s = a + b
    short, long, wrong = (
        f"<answer>{s}</answer>",
        f"<think>{a} + {b} = {s}</think><answer>{s}</answer>",
        f"<answer>{s + 1}</answer>",
    )
    return [short, short, long, wrong]


def rows(n: int = len(PROBLEMS)) -> list[dict[str, Any]]:
    """GRPO rows of the first `n` problems (id, prompt, gold)."""
    return [{"id": f"p{a}{b}", "prompt": prompt(a, b), "gold": str(a + b)} for a, b in PROBLEMS[:n]]


def _train(source: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(RECIPE["seed"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # faster than 2 threads on a shared 2-core machine, for a model this small
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    encoded = []
    for a, b in PROBLEMS:
        p = list(tokenizer.encode(prompt(a, b), add_special_tokens=False))
        for response in responses(a, b):
            r = [*tokenizer.encode(response, add_special_tokens=False), tokenizer.eos_token_id]
            encoded.append((p + r, [-100] * len(p) + r))
    loss = fit(model, encoded, tokenizer.pad_token_id, RECIPE["lr"], int(RECIPE["steps"]))
    torch.set_num_threads(threads)
    log.info("answer model trained: final loss %.4f", loss)
    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "generation_config.json"):  # fmt: skip
        if (source / name).is_file():
            shutil.copy(source / name, target / name)


def answer_model_path(cache_dir: Path) -> Path:
    """The answer model's folder (a standard Hugging Face folder), trained once into `cache_dir` and reused while
    RECIPE is unchanged. Safe when several processes race."""
    return trained_once(cache_dir, "answer-model", RECIPE, _train)
