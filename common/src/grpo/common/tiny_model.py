"""The built-in tiny Qwen2 model and its locally trained tokenizer: no downloads, cached on disk.

The artifact is a standard Hugging Face folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json), so transformers, vLLM
and the trainer all load the same files. torch and transformers are imported inside
the functions: `grpo.common` stays importable without them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Bump when the recipe (corpus, tokenizer pipeline, model init) changes: it is part of the cache key.
RECIPE_VERSION = 1
TINY_NAMES = (None, "", "tiny")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Single tokens, but not "special": decoders that skip special tokens (vLLM's default) keep them.
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")

# Qwen's chat format, without the default system prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

DEFAULTS: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "seed": 0,
}

_NAMES = ("Tom", "Ana", "Li", "Sara", "Omar", "Mia", "Ivan", "Zoe", "Ben", "Kim")
_ITEMS = ("apples", "books", "coins", "pens", "cards", "eggs", "stones", "cups", "toys", "shells")
_OPS = (("+", "gets", "more"), ("-", "gives away", "of them"), ("*", "has", "boxes of"))


def _problem(rng: random.Random) -> str:
    """One synthetic arithmetic problem with a worked `<think>`/`<answer>` reply."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    op, verb, tail = rng.choice(_OPS)
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    question = rng.choice(
        (
            f"What is {a} {op} {b}?",
            f"Compute {a} {op} {b}.",
            f"{name} has {a} {item} and {verb} {b} {tail}. How many {item} are there now?",
            f"Solve: {a} {op} {b} = ?",
        )
    )
    return f"{question} <think>{a} {op} {b} = {result}. The answer is {result}.</think><answer>{result}</answer>"


def training_corpus(size: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    extra = ["Please reason step by step, and put the final answer in <answer></answer> tags.", "user", "assistant"]
    return extra + [_problem(rng) for _ in range(size)]


def build_tokenizer(vocab_size: int = 512, seed: int = 0) -> Any:
    """A byte-level BPE trained on the synthetic corpus, digits always split one by one."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            # Arithmetic needs one token per digit, as Qwen2 does.
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(seed=seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=DEFAULTS["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def recipe(**overrides: Any) -> dict[str, Any]:
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown tiny-model settings {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **overrides, "recipe_version": RECIPE_VERSION}


def recipe_hash(**overrides: Any) -> str:
    return hashlib.sha256(json.dumps(recipe(**overrides), sort_keys=True).encode()).hexdigest()[:12]


def cache_root() -> Path:
    base = os.environ.get("GRPO_CACHE_DIR")
    return Path(base) if base else Path.home() / ".cache" / "grpo"


def default_model_path(**overrides: Any) -> Path:
    return cache_root() / "models" / f"tiny-qwen2-{recipe_hash(**overrides)}"


def _is_complete(path: Path) -> bool:
    return all((path / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def save_tiny_model(path: Path, **overrides: Any) -> None:
    """Build the tokenizer and a randomly initialised Qwen2 model (seeded) and save both to `path`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    r = recipe(**overrides)
    tokenizer = build_tokenizer(r["vocab_size"], r["seed"])
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=r["hidden_size"],
        intermediate_size=r["intermediate_size"],
        num_hidden_layers=r["num_hidden_layers"],
        num_attention_heads=r["num_attention_heads"],
        num_key_value_heads=r["num_key_value_heads"],
        max_position_embeddings=r["max_position_embeddings"],
        tie_word_embeddings=r["tie_word_embeddings"],
        bos_token_id=eos[1],
        eos_token_id=eos[0],
        pad_token_id=eos[1],
        dtype="float32",
    )
    torch.manual_seed(r["seed"])
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[1], bos_token_id=eos[1])
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    # transformers 5 writes chat_template.jinja; older loaders read the template from tokenizer_config.json.
    config_file = path / "tokenizer_config.json"
    tok_config = json.loads(config_file.read_text())
    tok_config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(tok_config, indent=2))
    (path / "grpo_recipe.json").write_text(json.dumps(r, sort_keys=True, indent=1))


def ensure_tiny_model(path: Path | str | None = None, **overrides: Any) -> Path:
    """The tiny model's folder, built first if missing; safe when several processes race."""
    target = Path(path) if path is not None else default_model_path(**overrides)
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_tiny_model(tmp, **overrides)
        try:
            # rename is atomic: a reader sees either nothing or the whole folder.
            tmp.rename(target)
            log.info("built tiny model at %s", target)
        except OSError:
            if not _is_complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(name_or_path: str | Path | None) -> str:
    """The tiny model for None/"tiny", an existing local path, else the hub id unchanged."""
    if name_or_path in TINY_NAMES:
        return str(ensure_tiny_model())
    local = Path(name_or_path).expanduser()  # type: ignore[arg-type]
    if local.exists():
        return str(local.resolve())
    return str(name_or_path)


class ModelNotFound(ValueError):
    """`--model` names neither a model folder nor a hub id we can read; the message says which and why."""


# huggingface_hub's repo-id rule: `name` or `owner/name`, letters, digits, `-`, `_`, `.`.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


def check_model(name_or_path: str | Path | None) -> str:
    """`resolve_model`, checked before a service starts anything: a wrong `--model` is one clear line.

    Loading a missing model otherwise fails after the servers are up and the data is read, in a long
    transformers traceback ("Repo id must be in the form ..."). A hub id is checked by fetching its
    config.json (from the local cache when offline), the first file every loader reads anyway.
    """
    resolved = resolve_model(name_or_path)
    local = Path(resolved)
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelNotFound(f"{local} has no config.json: not a Hugging Face model folder")
        return resolved
    if local.exists():
        raise ModelNotFound(f"{local} is a file; give the model's folder (the one holding config.json)")
    name = str(name_or_path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or not _HUB_ID.fullmatch(name):
        raise ModelNotFound(f"no such model folder or hub id: {name!r} (a hub id is `owner/name`)")
    try:
        from huggingface_hub import hf_hub_download

        hf_hub_download(name, "config.json")
    except Exception as exc:  # offline, unknown repo, gated, no network: all mean "cannot load it"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFound(
            f"{name!r} is not a local folder, and its config.json could not be had from the hub ({reason})"
        ) from None
    return resolved
