"""The demo model folder: a standard HF Qwen2 folder whose tokenizer round-trips the task text exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo.demo.model import EOS, VOCAB_SIZE, build_model_folder, count_parameters
from grpo.demo.task import make_splits, worked_answer


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return build_model_folder(tmp_path_factory.mktemp("demo") / "model", seed=0)


def test_auto_classes_load_a_qwen2(folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert model.config.model_type == "qwen2"
    assert 780_000 < count_parameters(model) < 800_000  # the calibrated 0.79M
    assert len(tok) == VOCAB_SIZE == model.config.vocab_size
    assert tok.eos_token == EOS and tok.eos_token_id == model.config.eos_token_id


def test_round_trip_is_exact_one_token_per_character(folder: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)  # transformers picks Qwen2Tokenizer for a qwen2 folder
    for p in make_splits(50, 50, 50, seed=4).eval:
        text = p.prompt + worked_answer(p)
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text  # no spaces inserted or lost
        tags = sum(text.count(t) for t in ("<think>", "</think>", "<answer>", "</answer>"))
        assert len(ids) == len(text) - sum(len(t) for t in ("<think>", "</think>", "<answer>", "</answer>")) + tags
    ids = tok.encode("1 2" + EOS, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "1 2" and ids[-1] == tok.eos_token_id


def test_same_seed_same_weights(tmp_path: Path, folder: Path) -> None:
    from safetensors.torch import load_file

    again = build_model_folder(tmp_path / "again", seed=0)
    a, b = load_file(folder / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
