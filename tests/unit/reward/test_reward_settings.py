"""Reward settings: file < env < CLI precedence; a bad value names its field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from grpo.reward.settings import parse_settings


def test_defaults() -> None:
    s = parse_settings([])
    assert (s.grpc_port, s.http_port) == (7052, 8002)
    assert s.workers >= 1 and s.token is None and s.reward_model_path is None


def test_precedence_file_env_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "reward.yaml"
    config.write_text("workers: 3\nhttp-port: 9000\nmax_items: 7\nplugins:\n  len: tests.x:y\n")
    monkeypatch.setenv("GRPO_REWARD_CONFIG", str(config))
    monkeypatch.setenv("GRPO_REWARD_HTTP_PORT", "9001")
    monkeypatch.setenv("GRPO_REWARD_MAX_ITEMS", "8")
    s = parse_settings(["--max-items", "9"])
    assert s.workers == 3  # file
    assert s.http_port == 9001  # env beats file
    assert s.max_items == 9  # CLI beats env
    assert s.plugins == {"len": "tests.x:y"}


def test_config_flag(tmp_path: Path) -> None:
    config = tmp_path / "r.json"
    config.write_text('{"grpc_port": 6000, "token": "s3cret"}')
    s = parse_settings(["--config", str(config), "--http-port", "7000"])
    assert (s.grpc_port, s.http_port, s.token) == (6000, 7000, "s3cret")


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--workers", "many"], "workers"),
        (["--workers", "0"], "workers"),
        (["--grpc-port", "70000"], "grpc_port"),
        (["--math-timeout-s", "-1"], "math_timeout_s"),
        (["--languages", "python,pyhton"], r"languages: \['pyhton'\] given; choose from \['bash', 'c', "),
    ],
)
def test_bad_value_names_field(argv: list[str], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        parse_settings(argv)


def test_plugin_name_clash_and_half_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_REWARD_PLUGINS", '{"math": "a.b:c"}')
    with pytest.raises(ValidationError, match="clash with built-in"):
        parse_settings([])
    monkeypatch.delenv("GRPO_REWARD_PLUGINS")
    with pytest.raises(ValidationError, match="tls_cert_file and tls_key_file"):
        parse_settings(["--tls-cert-file", "/x.pem"])


def test_a_code_runs_wall_clock_limit_fits_the_longest_request_deadline() -> None:
    """idle_factor x the time limit, unless the server's max_timeout_s is shorter: then a second less, so a run that
    reaches it is judged `timeout`, never cut off as a request past its deadline (504)."""
    assert parse_settings([]).code_wall_s(2.0) == 6.0
    assert parse_settings(["--code-idle-factor", "5"]).code_wall_s(2.0) == 10.0
    assert parse_settings(["--max-timeout-s", "8"]).code_wall_s(3.0) == 7.0
    assert parse_settings(["--max-timeout-s", "2"]).code_wall_s(3.0) == 3.0  # never below the time limit itself
