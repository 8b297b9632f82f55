"""Methods vLLM adds to its worker (`worker_extension_cls`): in-place weight reload and the log-prob hook.

This module is imported inside vLLM's worker, which is another process in multiprocess
mode, so it depends only on torch, safetensors and grpo-common's torch-only `logprobs`. The engine calls these methods with
`LLM.collective_rpc("grpo_...")`.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import torch

from grpo.common.logprobs import all_token_logprobs

log = logging.getLogger(__name__)


def _load_safetensors(payload: bytes | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(payload, dict):
        return payload
    from safetensors.torch import load

    return load(payload)


def refresh_tied_modules(model: torch.nn.Module) -> int:
    """Re-run weight post-processing on modules whose weight is another module's (tied embeddings).

    The reload only post-processes layers whose names were in the checkpoint. A tied lm_head
    shares the embedding's weight but is never named, and vLLM's CPU backend keeps a prepacked
    copy of it for its GEMM, which would keep the old values. On GPUs this re-run is a no-op.
    """
    owners: dict[int, torch.nn.Module] = {}
    refreshed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor):
            continue
        if id(weight) in owners and hasattr(module, "quant_method"):
            # a vLLM layer attribute; torch types every Module attribute as Tensor | Module
            cast(Any, module.quant_method).process_weights_after_loading(module)
            refreshed += 1
        owners.setdefault(id(weight), module)
    return refreshed


class PreTruncationLogprobs(torch.nn.Module):
    """Wraps vLLM's top-k/top-p sampler so the returned log-probs are taken before truncation.

    vLLM's `processed_logprobs` mode returns log_softmax of the temperature-scaled logits
    *after* top-k/top-p masking (renormalised over the kept tokens); our contract (and the
    trainer) uses the distribution before truncation. The inner sampler is switched to
    `raw_logprobs` so it computes nothing extra (and FlashInfer stays usable on GPUs).
    """

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        # a plain attribute of vLLM's sampler; torch types Module.__setattr__ values as Tensor | Module
        cast(Any, inner).logprobs_mode = "raw_logprobs"

    def forward(self, logits: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        # The logits arrive temperature-scaled; the inner sampler may mask them in place, so take them first.
        logprobs = all_token_logprobs(logits)
        sampled, _ = self.inner(logits, *args, **kwargs)
        return sampled, logprobs


class GrpoWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker (it has `model_runner`)."""

    model_runner: Any
    reload_weights: Any  # vLLM's Worker.reload_weights (sets the current vLLM config around the runner's)

    def grpo_reload_weights(self, payload: bytes | dict[str, torch.Tensor]) -> int:
        """Copy checkpoint-format weights (HF names) into the running model; returns how many tensors."""
        tensors = _load_safetensors(payload)
        # `model.load_weights` breaks on the CPU backend (its linear layers are prepacked after
        # loading); `reload_weights` re-runs the loader's post-processing, on every backend.
        self.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        refresh_tied_modules(self.model_runner.get_model())
        return len(tensors)

    def grpo_install_logprob_hook(self) -> bool:
        """Make sampled-token log-probs pre-truncation; False when this vLLM's sampler layout is unknown."""
        sampler: Any = getattr(self.model_runner, "sampler", None)  # not None whenever `inner` is found
        inner = getattr(sampler, "topk_topp_sampler", None)
        if inner is None:
            return False
        if not isinstance(inner, PreTruncationLogprobs):
            sampler.topk_topp_sampler = PreTruncationLogprobs(inner)
        return True
