"""The policy model: loading (plain or LoRA), training set-up, per-token log-probs, push tensors."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from grpo.algo.logprobs import entropy_from_logits, token_logprobs
from grpo.trainer.errors import RunError
from grpo.trainer.learner.batch import MicroBatch
from grpo.trainer.learner.packing import unpack_tokens

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraOptions:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self) -> None:
        if self.dropout != 0:  # the learner runs without dropout (disable_dropout), adapters included
            raise ValueError(
                f"LoRA dropout={self.dropout}: must be 0; the learner trains without dropout, since it makes the "
                "ratio π_θ/π_old and the KL random (each pass draws its own mask) and clipping fire on noise"
            )


def load_causal_lm(name_or_path: str, *, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The HF model from a local folder or hub id ("tiny"/None → the built-in tiny model)."""
    from transformers import AutoModelForCausalLM

    from grpo.common.tiny_model import resolve_model

    path = resolve_model(name_or_path)
    import_model_code(path)
    # Eager attention, deterministic on CPU. The rollout's hf engine uses sdpa; in fp32 the two give log-probs
    # 1e-6 apart. Eager holds each layer's T x T attention weights, which long completions feel on a GPU
    # (docs/gpu-check.md).
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")


def import_model_code(path: str) -> type:
    """Import the model's class (and transformers' lazily loaded helpers) now.

    ZeRO-3's `zero.Init` patches tensor construction; a lazy import inside it (torch._dynamo via
    transformers.masking_utils) then fails, so the code is imported before the context is entered.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    # transformers types the lazy mapping's values as (slow, fast) tokenizer pairs; for models they are classes
    return cast(type, AutoModelForCausalLM._model_mapping[type(config)])


def add_lora(model: torch.nn.Module, options: LoraOptions) -> torch.nn.Module:
    """Wrap `model` with peft LoRA adapters; only the adapters stay trainable."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # optional dependency
        raise RuntimeError("LoRA needs peft: pip install 'grpo-trainer[lora]'") from exc
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(options.target_modules) - present)
    if missing:  # peft adapts the names it finds and skips the rest: a typo would train fewer modules, silently
        linear = sorted(
            {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        raise RunError(f"lora_target_modules {missing} name no module of this model; its linear layers: {linear}")
    config = LoraConfig(
        r=options.r,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=list(options.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def prepare_model(model: torch.nn.Module, config: Any) -> None:
    """Training mode without dropout, gradient checkpointing when asked (non-reentrant: works with frozen LoRA bases)."""
    model.train()
    disable_dropout(model)
    if config.gradient_checkpointing:
        hf_model = cast("PreTrainedModel", model)  # or a PeftModel, which forwards to its PreTrainedModel
        hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        hf_model.config.use_cache = False


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout rate: the ratio π_θ/π_old and the KL compare log-probs of the same weights, which
    dropout would make random (π_old from a no-grad pass, π_θ from the training pass, the sampler's from eval
    mode). TRL disables it by default for the same reason. Attention modules copy their rate at build time."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            setattr(module, "attention_dropout", 0.0)  # noqa: B010 - a plain float attribute, not a submodule
    config = getattr(model, "config", None)
    for key, value in (vars(config) if config is not None else {}).items():
        if isinstance(value, float) and ("dropout" in key or key.endswith("_pdrop")):
            setattr(config, key, 0.0)


def forward_logprobs(
    model: torch.nn.Module, mb: MicroBatch, temperature: float, *, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Per-token log π(target) [B, L-1] (and entropy, detached) — the sampler's definition at `temperature`.

    A packed micro-batch runs as its packed rows (no attention mask: the position ids mark the samples) and its
    log-probs come back in the padded layout [B, L-1], one row per sample. use_cache=False matters for packing:
    with a KV cache, transformers does not look for sample boundaries in the position ids.
    """
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                use_cache=False)  # fmt: skip
    logits = out.logits[:, :-1, :]
    logp = token_logprobs(logits, mb.targets, temperature)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach(), temperature)
    if mb.unpack is not None:
        logp = unpack_tokens(logp, mb.unpack)
        entropy = unpack_tokens(entropy, mb.unpack) if entropy is not None else None
    return logp, entropy


def push_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """HF-named tensors exactly as the model's safetensors checkpoint names them (detached, contiguous).

    Tied embeddings: like save_pretrained, `lm_head.weight` is left out (the checkpoint stores only
    `model.embed_tokens.weight`). LoRA: adapters are merged into the base weights, base names kept.
    """
    base = _lora_base(model)
    if base is not None:
        return _merged_lora_state(base)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if tied_embeddings(model):
        state.pop("lm_head.weight", None)
    return state


def tied_embeddings(model: torch.nn.Module) -> bool:
    """Whether lm_head shares the embedding matrix (then it is neither pushed nor required in a checkpoint)."""
    config: Any = getattr(model, "config", None)
    return bool(getattr(config, "tie_word_embeddings", False))


def _lora_base(model: torch.nn.Module) -> torch.nn.Module | None:
    # No model is a PeftModel unless peft was imported (add_lora does): asked at every push, the check must not
    # import peft (~15 MB) into a run without LoRA.
    peft = sys.modules.get("peft")
    return model.get_base_model() if peft is not None and isinstance(model, peft.PeftModel) else None


@torch.no_grad()
def _merged_lora_state(base: torch.nn.Module) -> dict[str, Tensor]:
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            layer: Any = module  # every LoraLayer subclass defines get_delta_weight; the base class does not declare it
            deltas[f"{name}.weight"] = sum(layer.get_delta_weight(a) for a in layer.active_adapters)
    state: dict[str, Tensor] = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        tensor = value.detach()
        if name in deltas:
            tensor = tensor + deltas[name].to(tensor.dtype)
        state[name] = tensor.contiguous()
    if tied_embeddings(base):
        state.pop("lm_head.weight", None)
    return state
