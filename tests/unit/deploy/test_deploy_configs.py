"""The config files and environment variables the deployments hand to the services are
accepted by the services' own settings classes (a typo would fail at start-up in a pod)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from grpo.reward.settings import parse_settings as reward_settings
from grpo.rollout.settings import parse_settings as rollout_settings
from grpo.trainer.config import parse_settings as trainer_settings
from tests.support.compose_env import compose_env, local_secret_paths, write_secrets

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "k8s" / "grpo"
PARSERS = {"reward": reward_settings, "rollout": rollout_settings, "trainer": trainer_settings}
PREFIXES = {"reward": "GRPO_REWARD_", "rollout": "GRPO_ROLLOUT_", "trainer": "GRPO_TRAINER_"}


def parse(service: str, config: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str] | None = None) -> Any:
    for name in list(os.environ):
        if name.startswith("GRPO_"):
            monkeypatch.delenv(name)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    return PARSERS[service](["--config", str(config)])


def service_env(service: str, variables: dict[str, str], secrets: Path) -> dict[str, str]:
    """What compose gives the service's container ('' values kept), its secret files at their local paths."""
    env = {k: v for k, v in compose_env(service, variables).items() if k.startswith("GRPO_")}
    return local_secret_paths(env, secrets)


@pytest.mark.parametrize("service", list(PARSERS))
def test_compose_config_files_are_valid_settings(service: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = service_env(service, {}, write_secrets(tmp_path, {}))
    settings = parse(service, ROOT / "deploy" / "compose" / f"{service}.yaml", monkeypatch, env)
    if service == "trainer":
        assert str(settings.train_data) == "/data/train.jsonl"
        assert settings.run_id == "compose"
        assert [stage["mode"] for stage in settings.stages] == ["sft", "grpo"]
        for name in ("train", "sft", "eval"):
            shipped = ROOT / "k8s" / "grpo" / "files" / f"{name}.jsonl"
            assert shipped.stat().st_size > 10_000
    if service == "rollout":
        assert settings.run == "compose"
        assert settings.reward_addr == "reward:7052"
    if service != "reward":  # Redis with the generated password, read from the secret's file
        password = (tmp_path / "redis" / "password").read_text()
        assert settings.redis_url == f"redis://:{password}@redis:6379/0" and len(password) == 48


def test_compose_uses_exact_sampler_logprobs_only_with_the_hf_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """sampler_exact takes the sampler's log-probs as π_old: true only of the hf engine in fp32. The gpu profile's
    vLLM samples in bf16, so its trainer recomputes π_old (and caps stale groups' weights, TIS) instead."""
    config = ROOT / "deploy" / "compose" / "trainer.yaml"
    for service, exact in (("trainer", True), ("trainer-gpu", False)):
        env = service_env(service, {}, write_secrets(tmp_path, {}))
        assert parse("trainer", config, monkeypatch, env).sampler_exact is exact, service


def rendered(values: dict[str, Any]) -> list[dict[str, Any]]:
    files = helm_python.Chart.load(str(CHART)).render(values, name="demo", namespace="grpo")
    return [d for path, text in files.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("values_file", [None, "values-cpu.yaml", "values-gpu.yaml"])
def test_helm_config_and_env_are_valid_settings(
    values_file: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = yaml.safe_load((CHART / values_file).read_text()) if values_file else {}
    docs = rendered(values)
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "demo-grpo-config")
    workloads = {
        d["metadata"]["name"].rsplit("-", 1)[-1]: d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
    }
    for service in PARSERS:
        path = tmp_path / f"{service}.yaml"
        path.write_text(config["data"][f"{service}.yaml"])
        container = workloads[service]["spec"]["template"]["spec"]["containers"][0]
        # Plain-value env vars the chart sets must be fields of the service's settings.
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e and e["name"].startswith("GRPO_")}
        env = {k: v.replace("$(POD_IP)", "10.0.0.7") for k, v in env.items() if k.startswith(PREFIXES[service])}
        settings = parse(service, path, monkeypatch, env)
        assert settings is not None
        args = container.get("args", [])
        assert args[args.index("--config") + 1] == f"/etc/grpo/{service}.yaml"


def test_a_typo_in_a_config_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "trainer.yaml"
    bad.write_text("train_data: /data/train.jsonl\nmax_stalenes: 1\n")
    with pytest.raises((SystemExit, ValueError)):
        parse("trainer", bad, monkeypatch)


COMPOSE_VARIABLES = {
    "nothing set": {},
    "one API token": {"GRPO_API_TOKEN": "api-s3cret"},
    "API and weights tokens": {"GRPO_API_TOKEN": "api-s3cret", "GRPO_WEIGHTS_TOKEN": "w-s3cret"},
}


@pytest.mark.parametrize("case", list(COMPOSE_VARIABLES))
def test_compose_tokens_pair_up_client_to_server(case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each caller sends exactly the token its callee demands: reward ← rollout, rollout ← trainer's push. With
    nothing set that is the token init-secrets generated, never none (an unset ${VAR:-} is '', meaning unset)."""
    variables = COMPOSE_VARIABLES[case]
    secrets = write_secrets(tmp_path, variables)
    s = {
        service: parse(service, ROOT / "deploy" / "compose" / f"{service}.yaml", monkeypatch,
                       service_env(service, variables, secrets))
        for service in PARSERS
    }  # fmt: skip
    api = variables.get("GRPO_API_TOKEN") or (secrets / "api" / "token").read_text()
    assert api and len(api) >= 10
    weights = variables.get("GRPO_WEIGHTS_TOKEN") or api
    assert s["reward"].token == api and s["rollout"].token == api and s["trainer"].token == api
    assert s["rollout"].reward_token == s["reward"].token
    assert (s["rollout"].weights_token or s["rollout"].token) == weights == s["trainer"].weights_token


def test_an_empty_optional_setting_is_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "rollout.yaml"
    config.write_text("reward_tls_ca_file: ''\n")
    settings = parse("rollout", config, monkeypatch, {"GRPO_ROLLOUT_TOKEN": "", "GRPO_ROLLOUT_REWARD_TOKEN": "  "})
    assert (settings.token, settings.reward_token, settings.reward_tls_ca_file) == (None, None, None)


def test_grpo_up_runs_exactly_the_compose_run() -> None:
    """deploy/local/stack.yaml's trainer section is deploy/compose/trainer.yaml with the data at its local path."""
    compose = yaml.safe_load((ROOT / "deploy" / "compose" / "trainer.yaml").read_text())
    local = yaml.safe_load((ROOT / "deploy" / "local" / "stack.yaml").read_text())["trainer"]
    as_local = json.loads(json.dumps(compose).replace('"/data/', '"k8s/grpo/files/'))
    assert local == as_local
    for path in (local["train_data"], local["eval_data"], local["stages"][0]["train_data"]):
        assert (ROOT / path).is_file(), path


def test_the_chart_cpu_values_run_exactly_the_compose_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """values-cpu.yaml's trainer.yaml is deploy/compose/trainer.yaml (run id and backend aside)."""
    values = yaml.safe_load((CHART / "values-cpu.yaml").read_text())
    config = next(d for d in rendered(values) if d["metadata"]["name"] == "demo-grpo-config")
    chart = yaml.safe_load(config["data"]["trainer.yaml"])
    compose = yaml.safe_load((ROOT / "deploy" / "compose" / "trainer.yaml").read_text())
    assert {k: v for k, v in chart.items() if k not in ("run_id", "backend")} == compose
    assert yaml.safe_load(config["data"]["rollout.yaml"])["torch_threads"] == 1
