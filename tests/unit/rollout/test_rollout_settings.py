"""Rollout settings: CLI flags, env, config file, errors that name the field; --help without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from grpo.rollout.settings import parse_settings
from tests.unit.reward.helpers import self_signed_cert


def test_defaults_and_flags() -> None:
    s = parse_settings([])
    assert (s.engine, s.model, s.grpc_port, s.http_port, s.dtype) == ("hf", None, 7051, 8001, "float32")
    s = parse_settings(
        ["--engine", "vllm", "--model", "Qwen/Qwen2.5-0.5B", "--grpc-port", "6000", "--weights-token", "w"]
    )
    assert (s.engine, s.model, s.grpc_port, s.weights_token) == ("vllm", "Qwen/Qwen2.5-0.5B", 6000, "w")


def test_env_and_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "rollout.yaml"
    config.write_text("max-n: 8\nhttp_port: 9001\nredis_url: redis://x:1/0\nreward_addr: reward:7052\n")
    monkeypatch.setenv("GRPO_ROLLOUT_CONFIG", str(config))
    monkeypatch.setenv("GRPO_ROLLOUT_HTTP_PORT", "9002")
    s = parse_settings(["--max-n", "4"])
    assert (s.max_n, s.http_port, s.redis_url, s.reward_addr) == (4, 9002, "redis://x:1/0", "reward:7052")


def test_tls_weights_and_reward_retry_settings(tmp_path: Path) -> None:
    s = parse_settings([])
    assert (s.weights_stream_timeout_s, s.reward_retry_budget_s, s.tls_cert_file, s.reward_tls_ca_file) == (
        300.0, 30.0, None, None,
    )  # fmt: skip
    cert, key = (str(p) for p in self_signed_cert(tmp_path))  # the TLS files must exist and load
    s = parse_settings(["--tls-cert-file", cert, "--tls-key-file", key, "--reward-tls-ca-file", cert,
                        "--weights-stream-timeout-s", "20", "--reward-retry-budget-s", "5"])  # fmt: skip
    assert (s.tls_cert_file, s.tls_key_file, s.reward_tls_ca_file) == (cert, key, cert)  # self-signed: its own CA
    assert (s.weights_stream_timeout_s, s.reward_retry_budget_s) == (20.0, 5.0)
    with pytest.raises((SystemExit, ValueError), match="tls_cert_file and tls_key_file must be set together"):
        parse_settings(["--tls-key-file", "k.pem"])
    # The CAs a client trusts are read at start-up too, not at the first connection's handshake.
    with pytest.raises((SystemExit, ValueError), match=r"reward_tls_ca_file ca\.pem: no such file"):
        parse_settings(["--reward-tls-ca-file", "ca.pem"])
    with pytest.raises((SystemExit, ValueError), match=r"relay_tls_ca_file .* is not a PEM file of CA certificates"):
        parse_settings(["--relay-tls-ca-file", key])


@pytest.mark.parametrize(("argv", "field"), [(["--engine", "tgi"], "engine"), (["--max-n", "0"], "max_n")])
def test_bad_values_name_the_field(argv: list[str], field: str) -> None:
    with pytest.raises((SystemExit, ValueError)) as info:
        parse_settings(argv)
    assert field.replace("_", "-") in str(info.value) or field in str(info.value)


@pytest.mark.parametrize(
    ("argv", "field", "message"),
    [
        (["--redis-url", "redis://127.0.0.1:1/0"], "reward_addr", "the worker loop (redis_url is set) needs"),
        (["--redis-url", "redis://127.0.0.1:1/0", "--reward-addr", "r:1", "--run", "a b"], "run", "run name 'a b'"),
        (["--run", "a:b"], "run", "without braces, colons or spaces"),
        (["--redis-url", "http://127.0.0.1:1", "--reward-addr", "r:1"], "redis_url", "redis://, rediss:// or unix://"),
    ],
)
def test_the_worker_loops_settings_are_checked_when_parsed(argv: list[str], field: str, message: str) -> None:
    """Not in the worker thread after the model has loaded, where a bad value used to end the process with 0."""
    with pytest.raises(ValidationError) as info:
        parse_settings(argv)
    [error] = info.value.errors()
    assert error["loc"] == (field,) and message in error["msg"]


def test_a_worker_loop_with_its_settings_parses() -> None:
    s = parse_settings(["--redis-url", "redis://127.0.0.1:1/0", "--reward-addr", "r:1", "--run", "exp-1"])
    assert (s.redis_url, s.reward_addr, s.run) == ("redis://127.0.0.1:1/0", "r:1", "exp-1")


def test_help_is_instant_and_does_not_import_torch() -> None:
    code = "import sys, runpy; sys.argv=['grpo-rollout','--help']\ntry:\n    runpy.run_module('grpo.rollout', run_name='__main__')\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--weights-token" in out.stdout and "--max-new-tokens-cap" in out.stdout
    assert out.stdout.strip().endswith("False"), out.stdout[-500:]
