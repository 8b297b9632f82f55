"""The `grpo` command's own usage: a bad flag is a usage error, a stack looked for in the wrong place says where it
looked, `--help` speaks in plain words, and the services agree on how a run is named (issue 34)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo.cli.main import main


def test_an_unknown_log_level_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`grpo --log-level verbose status` ended in logging's traceback."""
    with pytest.raises(SystemExit) as caught:
        main(["--log-level", "verbose", "status"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "argument --log-level: invalid choice: 'verbose'" in err and "DEBUG, INFO, WARNING, ERROR" in err, err
    assert main(["--log-level", "debug", "status", "--runs-dir", "/nonexistent"]) == 1  # any case, as the services


@pytest.mark.parametrize("command", ["status", "down"])
def test_no_stack_found_names_where_it_looked_and_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """From another directory `grpo status` said "no running stack under runs", with no hint of --runs-dir."""
    monkeypatch.chdir(tmp_path)
    assert main([command]) == 1
    out = capsys.readouterr().out
    assert f"no running stack under {tmp_path / 'runs'}" in out, out  # the whole path, not `runs`
    assert "--runs-dir" in out
    assert main([command, "--run-id", "r7"]) == 1
    assert f"no running stack of run 'r7' under {tmp_path / 'runs'}" in capsys.readouterr().out


def _help(*args: str) -> str:
    done = subprocess.run([sys.executable, *args, "--help"], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_up_help_describes_the_config_flag() -> None:
    text = _help("-m", "grpo.cli", "up")
    assert "-c FILE, --config FILE" in text and "the stack file" in text, text
    assert "--runs-dir DIR" in text


@pytest.mark.parametrize("service", ["trainer", "rollout", "reward"])
def test_service_help_shows_plain_metavars(service: str) -> None:
    """`--train-data {Path,None}`, `--model {str,None}`, `--lr float`: Python's types, not what to type."""
    text = _help("-m", f"grpo.{service}")
    for python_type in ("{Path,None}", "{str,None}", ",None}", " str]", " float]", " int]", "list[", "dict["):
        assert python_type not in text, f"{python_type!r} in grpo-{service} --help"
    if service == "trainer":
        assert "--train-data PATH" in text and "--steps N" in text and "--lr NUMBER" in text, text
        assert "--kl-kind {k1,k2,k3}" in text and "--skip-zero-variance {true,false}" in text, text
    if service == "rollout":
        assert "--model TEXT" in text and "--run-id TEXT" in text, text


def test_the_rollout_takes_the_run_under_the_trainers_flag_too() -> None:
    """The trainer's `--run-id` and the rollout's `--run` name the same thing: both now take `--run-id`."""
    from grpo.rollout.settings import parse_settings

    assert parse_settings(["--run-id", "exp-1"]).run == "exp-1"
    assert parse_settings(["--run-id=exp-2"]).run == "exp-2"
    assert parse_settings(["--run", "exp-3"]).run == "exp-3"  # the old flag stays


def test_a_used_demo_run_folder_is_said_plainly(tmp_path: Path) -> None:
    """Re-running the demo under a used --run-id logged only the trainer's `resuming from step -1: later checkpoints
    set aside as [...abandoned...]`."""
    from grpo.cli.main import used_run_note

    run_dir = tmp_path / "demo-1"
    assert used_run_note(run_dir) is None  # a new folder
    (run_dir / "checkpoints" / "step-40").mkdir(parents=True)
    (run_dir / "summary.json").write_text("{}")
    note = used_run_note(run_dir)
    assert note is not None and f"{run_dir} already holds an earlier run" in note, note
    assert "starts afresh" in note and "abandoned-step-" in note and "another --run-id" in note


def test_the_rollout_and_the_trainer_refuse_a_bad_redis_url_in_the_same_words() -> None:
    """The rollout said redis-py's "Redis URL must specify one of the following schemes", the trainer its own."""
    from pydantic import ValidationError

    from grpo.rollout.settings import parse_settings as rollout_settings
    from grpo.trainer.config import parse_settings as trainer_settings

    messages = []
    for parse, argv in ((rollout_settings, ["--reward-addr", "r:1"]), (trainer_settings, ["--train-data", "t.jsonl"])):
        with pytest.raises(ValidationError) as caught:
            parse(["--redis-url", "localhost:6379", *argv])
        [error] = caught.value.errors()
        messages.append(error["msg"])
    assert messages[0] == messages[1], messages
    assert "redis_url must start with redis://, rediss:// or unix:// (got …'localhost:6379')" in messages[0]
