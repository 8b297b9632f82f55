"""LoRA through the trainer's own settings, as a user turns it on: only adapters train, and what leaves the
trainer (final/, weight pushes) is the merged model under the base names, loadable by transformers as it is."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from grpo.common.tiny_model import ensure_tiny_model
from tests.support.trainer_proc import run_trainer, start_trainer


def sft_config(tmp_path: Path, **extra: object) -> Path:
    rows = [{"prompt": f"What is {i} + {i + 1}?", "response": f"<answer>{2 * i + 1}</answer>"} for i in range(16)]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"mode": "sft", "model": "tiny", "train_data": str(data), "output_dir": str(tmp_path / "out"),
              "steps": 3, "prompts_per_step": 8, "micro_batch_size": 8, "lr": 5e-2, "checkpoint_every": 3,
              "grpc_port": 0, "http_port": 0, **extra}  # fmt: skip
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_lora_trains_adapters_and_writes_a_merged_final_model(tmp_path: Path) -> None:
    run_trainer(sft_config(tmp_path, lora_rank=4, lora_alpha=8), tmp_path / "trainer.log", timeout=240)
    final = tmp_path / "out" / "final"
    assert not (final / "adapter_config.json").exists()  # a plain model, not an adapter
    trained = AutoModelForCausalLM.from_pretrained(final)
    start = AutoModelForCausalLM.from_pretrained(ensure_tiny_model())
    old, new = start.state_dict(), trained.state_dict()
    assert set(old) == set(new)  # base names: what a rollout replica and transformers load
    changed = {k for k in old if not torch.equal(old[k], new[k])}
    # Adapters sit on q/k/v/o only: the merge changes those weights and nothing else.
    assert changed and all(k.split(".")[-2] in ("q_proj", "k_proj", "v_proj", "o_proj") for k in changed), changed
    checkpoint = tmp_path / "out" / "checkpoints" / "step-00000003" / "model"
    assert (checkpoint / "adapter_config.json").is_file()  # the checkpoint keeps the adapters to resume from
    assert all("lora_" in k for k in load_file(str(next(checkpoint.glob("*.safetensors")))))


def test_a_lora_target_the_model_lacks_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    proc = start_trainer(sft_config(tmp_path, lora_rank=4, lora_target_modules=["q_proj", "qkv_proj"]), log)
    assert proc.wait(timeout=120) == 1
    text = log.read_text()
    assert "lora_target_modules" in text and "qkv_proj" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
