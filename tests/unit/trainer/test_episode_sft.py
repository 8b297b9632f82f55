"""SFT on tool episodes: a response of segments, each encoded alone, tool segments out of the loss."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.data import DataError, parse_row
from grpo.trainer.learner import Learner, LearnerConfig, SftPair
from grpo.trainer.sft import to_pair

SEGMENTS = [
    {"role": "assistant", "content": "<code>print(12*34)</code>"},
    {"role": "tool", "content": "<output>408</output>"},
    {"role": "assistant", "content": "<answer>408</answer>"},
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(ensure_tiny_model())


def test_segments_are_encoded_alone_and_tool_segments_masked(tokenizer: Any) -> None:
    row = parse_row({"prompt": "12*34=", "response": SEGMENTS}, "f line 1", need_response=True)
    pair = to_pair(tokenizer, row, False)
    parts = [tokenizer.encode(s["content"], add_special_tokens=False) for s in SEGMENTS]
    assert pair.response_token_ids == [*parts[0], *parts[1], *parts[2], tokenizer.eos_token_id]
    assert pair.response_mask == [1] * len(parts[0]) + [0] * len(parts[1]) + [1] * len(parts[2]) + [1]
    plain = to_pair(tokenizer, parse_row({"prompt": "1+1=", "response": "2"}, "f line 2", need_response=True), False)
    assert plain.response_mask is None


@pytest.mark.parametrize(
    ("response", "message"),
    [
        ([], "'response' must be a string or a non-empty list of segments"),
        ([{"role": "user", "content": "x"}], "segment 0 has role 'user'; it must be assistant"),
        ([{"role": "assistant", "content": "x"}, {"role": "tool", "content": "y"}], "start and end with an assistant"),
        ([{"role": "assistant"}], "segment 0 must be"),
        ([{"role": "assistant", "content": ""}], r"segment 0 \(assistant\) is empty"),
    ],
)
def test_a_bad_segment_names_the_row(response: list[Any], message: str) -> None:
    with pytest.raises(DataError, match=rf"sft.jsonl line 4: .*{message}"):
        parse_row({"prompt": "x", "response": response}, "sft.jsonl line 4", need_response=True)


def test_the_sft_loss_is_the_assistant_tokens_nll(tokenizer: Any) -> None:
    """The masked loss is the mean NLL of the assistant tokens alone (computed here from the model's own logits); the
    tool tokens' NLL would move it: the same pair without its mask gives another loss."""
    torch.set_num_threads(1)
    pair = to_pair(tokenizer, parse_row({"prompt": "12*34=", "response": SEGMENTS}, "f", need_response=True), False)
    assert pair.response_mask is not None
    learner = Learner(LearnerConfig(model=str(ensure_tiny_model()), beta=0.0, lr=1e-3))
    ids = torch.tensor([pair.prompt_token_ids + pair.response_token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(learner.model(input_ids=ids).logits[0, :-1].float(), -1)
    p = len(pair.prompt_token_ids)
    nll = [-logp[p - 1 + t, tok].item() for t, tok in enumerate(pair.response_token_ids)]
    by_hand = sum(n for n, m in zip(nll, pair.response_mask, strict=True) if m) / sum(pair.response_mask)
    assert learner.sft_eval_loss([pair]) == pytest.approx(by_hand, rel=1e-5)
    unmasked = SftPair(pair.prompt_token_ids, pair.response_token_ids)
    assert learner.sft_eval_loss([unmasked]) != pytest.approx(by_hand, rel=1e-3)
    metrics = learner.sft_step([pair])
    assert metrics["tokens"] == sum(pair.response_mask)
