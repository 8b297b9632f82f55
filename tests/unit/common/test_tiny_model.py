"""The built-in tiny model: tokenizer, chat template, deterministic cached build, model resolution."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from grpo.common import tiny_model

SMALL = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}


@pytest.fixture(scope="module")
def tiny_path() -> Path:
    return tiny_model.ensure_tiny_model()


def test_tokenizer_round_trips_and_splits_digits(tiny_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    text = "Ana has 1234 pens. <think>12 * 3 = 36</think><answer>36</answer>"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    pieces = [tok.decode([i]) for i in ids]
    assert all(len(p.strip()) <= 1 for p in pieces if p.strip().isdigit()), pieces
    for tag in tiny_model.TAG_TOKENS:
        assert tag in pieces, f"{tag} is not a single token"
    # The tags survive decoders that skip special tokens (vLLM's default).
    assert "<answer>36</answer>" in tok.decode(ids, skip_special_tokens=True)
    # transformers loads the folder with Qwen2's pre-tokenizer, not the one saved: still byte-level, lossless.
    for odd in ("  two  spaces \t tab\n\nlines", "ünïcödé ✓ 中文", "x=1234567e-3"):
        assert tok.decode(tok.encode(odd, add_special_tokens=False)) == odd


def test_chat_template_adds_generation_prompt(tiny_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(text, add_special_tokens=False)
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3
    assert tok.eos_token == "<|im_end|>"


def test_model_loads_with_the_expected_shape(tiny_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_path)
    assert config.model_type == "qwen2"
    assert (config.hidden_size, config.num_hidden_layers, config.max_position_embeddings) == (128, 3, 512)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    params = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < params < 1.2e6, params
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (tiny_path / name).is_file(), name


def test_build_is_deterministic_and_cached(tmp_path: Path) -> None:
    first = tiny_model.ensure_tiny_model(tmp_path / "a", **SMALL)
    second = tiny_model.ensure_tiny_model(tmp_path / "b", **SMALL)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny_model.ensure_tiny_model(first, **SMALL) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp, "a cached model was rebuilt"


def test_concurrent_builders_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(tiny_model.ensure_tiny_model(**SMALL))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 3 and len(set(results)) == 1
    assert results[0] == tiny_model.default_model_path(**SMALL)
    assert results[0].parent == tmp_path / "models"
    assert [p.name for p in results[0].parent.iterdir()] == [results[0].name], "temp dirs were left behind"


def test_overrides_change_the_cache_key_and_unknown_ones_fail() -> None:
    assert tiny_model.default_model_path() != tiny_model.default_model_path(**SMALL)
    with pytest.raises(ValueError, match="hidden_sise"):
        tiny_model.recipe(hidden_sise=3)


def test_resolve_model(tmp_path: Path, tiny_path: Path) -> None:
    assert tiny_model.resolve_model(None) == str(tiny_path)
    assert tiny_model.resolve_model("tiny") == str(tiny_path)
    assert tiny_model.resolve_model(str(tmp_path)) == str(tmp_path.resolve())
    assert tiny_model.resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_check_model_says_what_is_wrong_before_anything_loads(tmp_path: Path) -> None:
    from grpo.common.tiny_model import ModelNotFound, check_model

    with pytest.raises(ModelNotFound, match="no such model folder or hub id: '/nowhere/model'"):
        check_model("/nowhere/model")
    with pytest.raises(ModelNotFound, match=r"no such model folder or hub id: '\./models/mine'"):
        check_model("./models/mine")
    with pytest.raises(ModelNotFound, match="no such model folder or hub id: 'not a model!'"):
        check_model("not a model!")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match=r"has no config\.json: not a Hugging Face model folder"):
        check_model(tmp_path / "empty")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelNotFound, match="is a file; give the model's folder"):
        check_model(tmp_path / "weights.bin")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert check_model(folder) == str(folder.resolve())
