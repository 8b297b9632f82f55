"""Optional reward model: a local HF sequence-classification checkpoint scoring (prompt, completion) pairs.

torch and transformers are imported only when a model is loaded (the `reward-model`
extra); the service runs without them otherwise. The model's output is its first logit; `normalized` maps it
into the component's score as the item's RewardModelCheck asks (docs/reward.md "Hybrid reward").
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

log = logging.getLogger(__name__)
NORMALIZE = ("none", "sigmoid")


def normalized(logit: float, normalize: str = "none", shift: float = 0.0, scale: float = 1.0) -> float:
    """The component's score from the model's logit: (logit - shift) / scale, squashed into (0, 1) by `sigmoid`.

    A non-finite logit stays non-finite (the caller fails that item: a broken forward pass is never a score)."""
    if normalize not in NORMALIZE:
        raise ValueError(f"unknown normalize {normalize!r}; one of {list(NORMALIZE)}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if not math.isfinite(logit):
        return logit
    x = (logit - shift) / scale
    if normalize == "none":
        return x
    # The two branches keep exp() from overflowing for a large |x| (and map ±inf to 1 and 0).
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class RewardModel:
    """A sequence-classification model on CPU (or the given device), scored in batches."""

    def __init__(self, path: str, batch_size: int = 16, max_length: int = 1024, device: str = "cpu") -> None:
        try:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError as exc:
            raise RuntimeError(
                "the reward model needs the 'reward-model' extra: pip install 'grpo-reward[reward-model]'"
            ) from exc
        self._torch = torch
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.model: Any = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(device).eval()
        self.device, self.batch_size, self.max_length = device, batch_size, max_length
        self._lock = threading.Lock()  # one forward at a time: torch already uses every core
        log.info("reward model loaded from %s", path)

    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        """One float per (prompt, completion) pair."""
        out: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            batch_p = prompts[start : start + self.batch_size]
            batch_c = completions[start : start + self.batch_size]
            enc = self.tokenizer(
                batch_p, batch_c, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            ).to(self.device)
            with self._lock, self._torch.inference_mode():
                logits = self.model(**enc).logits
            out.extend(float(x) for x in logits[:, 0].float().cpu())
        return out
