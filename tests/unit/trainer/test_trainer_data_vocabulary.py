"""The trainer never trains on text its model cannot see: a row whose prompt, gold answer or SFT response the
tokenizer cannot encode losslessly is refused at load time, naming the file, the line and the character. Real
tokenizers' own normalisation (NFC, lower-casing, SentencePiece's spaces, BERT's re-spacing) is not a loss.

The tokenizers are real ones, built locally (no downloads): the demo's character tokenizer, the built-in tiny
model's byte-level BPE, Qwen2's pipeline over the whole byte alphabet, a BERT-style WordPiece and a Llama-2-style
SentencePiece BPE with byte fallback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grpo.trainer.data import DataError, load_rows
from grpo.trainer.encodable import _normalizer, _round_trips, covers_every_text, lost_character

UNICODE_TEXT = "Café, naïve — 12×34 = ? 你好 🙂\n\tend  (two spaces)"


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def demo_tokenizer() -> Any:
    from grpo.demo.model import build_tokenizer

    return build_tokenizer()


def _fast(tok: Any, **special: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **special)


def qwen2_pipeline() -> Any:
    """Qwen2's tokenizer pipeline (NFC, its pre-tokenizer split, byte level) over all 256 bytes: as a real Qwen
    tokenizer, it encodes any text, and decodes NFD input in its NFC form."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    from grpo.demo.model import QWEN2_PRETOKENIZE_REGEX

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    return _fast(tok)


def bert_uncased(words: list[str]) -> Any:
    """BERT-uncased's pipeline: lower-cases and strips accents, splits punctuation, [UNK] for the rest; decoding
    puts spaces around punctuation."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", *words])}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return _fast(tok, unk_token="[UNK]")


def llama2_style() -> Any:
    """Llama-2's SentencePiece pipeline: spaces become `▁` (one prepended), byte fallback for unseen characters."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    pieces = ["<unk>", *(f"<0x{b:02X}>" for b in range(256)), "▁", *"abcdefghijklmnopqrstuvwxyz0123456789"]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], unk_token="<unk>",
                               byte_fallback=True))  # fmt: skip
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])  # fmt: skip
    return _fast(tok, unk_token="<unk>")


def test_a_character_the_demo_vocabulary_lacks_is_refused_naming_file_line_and_character(
    tmp_path: Path, demo_tokenizer: Any
) -> None:
    data = write_jsonl(
        tmp_path / "train.jsonl", [{"prompt": "12*34=", "gold": "408"}, {"prompt": "12×34=", "gold": "408"}]
    )
    with pytest.raises(DataError) as err:
        load_rows(data, tokenizer=demo_tokenizer)
    message = str(err.value)
    assert message.startswith(f"{data} line 2: the prompt holds '×' (U+00D7, column 3)"), message
    assert "'12×34=' reads back as '1234='" in message and 'README.md, "Train your own task"' in message


def test_gold_answers_and_sft_responses_are_checked_too(tmp_path: Path, demo_tokenizer: Any) -> None:
    gold = write_jsonl(tmp_path / "gold.jsonl", [{"prompt": "1/2 as a decimal:", "gold": "½"}])
    with pytest.raises(DataError, match=r"gold\.jsonl line 1: the gold answer holds '½' \(U\+00BD, column 1\)"):
        load_rows(gold, tokenizer=demo_tokenizer)
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "2+2=", "response": "<answer>4</answer> ✓"}])
    with pytest.raises(DataError, match=r"sft\.jsonl line 1: the response holds '✓' \(U\+2713, column 20\)"):
        load_rows(sft, need_response=True, tokenizer=demo_tokenizer)
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": [{"role": "system", "content": "Answer."},
                                                             {"role": "user", "content": "2·3="}], "gold": "6"}])  # fmt: skip
    with pytest.raises(DataError, match=r"chat\.jsonl line 1: the prompt message 1 holds '·'"):
        load_rows(chat, tokenizer=demo_tokenizer)


