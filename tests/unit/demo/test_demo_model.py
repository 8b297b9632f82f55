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
    # The calibrated 0.79M plus 83 added characters' embeddings (tied): 0.80M.
    assert 800_000 < count_parameters(model) < 805_000
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


def test_printable_ascii_round_trips_one_token_per_character(folder: Path) -> None:
    """Any short text task fits: `12*34=` was `1234=` when the vocabulary held only the addition task's characters."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    text = "".join(map(chr, range(0x20, 0x7F))) + "\n\t"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text and len(ids) == len(text)
    assert tok.decode(tok.encode("What is 12*34? Reverse 'abc'.", add_special_tokens=False)) == (
        "What is 12*34? Reverse 'abc'."
    )


def test_the_addition_task_keeps_its_calibrated_tokens_and_initial_weights(folder: Path) -> None:
    """The demo's calibration (docs/demo.md) holds: the task's characters keep their ids, and every weight the
    20-token model had keeps its seeded initial value; only the added characters' embedding rows are new."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from grpo.demo.model import ARCH, TASK_CHARS, TASK_VOCAB_SIZE

    tok = AutoTokenizer.from_pretrained(folder)
    specials_and_tags = ("<|endoftext|>", "<|im_end|>", "<think>", "</answer>")
    assert [tok.convert_tokens_to_ids(t) for t in specials_and_tags] == [0, 1, 2, 5]
    assert tok.encode("".join(TASK_CHARS), add_special_tokens=False) == list(range(6, TASK_VOCAB_SIZE))
    torch.manual_seed(0)
    task_only = Qwen2ForCausalLM(Qwen2Config(vocab_size=TASK_VOCAB_SIZE, bos_token_id=0, eos_token_id=1,
                                             pad_token_id=0, dtype="float32", **ARCH)).state_dict()  # fmt: skip
    saved = load_file(folder / "model.safetensors")
    for name, tensor in saved.items():
        assert torch.equal(tensor[: task_only[name].shape[0]], task_only[name]), name
    assert saved["model.embed_tokens.weight"].shape[0] == VOCAB_SIZE
