"""Helpers shared by the reward tests: a tiny local reward model and PRM, /proc scans for leftovers, a TLS certificate."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any


def save_tiny_reward_model(path: Path) -> Path:
    """A randomly initialised one-layer Qwen2 sequence classifier and its tokenizer, saved under `path`."""
    from transformers import Qwen2ForSequenceClassification

    tokenizer, config = _tiny_qwen2(num_labels=1, max_position_embeddings=256)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_prm(path: Path, step_token: str = "<extra_0>") -> Path:
    """A randomly initialised one-layer Qwen2 token classifier (2 labels: bad, good step) with `step_token` added to
    its tokenizer, saved as Qwen2.5-Math-PRM's folder would be read (token-classification head)."""
    from transformers import Qwen2ForTokenClassification

    tokenizer, config = _tiny_qwen2((step_token,), num_labels=2, max_position_embeddings=512)
    Qwen2ForTokenClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _tiny_qwen2(extra_tokens: tuple[str, ...] = (), **config: Any) -> tuple[Any, Any]:
    """The locally trained tokenizer (with `extra_tokens` as special tokens) and a one-layer Qwen2 config for it,
    seeded: what the tiny reward models are built from."""
    import torch
    from transformers import Qwen2Config

    from grpo.common.tiny_model import build_tokenizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = build_tokenizer(vocab_size=300)
    if extra_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(extra_tokens)})
    arch = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, **config}  # fmt: skip
    return tokenizer, Qwen2Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **arch)


def host_processes_with(marker: str) -> list[int]:
    """Pids on the host whose command line contains `marker` (a sandboxed run's orphan would show up here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # the process exited while we looked
                continue
    return found


def descendants(pid: int) -> set[int]:
    """Every live descendant of `pid`, from /proc's children lists."""
    found: set[int] = set()
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return found
    for child in map(int, children):
        found |= {child, *descendants(child)}
    return found


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A throwaway certificate and key for 127.0.0.1 and localhost (openssl CLI), written into `folder`."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


# Qwen2.5-Math-PRM ships its head as remote code (`Qwen2ForProcessRewardModel`: a Qwen2 body and a two-layer
# score head with two labels, logits first in its output). This is a small stand-in of that shape.
REMOTE_PRM_CODE = """
import torch
from transformers import Qwen2Config, Qwen2Model, Qwen2PreTrainedModel


class Qwen2ForProcessRewardModel(Qwen2PreTrainedModel):
    config_class = Qwen2Config

    def __init__(self, config):
        super().__init__(config)
        self.model = Qwen2Model(config)
        self.score = torch.nn.Sequential(
            torch.nn.Linear(config.hidden_size, config.hidden_size), torch.nn.ReLU(),
            torch.nn.Linear(config.hidden_size, 2),
        )
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return (self.score(hidden),)
"""


def save_tiny_remote_code_prm(path: Path, step_token: str = "<extra_0>") -> Path:
    """A PRM folder loaded the way Qwen2.5-Math-PRM is: AutoModel with trust_remote_code (auto_map → its file)."""
    import importlib.util
    import json
    import sys

    tokenizer, config = _tiny_qwen2((step_token,), max_position_embeddings=512)
    path.mkdir(parents=True, exist_ok=True)
    (path / "modeling_prm.py").write_text(REMOTE_PRM_CODE)
    spec = importlib.util.spec_from_file_location("modeling_prm_build", path / "modeling_prm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.Qwen2ForProcessRewardModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    saved = json.loads((path / "config.json").read_text())
    saved["architectures"] = ["Qwen2ForProcessRewardModel"]
    saved["auto_map"] = {"AutoModel": "modeling_prm.Qwen2ForProcessRewardModel"}
    (path / "config.json").write_text(json.dumps(saved, indent=1))
    return path


def mount_namespaces_held(pid: int) -> int:
    """How many mount namespaces process `pid` holds open as fds (a sandbox zygote: its runs', until their replies)."""
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed since the listing
            links.append(str(fd.readlink()))
    return sum(link.startswith("mnt:") for link in links)


def poison_tokens(path: Path, text: str, head: str = "sequence") -> Path:
    """Make the saved tiny model at `path` output nan for any input holding `text` (its tokens' embeddings set to
    nan, as a broken checkpoint would), and finite scores for the rest; `head`: sequence or token classifier."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer

    loader = AutoModelForSequenceClassification if head == "sequence" else AutoModelForTokenClassification
    model, tokenizer = loader.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
            model.get_input_embeddings().weight[token] = float("nan")
    model.save_pretrained(path)
    return path
