"""The shared settings loader: flags > env > file > defaults, and one clear line for a bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings

from grpo.common.settings import ServiceSettings, exit_on_invalid_settings, load_settings, service_config
from tests.unit.reward.helpers import self_signed_cert


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


class ServerDemoSettings(ServiceSettings):
    """Declares log_level as a plain str, as the trainer does: the shared check must still apply."""

    model_config = service_config("GRPO_DEMOTEST_", "grpo-demotest")

    host: str = "0.0.0.0"
    """Bind address."""
    tls_cert_file: str | None = None
    """PEM certificate."""
    tls_key_file: str | None = None
    """PEM key."""
    log_level: str = "INFO"
    """Logging level."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings."""
    weights: dict[str, float] = Field(default_factory=dict)
    """Weights by name."""


def _exit_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What main prints for `argv`: one line, exit code 2."""
    with pytest.raises(SystemExit) as exc, exit_on_invalid_settings("grpo-demotest"):
        load_settings(ServerDemoSettings, argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("grpo-demotest: invalid settings: "), err
    return err.removeprefix("grpo-demotest: invalid settings: ").strip()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"steps: [1\n", "not valid YAML or JSON: line 2, column 1: expected ',' or ']', but got '<stream end>'"),
        (b"\xff\xfe\x00name: x\n", "not UTF-8 text (invalid start byte at byte 0)"),
        (b"- a\n- b\n", "must hold a mapping of setting names to values"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_the_file(
    content: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_bytes(content)
    assert _exit_line(["--config", str(config)], capsys) == f"config file {config}: {message}"


def test_a_missing_config_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_line(["--config", str(tmp_path / "nope.yaml")], capsys).endswith("nope.yaml: no such file")


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        ("GRPO_DEMOTEST_STOP", "</s>", 'stop: GRPO_DEMOTEST_STOP must be JSON: a list as ["</s>"]'),
        (
            "GRPO_DEMOTEST_WEIGHTS",
            "math=1",
            'weights: GRPO_DEMOTEST_WEIGHTS must be JSON: a list as ["</s>"], a mapping',
        ),
    ],
)
def test_a_list_or_mapping_in_the_env_that_is_not_json_says_to_give_json(
    env: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(env, value)
    assert _exit_line([], capsys).startswith(message)
    monkeypatch.setenv(env, '["</s>"]' if env.endswith("STOP") else '{"math": 1}')
    assert load_settings(ServerDemoSettings, []).model_dump()[env.removeprefix("GRPO_DEMOTEST_").lower()]


def test_an_unparseable_mapping_flag_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = _exit_line(["--weights", "{math:1"], capsys)
    assert line.startswith('weights: --weights: Missing end delimiter "}"; give a list as a,b')
    assert load_settings(ServerDemoSettings, ["--weights", "math=1"]).weights == {"math": 1.0}


def test_log_level_is_a_standard_name_in_any_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_settings(ServerDemoSettings, ["--log-level", "debug"]).log_level == "DEBUG"
    assert _exit_line(["--log-level", "LOUD"], capsys) == (
        "log_level: Value error, 'LOUD' is not a log level; use one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
    )


def test_the_host_must_resolve(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_settings(ServerDemoSettings, ["--host", "127.0.0.1"]).host == "127.0.0.1"
    assert _exit_line(["--host", "999.1.1.1"], capsys).startswith(
        "host: Value error, '999.1.1.1' is not an address of this machine or a name that resolves"
    )


def test_tls_files_must_exist_and_be_a_pem_certificate_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert, key = (str(p) for p in self_signed_cert(tmp_path))
    assert load_settings(ServerDemoSettings, ["--tls-cert-file", cert, "--tls-key-file", key]).tls_key_file == key
    garbage = tmp_path / "bad.pem"
    garbage.write_text("garbage\n")
    assert "tls_cert_file /nope.pem: no such file" in _exit_line(
        ["--tls-cert-file", "/nope.pem", "--tls-key-file", key], capsys
    )
    assert "tls_key_file /nope.key: no such file" in _exit_line(
        ["--tls-cert-file", cert, "--tls-key-file", "/nope.key"], capsys
    )
    for argv in (
        ["--tls-cert-file", str(garbage), "--tls-key-file", key],
        ["--tls-cert-file", key, "--tls-key-file", cert],
    ):
        assert "are not a PEM certificate and its unencrypted private key" in _exit_line(argv, capsys)
    assert "tls_cert_file and tls_key_file must be set together" in _exit_line(["--tls-cert-file", cert], capsys)


class SecretDemoSettings(ServiceSettings):
    model_config = service_config("GRPO_DEMOTEST_", "grpo-demotest")

    token: str | None = None
    """A bearer token."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis."""
    name: str = "x"
    """Not a secret."""


def test_secrets_come_from_the_files_their_FILE_variables_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deployments mount secrets as files (compose's generated token and Redis password, Kubernetes Secrets)."""
    token, url = tmp_path / "token", tmp_path / "url"
    token.write_text("s3cret\n")
    url.write_text("redis://:pw@redis:6379/0")
    monkeypatch.setenv("GRPO_DEMOTEST_TOKEN_FILE", str(token))
    monkeypatch.setenv("GRPO_DEMOTEST_REDIS_URL_FILE", str(url))
    monkeypatch.setenv("GRPO_DEMOTEST_TOKEN", "")  # compose's `${VAR:-}`: empty is unset, so the file gives it
    monkeypatch.setenv("GRPO_DEMOTEST_NAME_FILE", str(token))  # only secrets are read from files
    loaded = load_settings(SecretDemoSettings, [])
    assert (loaded.token, loaded.redis_url, loaded.name) == ("s3cret", "redis://:pw@redis:6379/0", "x")
    assert load_settings(SecretDemoSettings, ["--token", "flag"]).token == "flag"  # a flag still wins

    def exit_line() -> str:
        with pytest.raises(SystemExit), exit_on_invalid_settings("grpo-demotest"):
            load_settings(SecretDemoSettings, [])
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err.removeprefix("grpo-demotest: invalid settings: ").strip()

    monkeypatch.setenv("GRPO_DEMOTEST_TOKEN", "other")
    assert exit_line() == "token: set GRPO_DEMOTEST_TOKEN or GRPO_DEMOTEST_TOKEN_FILE, not both"
    monkeypatch.delenv("GRPO_DEMOTEST_TOKEN")
    token.write_text("\n")  # an empty token would have turned auth off without a word
    assert exit_line() == f"token: GRPO_DEMOTEST_TOKEN_FILE {token} is empty"
    token.unlink()
    assert exit_line() == f"token: GRPO_DEMOTEST_TOKEN_FILE {token}: no such file"
