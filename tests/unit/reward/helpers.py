"""Helpers shared by the reward tests: a tiny local reward model, /proc scans for leftovers, a TLS certificate."""

from __future__ import annotations

import subprocess
from pathlib import Path


def save_tiny_reward_model(path: Path) -> Path:
    """A randomly initialised one-layer Qwen2 sequence classifier and its tokenizer, saved under `path`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from grpo.common.tiny_model import build_tokenizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = build_tokenizer(vocab_size=300)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


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


def save_tiny_prm(path: Path, step_token: str = "<extra_0>") -> Path:
    """A randomly initialised one-layer Qwen2 token classifier (2 labels: bad, good step) with `step_token` added to
    its tokenizer, saved as Qwen2.5-Math-PRM's folder would be read (token-classification head)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    from grpo.common.tiny_model import build_tokenizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = build_tokenizer(vocab_size=300)
    tokenizer.add_special_tokens({"additional_special_tokens": [step_token]})
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, num_labels=2, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    Qwen2ForTokenClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
