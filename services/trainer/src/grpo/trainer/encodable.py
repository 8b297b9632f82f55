"""Whether the model's tokenizer can encode a dataset's text losslessly (check_encodable, run when rows are loaded)."""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from grpo.trainer.data import DataError, PromptRow

VOCABULARY_DOCS = 'README.md, "Train your own task"'
ENCODE_BATCH = 1024  # texts per tokenizer call: batched for speed, bounded for memory


def _texts(row: PromptRow) -> Iterator[tuple[str, str]]:
    """(what, text) of everything in a row the model reads or must write: prompt, gold answer, SFT response."""
    if isinstance(row.prompt, str):
        yield "prompt", row.prompt
    else:
        for i, (_, content) in enumerate(row.prompt):
            yield f"prompt message {i}", content
    gold = (row.checks.get("math") or {}).get("gold")
    if isinstance(gold, str):
        yield "gold answer", gold
    if isinstance(row.response, str):
        yield "response", row.response
    elif row.response:
        for i, (role, content) in enumerate(row.response):
            yield f"response segment {i} ({role})", content


def _visible(text: str) -> Counter[str]:
    """The characters that must survive a round trip: tokenizers may re-space text (SentencePiece's `▁`, a BERT
    decode around punctuation) and apply Unicode compatibility forms, neither of which loses anything."""
    return Counter(c for c in unicodedata.normalize("NFKC", text) if not c.isspace() and c != "\u2581")


def lost_character(text: str, decoded: str, normalize: Callable[[str], str] = str) -> str | None:
    """The first character of `text` that its round trip (`decoded`) lost or changed, or None.

    `normalize` is the tokenizer's own normalizer (lower-casing, accent stripping, NFC): what it changes is the
    tokenizer's choice, not a loss, so the round trip is held to the normalized text."""
    short = _visible(normalize(text)) - _visible(decoded)
    if not short:
        return None
    return next((c for c in text if _visible(normalize(c)) & short), next(iter(short)))


def _normalizer(tokenizer: Any) -> Callable[[str], str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    normalizer = getattr(backend, "normalizer", None)
    return (lambda text: str(normalizer.normalize_str(text))) if normalizer is not None else str


def _round_trips(tokenizer: Any, texts: list[str]) -> list[str]:
    """Each text encoded (no special tokens added) and decoded back as written, unknown tokens left out: a
    character that became `<unk>` is as lost as a dropped one (and `<unk>`'s own letters must not stand in)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's Rust side: batches in parallel
    unk = getattr(tokenizer, "unk_token", None)
    out: list[str] = []
    for start in range(0, len(texts), ENCODE_BATCH):
        part = texts[start : start + ENCODE_BATCH]
        if backend is not None:
            ids = [e.ids for e in backend.encode_batch(part, add_special_tokens=False)]
            decoded = backend.decode_batch(ids, skip_special_tokens=False)
        else:
            ids = tokenizer(part, add_special_tokens=False)["input_ids"]
            decoded = tokenizer.batch_decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        out += [d.replace(unk, "") if unk and unk not in t else d for t, d in zip(part, decoded, strict=True)]
    return out


def _byte_level_alphabet() -> set[str]:
    """The 256 characters a byte-level BPE spells bytes with (GPT-2's map, tokenizers' ByteLevel.alphabet())."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    return {chr(b) for b in kept} | {chr(256 + i) for i in range(256 - len(kept))}


def covers_every_text(tokenizer: Any) -> bool:
    """Whether nothing can be lost, so no row needs encoding (a large dataset's check would cost seconds): a byte-level
    BPE holding all 256 byte symbols (Qwen's, GPT-2's, Llama 3's, the built-in tiny model's), or byte fallback with
    all 256 byte tokens (Llama 2's). The demo model's character tokenizer is byte-level without most of them."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    vocab = backend.get_vocab()
    if type(backend.decoder).__name__ == "ByteLevel" and _byte_level_alphabet() <= vocab.keys():
        return True
    byte_tokens = {f"<0x{b:02X}>" for b in range(256)}
    return bool(getattr(backend.model, "byte_fallback", False)) and byte_tokens <= vocab.keys()


def check_encodable(rows: Sequence[PromptRow], tokenizer: Any) -> None:
    """DataError naming the first row whose text the tokenizer cannot encode losslessly: a character its vocabulary
    lacks is dropped (or turned into an unknown token) without a word, so the model would train on text it never
    sees, e.g. `12*34=` read as `1234=`. Prompt, gold answer and SFT response are each encoded and decoded back."""
    if covers_every_text(tokenizer):
        return
    where_of: dict[str, tuple[PromptRow, str]] = {}
    for row in rows:
        for what, text in _texts(row):
            where_of.setdefault(text, (row, what))
    texts, normalize = list(where_of), _normalizer(tokenizer)
    for text, decoded in zip(texts, _round_trips(tokenizer, texts), strict=True):
        lost = None if decoded == text else lost_character(text, decoded, normalize)
        if lost is None:
            continue
        row, what = where_of[text]
        at = text.find(lost)
        column = f", column {at + 1}" if at >= 0 else ""
        shown = f"{text!r} reads back as {decoded!r}" if len(text) <= 60 else f"around it: {_excerpt(text, at)!r}"
        raise DataError(
            f"{row.where}: the {what} holds {lost!r} (U+{ord(lost):04X}{column}), which the model's tokenizer "
            f"cannot encode: it is dropped or changed ({shown}), so the model would train on text it never sees. "
            f"Rewrite the text, or use a model whose vocabulary covers it (the built-in models' vocabularies: "
            f"{VOCABULARY_DOCS})"
        )


def _excerpt(text: str, at: int, width: int = 24) -> str:
    return text[max(0, at - width) : at + width] if at >= 0 else text[: 2 * width]
