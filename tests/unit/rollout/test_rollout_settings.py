"""Rollout settings: CLI flags, env, config file, errors that name the field; --help without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo.rollout.settings import parse_settings


def test_defaults_and_flags() -> None:
    s = parse_settings([])
    assert (s.engine, s.model, s.grpc_port, s.http_port, s.dtype) == ("hf", None, 7051, 8001, "float32")
    s = parse_settings(
        ["--engine", "vllm", "--model", "Qwen/Qwen2.5-0.5B", "--grpc-port", "6000", "--weights-token", "w"]
    )
    assert (s.engine, s.model, s.grpc_port, s.weights_token) == ("vllm", "Qwen/Qwen2.5-0.5B", 6000, "w")


def test_env_and_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "rollout.yaml"
    config.write_text("max-n: 8\nhttp_port: 9001\nredis_url: redis://x:1/0\n")
    monkeypatch.setenv("GRPO_ROLLOUT_CONFIG", str(config))
    monkeypatch.setenv("GRPO_ROLLOUT_HTTP_PORT", "9002")
    s = parse_settings(["--max-n", "4"])
    assert (s.max_n, s.http_port, s.redis_url) == (4, 9002, "redis://x:1/0")


def test_tls_weights_and_reward_retry_settings() -> None:
    s = parse_settings([])
    assert (s.weights_stream_timeout_s, s.reward_retry_budget_s, s.tls_cert_file, s.reward_tls_ca_file) == (
        300.0, 30.0, None, None,
    )  # fmt: skip
    s = parse_settings(["--tls-cert-file", "c.pem", "--tls-key-file", "k.pem", "--reward-tls-ca-file", "ca.pem",
                        "--weights-stream-timeout-s", "20", "--reward-retry-budget-s", "5"])  # fmt: skip
    assert (s.tls_cert_file, s.tls_key_file, s.reward_tls_ca_file) == ("c.pem", "k.pem", "ca.pem")
    assert (s.weights_stream_timeout_s, s.reward_retry_budget_s) == (20.0, 5.0)
    with pytest.raises((SystemExit, ValueError), match="tls_cert_file and tls_key_file must be set together"):
        parse_settings(["--tls-key-file", "k.pem"])


@pytest.mark.parametrize(("argv", "field"), [(["--engine", "tgi"], "engine"), (["--max-n", "0"], "max_n")])
def test_bad_values_name_the_field(argv: list[str], field: str) -> None:
    with pytest.raises((SystemExit, ValueError)) as info:
        parse_settings(argv)
    assert field.replace("_", "-") in str(info.value) or field in str(info.value)


def test_help_is_instant_and_does_not_import_torch() -> None:
    code = "import sys, runpy; sys.argv=['grpo-rollout','--help']\ntry:\n    runpy.run_module('grpo.rollout', run_name='__main__')\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--weights-token" in out.stdout and "--max-new-tokens-cap" in out.stdout
    assert out.stdout.strip().endswith("False"), out.stdout[-500:]
