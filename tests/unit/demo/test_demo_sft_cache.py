"""The demo's cold start is kept between runs: same SFT settings → the same model, reused; any change → trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo.demo import live
from grpo.demo.config import DemoConfig
from grpo.demo.demo import prepare
from grpo.demo.sft_cache import entry_dir

# A cold start of seconds: two SFT steps on a few problems, evaluated after each.
TINY = {"sft_max_steps": 2, "sft_eval_every": 1, "sft_eval_size": 8, "eval_size": 8, "n_sft": 64, "n_grpo": 16,
        "sft_batch": 16, "sft_threshold": 1.1}  # fmt: skip


def _model_bytes(folder: Path) -> bytes:
    return (folder / "model.safetensors").read_bytes()


@pytest.mark.parametrize("field, value", [("steps", 7), ("lr", 1e-5), ("preset", "dapo"), ("replicas", 3),
                                          ("eval_every", 5), ("temperature", 0.7), ("reuse_sft", False)])  # fmt: skip
def test_grpo_only_settings_share_the_cold_start(field: str, value: object) -> None:
    assert entry_dir(DemoConfig(**{field: value}).sft_settings()) == entry_dir(DemoConfig().sft_settings())


@pytest.mark.parametrize("field, value", [("seed", 1), ("sft_lr", 1e-3), ("sft_max_steps", 10), ("sft_threshold", 0.5),
                                          ("max_new_tokens", 30), ("eval_size", 900), ("n_sft", 100)])  # fmt: skip
def test_any_setting_sft_depends_on_gives_another_entry(field: str, value: object) -> None:
    assert entry_dir(DemoConfig(**{field: value}).sft_settings()) != entry_dir(DemoConfig().sft_settings())


def test_another_base_model_vocabulary_gives_another_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold start trained from the 20-token model must not be reused over the printable-ASCII one."""
    from grpo.demo import model

    before = entry_dir(DemoConfig().sft_settings())
    monkeypatch.setattr(model, "CHARS", model.TASK_CHARS)
    assert entry_dir(DemoConfig().sft_settings()) != before


def test_a_second_run_reuses_the_cold_start_and_fresh_sft_trains_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))
    cfg = DemoConfig(**TINY)  # type: ignore[arg-type]

    def run(name: str, config: DemoConfig) -> tuple[Path, float, dict[str, object]]:
        return prepare(config, tmp_path / name, live.ViewState(), lambda: None)

    first_dir, first_acc, first = run("a", cfg)
    assert first["sft_reused"] is False and first["sft_steps"] == 2
    assert (entry_dir(cfg.sft_settings()) / "sft.json").is_file()

    again_dir, again_acc, again = run("b", cfg)
    assert again["sft_reused"] is True
    assert (again_acc, again["sft_steps"], again["sft_history"]) == (first_acc, 2, first["sft_history"])
    assert _model_bytes(again_dir) == _model_bytes(first_dir)  # the same weights, in the new run's folder
    assert (again_dir / "tokenizer.json").is_file()

    fresh_dir, _, fresh = run("c", cfg.model_copy(update={"reuse_sft": False}))
    assert fresh["sft_reused"] is False
    # SFT is seeded and single-threaded: training again gives the weights that were cached.
    assert _model_bytes(fresh_dir) == _model_bytes(first_dir)


def test_a_partial_entry_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))
    cfg = DemoConfig(**TINY)  # type: ignore[arg-type]
    entry = entry_dir(cfg.sft_settings())
    (entry / "model").mkdir(parents=True)  # e.g. a crash while copying, before sft.json
    _, _, info = prepare(cfg, tmp_path / "run", live.ViewState(), lambda: None)
    assert info["sft_reused"] is False
    assert (entry / "sft.json").is_file() and (entry / "model" / "model.safetensors").is_file()  # now whole
