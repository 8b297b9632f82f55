"""The demo's model folder: a 0.8M-parameter Qwen2 and a 103-token character tokenizer, built locally.

The tokenizer has one token per character of printable ASCII (space to `~`) plus newline and tab, the four
R1 tags as single tokens, and two specials; decoding reproduces such text exactly. A character outside that
set has no token (the trainer refuses data holding one, naming it). Saved as a standard Hugging Face folder:
`AutoTokenizer` and `AutoModelForCausalLM.from_pretrained(path)` (and the rollout service's `--model PATH`)
load it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PAD, EOS = "<|endoftext|>", "<|im_end|>"
SPECIALS = (PAD, EOS)
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# The addition task's characters keep the ids (and the seeded initial embeddings) they had when the demo was
# calibrated (docs/demo.md); the rest of printable ASCII, newline and tab follow, so any short text task fits.
TASK_CHARS = (*"0123456789", "+", "-", "=", " ")
CHARS = (*TASK_CHARS, *(c for c in map(chr, range(0x20, 0x7F)) if c not in TASK_CHARS), "\n", "\t")
TASK_VOCAB_SIZE = len(SPECIALS) + len(TAGS) + len(TASK_CHARS)
VOCAB_SIZE = len(SPECIALS) + len(TAGS) + len(CHARS)
# Qwen2's pre-tokenizer split (transformers' tokenization_qwen2.PRETOKENIZE_REGEX).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

ARCH: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}


def recipe(seed: int = 0, **arch: Any) -> dict[str, Any]:
    """What the base model folder depends on: seed, architecture and vocabulary (keys the demo's SFT cache)."""
    return {"seed": seed, **ARCH, **arch, "vocabulary": [*SPECIALS, *TAGS, *CHARS]}


def _byte_level(char: str) -> str:
    """The byte-level alphabet's stand-in for one ASCII character (space → `Ġ`), as Qwen2's BPE sees it."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(char)[0][0]


def build_tokenizer(max_length: int = ARCH["max_position_embeddings"]) -> Any:
    """The character tokenizer as a PreTrainedTokenizerFast (tags and specials are single tokens).

    transformers 5 always loads a qwen2 folder's tokenizer with `Qwen2Tokenizer`, which rebuilds
    the pipeline as byte-level BPE with Qwen2's pre-tokenizer and keeps only vocab and merges.
    So we build exactly that pipeline with a one-character-per-token vocabulary and no merges:
    the same ids whichever class (or vLLM) reads tokenizer.json.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate((*SPECIALS, *TAGS))}
    vocab.update({_byte_level(c): len(SPECIALS) + len(TAGS) + i for i, c in enumerate(CHARS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    # Not "special": decoders that skip special tokens (vLLM's default) keep the tags.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=PAD,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )


def build_model_folder(path: Path | str, seed: int = 0, **arch: Any) -> Path:
    """Write tokenizer + randomly initialised (seeded) Qwen2 model to `path`; returns it."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    target = Path(path)
    tokenizer = build_tokenizer({**ARCH, **arch}["max_position_embeddings"])
    pad_id, eos_id = tokenizer.convert_tokens_to_ids(PAD), tokenizer.convert_tokens_to_ids(EOS)
    config = Qwen2Config(
        vocab_size=TASK_VOCAB_SIZE,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
        **{**ARCH, **arch},
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # Initialised at the task's vocabulary, then grown: every weight the calibrated demo had keeps its seeded
    # value, and the added characters' rows are drawn after them (N(0, initializer_range), tied to lm_head).
    model.resize_token_embeddings(VOCAB_SIZE, mean_resizing=False)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=pad_id)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / "grpo_demo_model.json").write_text(json.dumps(recipe(seed, **arch), indent=1))
    return target


def count_parameters(model: Any) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
