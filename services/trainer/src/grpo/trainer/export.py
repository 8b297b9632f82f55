"""The final model as a plain Hugging Face folder (weights + tokenizer), loadable by the rollout service."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo.trainer.learner import Learner

log = logging.getLogger(__name__)


def load_tokenizer(model: str) -> Any:
    """The tokenizer of `model` (a folder, a hub id, or `tiny`)."""
    from transformers import AutoTokenizer

    from grpo.common.tiny_model import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model))


def save_final_model(learner: Learner, model: str, folder: Path) -> None:
    """save_pretrained of the trained weights and the original tokenizer into `folder` (rank 0 only)."""
    if learner.backend.rank != 0:
        return
    folder.mkdir(parents=True, exist_ok=True)
    target: Any = learner.model.module if hasattr(learner.model, "module") else learner.model
    target.save_pretrained(folder, state_dict=learner.state_dict_for_push(), safe_serialization=True)
    load_tokenizer(model).save_pretrained(folder)
    log.info("final model written to %s", folder)
