"""The demo's cold-start model, kept between runs: a second `grpo demo` with the same SFT settings skips SFT.

SFT is seeded and single-threaded, so the same settings, code and library versions give the same model;
the key covers all of them. An entry is a model folder plus `sft.json` (steps, accuracy, history, seconds),
written to a temporary folder and renamed, so a reader sees a whole entry or none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from grpo.common.tiny_model import cache_root
from grpo.demo import model
from grpo.demo.sft import SftResult

log = logging.getLogger(__name__)

# Bump when the SFT loop or the task generator changes what a given setting produces (the base model's own recipe,
# vocabulary included, is part of the key already).
SFT_RECIPE_VERSION = 1
_LIBRARIES = ("torch", "transformers", "tokenizers")


def entry_dir(settings: dict[str, Any]) -> Path:
    """Where the SFT model for these settings lives under the cache root ($GRPO_CACHE_DIR or ~/.cache/grpo).

    The base model's recipe is in the key: an entry trained from another vocabulary is another model."""
    versions = {name: metadata.version(name) for name in _LIBRARIES}
    base = model.recipe(int(settings.get("seed", 0)))
    blob = json.dumps({"settings": settings, "recipe": SFT_RECIPE_VERSION, "versions": versions, "base": base},
                      sort_keys=True)  # fmt: skip
    return cache_root() / "demo-sft" / hashlib.sha256(blob.encode()).hexdigest()[:16]


def load(entry: Path, out_dir: Path) -> SftResult | None:
    """Copy a cached model to out_dir and return its SFT result; None when there is no (whole) entry."""
    try:
        info = json.loads((entry / "sft.json").read_text())
    except (OSError, ValueError):
        return None
    shutil.copytree(entry / "model", out_dir, dirs_exist_ok=True)
    return SftResult(info["steps"], info["accuracy"], info["history"], info["seconds"])


def store(entry: Path, model_dir: Path, result: SftResult) -> None:
    """Keep model_dir and result under entry; a concurrent writer of the same entry is harmless (same model)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        shutil.copytree(model_dir, tmp / "model")
        info = {"steps": result.steps, "accuracy": result.accuracy, "history": result.history,
                "seconds": result.seconds}  # fmt: skip
        (tmp / "sft.json").write_text(json.dumps(info, indent=1))
        if entry.exists() and not (entry / "sft.json").is_file():  # not written by store(): replace it
            shutil.rmtree(entry, ignore_errors=True)
        try:
            tmp.rename(entry)
        except OSError:  # another run stored it first
            log.debug("SFT cache entry %s already present", entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
