"""matplotlib's font cache, built once when the image is built and handed to each run.

matplotlib reads and writes its font list only in a writable config directory (MPLCONFIGDIR). The containers' root
filesystem is read-only and their /tmp is fresh at every start, so each run used to scan the fonts again before its
first plot. The image builds the list into a read-only folder (the trainer Dockerfile's RUN line, named by
GRPO_MPL_FONT_CACHE); the trainer copies it into MPLCONFIGDIR at start-up when that has none.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)
SEED_ENV = "GRPO_MPL_FONT_CACHE"


def seed_font_cache() -> list[Path]:
    """Copy the pre-built font lists into MPLCONFIGDIR where it lacks them; returns the files copied. Nothing to do
    outside such an image (no GRPO_MPL_FONT_CACHE or MPLCONFIGDIR); a failure only costs the scan it would save."""
    seed, config_dir = os.environ.get(SEED_ENV), os.environ.get("MPLCONFIGDIR")
    if not seed or not config_dir or not Path(seed).is_dir():
        return []
    target, copied = Path(config_dir), []
    try:
        target.mkdir(parents=True, exist_ok=True)
        for font_list in sorted(Path(seed).glob("fontlist-*.json")):
            if not (target / font_list.name).exists():
                shutil.copyfile(font_list, target / font_list.name)
                copied.append(target / font_list.name)
    except OSError as exc:
        log.debug("matplotlib's font cache not seeded from %s into %s: %s", seed, target, exc)
    return copied
