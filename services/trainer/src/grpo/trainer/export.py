"""The final model as a plain Hugging Face folder (weights + tokenizer), loadable by the rollout service."""

from __future__ import annotations

import logging
import shutil
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
    """save_pretrained of the trained weights and the original tokenizer into `folder`.

    Every rank calls it: under ZeRO-3 gathering the weights is collective (a rank 0 gathering alone waits
    forever); rank 0 alone writes. Written beside `folder` and renamed in, so `folder` exists only complete:
    its presence is what marks a run finished (a trainer killed while writing it writes it again on restart)."""
    state = learner.state_dict_for_push()
    if learner.backend.rank != 0:
        return
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # what a killed trainer left half-written
    tmp.mkdir(parents=True)
    target: Any = learner.model.module if hasattr(learner.model, "module") else learner.model
    if hasattr(target, "get_base_model"):  # LoRA: the merged weights are a plain model's, not an adapter's
        target = target.get_base_model()
    target.save_pretrained(tmp, state_dict=state, safe_serialization=True)
    load_tokenizer(model).save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)  # an older final model (a run trained further) is replaced
    tmp.rename(folder)
    log.info("final model written to %s", folder)


def final_model_saved(folder: Path) -> bool:
    """Whether `folder` holds a final model written to the end (save_final_model renames it in last)."""
    return folder.is_dir()