def test_any_short_ascii_task_fits_the_demo_model(tmp_path: Path, demo_tokenizer: Any) -> None:
    rows = [{"prompt": "12*34=", "gold": "408"}, {"prompt": "Reverse 'abc':\n", "gold": "cba"},
            {"prompt": "max(3, 7) = ?", "gold": "7", "response": "<think>7 > 3</think><answer>7</answer>"}]  # fmt: skip
    assert len(load_rows(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer=demo_tokenizer)) == 3


@pytest.mark.parametrize("name", ["tiny", "qwen2"])
def test_byte_level_tokenizers_take_any_text(tmp_path: Path, name: str) -> None:
    if name == "tiny":
        from grpo.common.tiny_model import build_tokenizer

        tokenizer = build_tokenizer()
    else:
        tokenizer = qwen2_pipeline()
    decomposed = "Cafe\u0301"  # NFD: Qwen2's normaliser composes it; nothing is lost
    rows = [{"prompt": UNICODE_TEXT, "gold": "408"}, {"prompt": decomposed, "gold": "½"},
            {"prompt": "<think>x</think><answer>1</answer><|im_end|>", "gold": "1"}]  # fmt: skip
    assert len(load_rows(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer=tokenizer)) == 3


def test_normalising_tokenizers_are_held_to_their_own_normal_form(tmp_path: Path) -> None:
    bert = bert_uncased(["cafe", "naive", "12", "34", "*", "=", "?", ","])
    ok = write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "Café, NAÏVE 12*34 =?", "gold": "12"}])
    assert len(load_rows(ok, tokenizer=bert)) == 1  # lower-cased, accents stripped, re-spaced: its own choice
    unknown = write_jsonl(tmp_path / "unk.jsonl", [{"prompt": "cafe 你", "gold": "12"}])
    with pytest.raises(DataError, match=r"unk\.jsonl line 1: the prompt holds '你' \(U\+4F60, column 6\)"):
        load_rows(unknown, tokenizer=bert)


def test_sentencepiece_spaces_and_byte_fallback_are_no_loss(tmp_path: Path) -> None:
    llama = llama2_style()
    rows = [{"prompt": "  two  spaces\tand a tab", "gold": "x"}, {"prompt": UNICODE_TEXT, "gold": "12"}]
    assert len(load_rows(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer=llama)) == 2


def test_without_a_tokenizer_rows_load_as_before(tmp_path: Path) -> None:
    assert len(load_rows(write_jsonl(tmp_path / "d.jsonl", [{"prompt": "12×34=", "gold": "408"}]))) == 1


@pytest.mark.parametrize("name", ["tiny", "qwen2", "llama2", "demo", "bert"])
def test_only_tokenizers_that_may_lose_text_encode_the_rows(name: str, demo_tokenizer: Any) -> None:
    """A byte-level BPE with every byte symbol, or byte fallback with every byte token, loses nothing: a large
    dataset is not encoded for the check. The others are, every text."""
    from grpo.common.tiny_model import build_tokenizer

    tokenizers = {"tiny": build_tokenizer, "qwen2": qwen2_pipeline, "llama2": llama2_style,
                  "demo": lambda: demo_tokenizer, "bert": lambda: bert_uncased(["a"])}  # fmt: skip
    assert covers_every_text(tokenizers[name]()) is (name in ("tiny", "qwen2", "llama2"))


@pytest.mark.parametrize("name", ["qwen2", "llama2"])
def test_their_round_trips_lose_nothing_either(name: str) -> None:
    """What the shortcut skips holds when checked: NFD text comes back composed (Qwen2's NFC), spaces as `▁` and
    bytes as byte tokens come back as written (Llama 2): none of it is a lost character."""
    tokenizer = qwen2_pipeline() if name == "qwen2" else llama2_style()
    texts = [UNICODE_TEXT, "Cafe\u0301 au lait", "  two  spaces"]
    for text, decoded in zip(texts, _round_trips(tokenizer, texts), strict=True):
        assert lost_character(text, decoded, _normalizer(tokenizer)) is None, (text, decoded)
