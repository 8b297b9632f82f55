"""Multi-turn tool settings reach the services as each deployment hands them over, and the python tool's path
(rollout → the reward service's gRPC Execute) is open in compose and the chart while tool code stays shut in."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml

from grpo.rollout.settings import parse_settings as rollout_settings
from grpo.trainer.config import parse_settings as trainer_settings
from tests.support.compose_env import COMPOSE_FILE, compose_env
from tests.support.compose_episode import TRAINER, override
from tests.support.netpol import Pod, allowed

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "k8s" / "grpo"
TRAINER_TOOLS = {"tools": ["python"], "tool_format": "tagged", "max_turns": 3, "tool_timeout_s": 2.5,
                 "tool_output_chars": 200}  # fmt: skip
ROLLOUT_TOOLS = {"tool_plugins": {"calculator": "mytools.calc:run"}, "tool_concurrency": 4}


def clean_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str] | None = None) -> None:
    for name in list(os.environ):
        if name.startswith("GRPO_"):
            monkeypatch.delenv(name)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)


def rendered(values: dict[str, Any]) -> list[dict[str, Any]]:
    files = helm_python.Chart.load(str(CHART)).render(values, name="demo", namespace="grpo")
    return [d for path, text in files.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def tool_values() -> dict[str, Any]:
    """values-cpu.yaml with the tool settings where values.yaml says to put them."""
    values = yaml.safe_load((CHART / "values-cpu.yaml").read_text())
    values.setdefault("run", {}).setdefault("trainer", {}).update(TRAINER_TOOLS)
    values.setdefault("rollout", {}).setdefault("config", {}).update(ROLLOUT_TOOLS)
    return values


def test_helm_tool_settings_reach_trainer_and_rollout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = next(d for d in rendered(tool_values()) if d["metadata"]["name"] == "demo-grpo-config")
    clean_env(monkeypatch)
    (tmp_path / "trainer.yaml").write_text(config["data"]["trainer.yaml"])
    (tmp_path / "rollout.yaml").write_text(config["data"]["rollout.yaml"])
    trainer = trainer_settings(["--config", str(tmp_path / "trainer.yaml")])
    rollout = rollout_settings(["--config", str(tmp_path / "rollout.yaml")])
    assert {k: getattr(trainer, k) for k in TRAINER_TOOLS} == TRAINER_TOOLS
    assert trainer.episode_tokens() == 3 * trainer.max_new_tokens  # max_episode_tokens 0: turns × per-turn limit
    assert trainer.tool_call_limit() == 2  # max_tool_calls unset: the last turn answers
    assert {k: getattr(rollout, k) for k in ROLLOUT_TOOLS} == ROLLOUT_TOOLS


def test_the_chart_lets_only_the_rollout_reach_execute_and_tool_code_reach_nothing() -> None:
    docs = rendered(tool_values())
    policies = [{**d, "metadata": {**d["metadata"], "namespace": "grpo"}} for d in docs if d["kind"] == "NetworkPolicy"]
    pods = {
        d["metadata"]["name"].rsplit("-", 1)[-1]: Pod(d["spec"]["template"]["metadata"]["labels"], "grpo")
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }
    grpc = tool_values().get("reward", {}).get("grpcPort", 7052)
    assert allowed(policies, pods["rollout"], pods["reward"], grpc), "the python tool's Execute calls are refused"
    assert not allowed(policies, pods["trainer"], pods["reward"], grpc)
    for target, port in (("redis", 6379), ("rollout", 7051), ("trainer", 8003), ("trainer", 7053)):
        assert not allowed(policies, pods["reward"], pods[target], port), f"tool code could reach {target}:{port}"


def test_compose_rollout_reaches_the_reward_grpc_port_and_takes_tool_settings_from_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    services = compose["services"]
    addr = compose_env("rollout", {})["GRPO_ROLLOUT_REWARD_ADDR"]
    host, port = addr.rsplit(":", 1)
    assert host == "reward" and set(services["rollout"]["networks"]) & set(services["reward"]["networks"])
    reward = yaml.safe_load((ROOT / "deploy" / "compose" / "reward.yaml").read_text())
    assert int(port) == reward.get("grpc_port", 7052) == 7052  # the reward service's default gRPC port
    assert not set(services["reward"]["networks"]) & set(services["redis"]["networks"])  # tool code: no Redis
    # The way a compose user turns tools on without editing the mounted config: the trainer's environment.
    clean_env(monkeypatch, {"GRPO_TRAINER_TOOLS": '["python"]', "GRPO_TRAINER_MAX_TURNS": "2"})
    trainer = trainer_settings(["--config", str(ROOT / "deploy" / "compose" / "trainer.yaml")])
    assert trainer.tools == ["python"] and trainer.max_turns == 2 and trainer.tool_call_limit() == 1


def test_episodes_refuse_process_credit_at_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's presets list prm and vineppo; with tools a user gets one line saying why not."""
    config = tmp_path / "trainer.yaml"
    config.write_text(yaml.safe_dump({"preset": "prm", "train_data": "/data/train.jsonl", **TRAINER_TOOLS}))
    clean_env(monkeypatch)
    with pytest.raises(ValueError, match="process credit over multi-turn episodes is not supported"):
        trainer_settings(["--config", str(config)])


def test_the_compose_episode_test_runs_a_valid_override_and_trainer_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/compose/test_compose_episode.py needs Docker; its override and config are checked here without it."""
    extra = override(tmp_path / "tool-model", tmp_path / "episode")
    jsonschema.validate(extra, json.loads((Path(__file__).with_name("compose-spec.json")).read_text()))
    base = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    assert set(extra["services"]) <= set(base) and base["rollout"]["profiles"] == base["trainer"]["profiles"] == ["cpu"]
    command = extra["services"]["trainer"]["command"]
    mounts = {v.split(":")[1] for v in extra["services"]["trainer"]["volumes"]}
    assert command[command.index("--config") + 1].startswith("/episode/") and {"/episode", "/models/tool"} <= mounts
    config = tmp_path / "trainer.yaml"
    config.write_text(yaml.safe_dump(TRAINER))
    clean_env(monkeypatch, {"GRPO_TRAINER_RUN_ID": "episode"})
    trainer = trainer_settings(["--config", str(config)])
    assert trainer.tools == ["python"] and trainer.skip_zero_variance is False and trainer.episode_tokens() == 72
