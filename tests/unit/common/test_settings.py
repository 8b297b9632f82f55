"""The shared settings loader: flags > env > file > defaults, and one clear line for a bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings

from grpo.common.settings import exit_on_invalid_settings, load_settings, service_config


class DemoSettings(BaseSettings):
    model_config = service_config("GRPO_DEMOTEST_", "grpo-demotest")

    workers: int = Field(default=2, ge=1)
    """Worker processes."""
    name: str = "x"
    """A name."""


def test_flags_beat_env_beat_file_beat_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("workers: 3\nname: file\n")
    assert load_settings(DemoSettings, []) == DemoSettings(workers=2, name="x")
    assert load_settings(DemoSettings, ["--config", str(config)]).model_dump() == {"workers": 3, "name": "file"}
    monkeypatch.setenv("GRPO_DEMOTEST_NAME", "env")
    assert load_settings(DemoSettings, ["--config", str(config)]).name == "env"
    assert load_settings(DemoSettings, ["--config", str(config), "--name", "flag"]).name == "flag"


def test_a_bad_value_raises_and_main_exits_2_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValidationError):
        load_settings(DemoSettings, ["--workers", "0"])
    with pytest.raises(SystemExit) as exc, exit_on_invalid_settings("grpo-demotest"):
        load_settings(DemoSettings, ["--workers", "0"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("grpo-demotest: invalid settings: workers: Input should be greater")


@pytest.mark.parametrize("prog", ["grpo-reward", "grpo-rollout", "grpo-trainer"])
def test_help_lists_config_and_names_every_default(prog: str) -> None:
    """`--config` is read before the flag parser, yet --help must list it; no default prints as `<lambda>`."""
    import subprocess
    import sys

    exe = Path(sys.executable).parent / prog
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--config PATH" in out and "environment < flags" in out
    assert "<lambda>" not in out
