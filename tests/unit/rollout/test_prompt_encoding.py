"""How prompts become tokens, in the rollout service and in SFT alike: the tokenizer's BOS on plain text, a final
assistant message continued, and tokenizer failures as bad requests."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from grpo.common.tiny_model import ensure_tiny_model
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.request_checks import BadRequest, encode_prompts
from grpo.rollout.service import RolloutService
from grpo.trainer.data import PromptRow
from grpo.trainer.sft import encode_prompt
from grpo.v1 import rollout_pb2 as pb

BOS = "<|endoftext|>"
BEGUN = (("user", "What is 3 + 4?"), ("assistant", "The answer is"))


def bos_model(dst: Path) -> Path:
    """The tiny model with a tokenizer that puts BOS in front of plain text, as Llama's, Gemma's, Mistral's do."""
    shutil.copytree(ensure_tiny_model(), dst)
    tk = Tokenizer.from_file(str(dst / "tokenizer.json"))
    tk.post_processor = TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, 0)])
    tk.save(str(dst / "tokenizer.json"))
    config = json.loads((dst / "tokenizer_config.json").read_text())
    config["bos_token"] = BOS
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    return dst


def no_chat_template_model(dst: Path) -> Path:
    shutil.copytree(ensure_tiny_model(), dst)
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((dst / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    return dst


def _service(model: Path) -> RolloutService:
    return RolloutService(HFEngine(str(model), torch_threads=1), str(model))


@pytest.fixture(scope="module")
def bos_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutService]:
    service = _service(bos_model(tmp_path_factory.mktemp("models") / "bos"))
    yield service
    service.close()


@pytest.fixture(scope="module")
def service() -> Iterator[RolloutService]:
    service = _service(ensure_tiny_model())
    yield service
    service.close()


def _row(prompt: str | tuple[tuple[str, str], ...]) -> PromptRow:
    return PromptRow(row_id="r", prompt=prompt, task_type="math", checks={}, response="7")


def test_plain_text_prompts_keep_the_tokenizers_bos(bos_service: RolloutService) -> None:
    tok = bos_service.tokenizer
    bos = tok.convert_tokens_to_ids(BOS)
    text = "Ana has 5 pens."
    body = tok.encode(text, add_special_tokens=False)
    assert bos_service.encode(text) == [bos, *body]
    assert encode_prompt(tok, _row(text), apply_chat_template=False) == [bos, *body]
    # Through the template the text is the template's (no BOS added on top of it), the same in SFT.
    chat = bos_service.encode(text, chat=True)
    assert chat[0] != bos and chat == encode_prompt(tok, _row(text), apply_chat_template=True)


def test_a_final_assistant_message_is_continued_not_closed(service: RolloutService) -> None:
    tok = service.tokenizer
    messages = [{"role": r, "content": c} for r, c in BEGUN]
    ids = service.encode(messages)
    text = tok.decode(ids)
    assert text.endswith("<|im_start|>assistant\nThe answer is"), text
    assert text.count("<|im_start|>assistant") == 1
    assert encode_prompt(tok, _row(BEGUN), apply_chat_template=True) == ids
    # A conversation that ends with the user still opens the assistant's turn.
    opened = tok.decode(service.encode(messages[:1]))
    assert opened.endswith("<|im_start|>assistant\n"), opened


def test_a_prompt_the_tokenizer_cannot_encode_is_a_bad_request(tmp_path: Path) -> None:
    service = _service(no_chat_template_model(tmp_path / "nochat"))
    try:
        chat_text = pb.Prompt(text="hi", apply_chat_template=True)
        messages = pb.Prompt(messages=pb.Messages(messages=[pb.ChatMessage(role="user", content="hi")]))
        for i, prompt in enumerate([chat_text, messages]):
            prompts = [pb.Prompt(text="fine")] * i + [prompt]
            with pytest.raises(BadRequest, match=rf"prompts\[{i}\] could not be encoded: .*chat.template"):
                encode_prompts(service, prompts, max_new_tokens=4)
        assert encode_prompts(service, [pb.Prompt(text="plain text works")], max_new_tokens=4)
    finally:
        service.close()
