"""matplotlib's font list is built once at image build (the trainer Dockerfile) and handed to each run's fresh
MPLCONFIGDIR at start-up, so a run no longer scans the fonts again before its first plot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.trainer.font_cache import SEED_ENV, seed_font_cache

IMPORT = "import logging; logging.basicConfig(level=logging.INFO); import matplotlib.font_manager"
REBUILT = "generated new fontManager"  # matplotlib's own log line when it scans the fonts


def import_matplotlib(config_dir: Path) -> str:
    """A fresh interpreter importing matplotlib's font manager with this MPLCONFIGDIR; returns its log."""
    env = {**os.environ, "MPLCONFIGDIR": str(config_dir)}
    done = subprocess.run([sys.executable, "-c", IMPORT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_a_run_uses_the_font_list_the_image_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed, run_dir = tmp_path / "opt-matplotlib", tmp_path / "tmp" / "matplotlib"
    assert REBUILT in import_matplotlib(seed)  # the image's RUN line
    monkeypatch.setenv(SEED_ENV, str(seed))
    monkeypatch.setenv("MPLCONFIGDIR", str(run_dir))
    copied = seed_font_cache()
    assert [p.name for p in copied] == [p.name for p in seed.glob("fontlist-*.json")] and copied
    assert REBUILT not in import_matplotlib(run_dir)
    assert seed_font_cache() == []  # already there: left alone


def test_nothing_to_do_outside_the_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SEED_ENV, raising=False)
    assert seed_font_cache() == []
    monkeypatch.setenv(SEED_ENV, str(tmp_path / "missing"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "config"))
    assert seed_font_cache() == [] and not (tmp_path / "config").exists()
