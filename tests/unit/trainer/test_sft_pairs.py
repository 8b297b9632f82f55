"""SFT pairs: the response's tokens end with one end-of-sequence token, whether the data wrote it or not."""

from __future__ import annotations

from transformers import AutoTokenizer

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.data import parse_row
from grpo.trainer.sft import to_pair


def test_the_response_ends_with_one_eos_token() -> None:
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model())
    eos = tokenizer.eos_token_id
    plain = parse_row({"prompt": "2+2=", "response": "<answer>4</answer>"}, "f line 1", need_response=True)
    written = parse_row({"prompt": "2+2=", "response": f"<answer>4</answer>{tokenizer.eos_token}"}, "f line 2",
                        need_response=True)  # fmt: skip
    a, b = to_pair(tokenizer, plain, False), to_pair(tokenizer, written, False)
    assert a.response_token_ids[-1] == eos and a.response_token_ids[-2] != eos
    assert (
        b.response_token_ids == a.response_token_ids
    )  # the data's own EOS is not doubled (the model learned "stop, stop")
