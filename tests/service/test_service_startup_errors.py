"""Bad settings stop each service at its real entry point with one line and exit code 2, before any model loads.

Each input here once escaped that line: a traceback (YAML, UTF-8, env JSON, a flag's JSON, a log level, a
missing TLS file), a misleading "port 0 is in use" (a bad PEM, an unknown host), or a rollout that loaded its
model, lost its worker thread and exited 0 (no --reward-addr, a bad run name).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.common.net import free_port

MODULES = {"reward": "grpo.reward", "rollout": "grpo.rollout", "trainer": "grpo.trainer"}
LEVELS = "use one of DEBUG, INFO, WARNING, ERROR, CRITICAL"


def run_service(service: str, argv: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> str:
    """Start `service` with `argv` on free ports; assert it exits 2 with one line; that line after the prefix."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    cmd = [sys.executable, "-m", MODULES[service], "--grpc-port", "0", "--http-port", "0", *argv]
    if service == "trainer":
        data = tmp_path / "train.jsonl"
        data.write_text('{"prompt": "1 + 1?", "task_type": "math", "gold": "2"}\n')
        cmd += ["--train-data", str(data), "--output-dir", str(tmp_path / "out")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**base, **(env or {})})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    prefix = f"grpo-{service}: invalid settings: "
    assert len(lines) == 1 and lines[0].startswith(prefix), done.stderr[-3000:]
    return lines[0].removeprefix(prefix)


@pytest.fixture
def garbage_pem(tmp_path: Path) -> Path:
    path = tmp_path / "bad.pem"
    path.write_text("garbage\n")
    return path


@pytest.mark.parametrize("service", list(MODULES))
def test_a_config_file_with_a_yaml_syntax_error(service: str, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("steps: [1\n")
    line = run_service(service, ["--config", str(config)], tmp_path)
    assert line.startswith(f"config file {config}: not valid YAML or JSON: line 2, column 1: expected ',' or ']'")


@pytest.mark.parametrize("service", list(MODULES))
def test_a_config_file_that_is_not_utf8(service: str, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_bytes(b"\xff\xfe\x00steps: 1\n")
    line = run_service(service, [], tmp_path, env={f"GRPO_{service.upper()}_CONFIG": str(config)})
    assert line == f"config file {config}: not UTF-8 text (invalid start byte at byte 0)"


@pytest.mark.parametrize("service", list(MODULES))
def test_an_unknown_log_level(service: str, tmp_path: Path) -> None:
    line = run_service(service, ["--log-level", "LOUD"], tmp_path)
    assert line == f"log_level: Value error, 'LOUD' is not a log level; {LEVELS}"


@pytest.mark.parametrize("service", list(MODULES))
def test_tls_files_that_are_not_pem(service: str, tmp_path: Path, garbage_pem: Path) -> None:
    line = run_service(service, ["--tls-cert-file", str(garbage_pem), "--tls-key-file", str(garbage_pem)], tmp_path)
    assert f"tls_cert_file {garbage_pem} and tls_key_file {garbage_pem} are not a PEM certificate" in line
    assert "in use" not in line


@pytest.mark.parametrize("service", list(MODULES))
def test_tls_files_that_do_not_exist(service: str, tmp_path: Path) -> None:
    line = run_service(service, ["--tls-cert-file", "/nope.pem", "--tls-key-file", "/nope.key"], tmp_path)
    assert line.endswith("tls_cert_file /nope.pem: no such file")


@pytest.mark.parametrize("service", list(MODULES))
def test_a_host_that_does_not_resolve(service: str, tmp_path: Path) -> None:
    line = run_service(service, ["--host", "999.1.1.1"], tmp_path)
    assert line.startswith("host: Value error, '999.1.1.1' is not an address of this machine or a name that resolves")


@pytest.mark.parametrize(
    ("service", "env", "value"),
    [("trainer", "GRPO_TRAINER_STOP", "</s>"), ("trainer", "GRPO_TRAINER_REWARD_WEIGHTS", "math=1"),
     ("reward", "GRPO_REWARD_PLUGINS", "mine=a.b:c")],
)  # fmt: skip
def test_a_list_or_mapping_in_the_env_that_is_not_json(service: str, env: str, value: str, tmp_path: Path) -> None:
    line = run_service(service, [], tmp_path, env={env: value})
    field = env.removeprefix(f"GRPO_{service.upper()}_").lower()
    assert line.startswith(f'{field}: {env} must be JSON: a list as ["</s>"], a mapping as {{"math": 1}}')


def test_a_mapping_flag_that_does_not_parse(tmp_path: Path) -> None:
    line = run_service("trainer", ["--reward-weights", "{math:1"], tmp_path)
    assert line.startswith('reward_weights: --reward-weights: Missing end delimiter "}"; give a list as a,b')


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "reward_addr: Value error, the worker loop (redis_url is set) needs the reward service's gRPC host:port"),
        (["--reward-addr", "127.0.0.1:1", "--run", "a b"], "run: Value error, run name 'a b' must be non-empty"),
    ],
)
def test_a_rollout_worker_loop_with_bad_settings_exits_before_loading_the_model(
    argv: list[str], expected: str, tmp_path: Path
) -> None:
    """It used to load the model, say "rollout ready", lose its worker thread to a ValueError and exit 0."""
    redis_url = f"redis://127.0.0.1:{free_port()}/0"  # never reached: the settings are refused first
    line = run_service("rollout", ["--weights-data-port", "-1", "--redis-url", redis_url, *argv], tmp_path)
    assert line.startswith(expected)
