"""docker-compose.yml validates against the Compose specification and wires the services
the way the deployment promises (health checks, dependencies, profiles, scaling)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.compose_env import interpolate

ROOT = Path(__file__).resolve().parents[3]
# Vendored so the test runs from a fresh clone, offline: schema/compose-spec.json of
# https://github.com/compose-spec/compose-spec (Apache License 2.0).
SCHEMA = Path(__file__).with_name("compose-spec.json")
OUR_SERVICES = ("reward", "rollout", "trainer", "rollout-gpu", "trainer-gpu")
SECRETS = "init-secrets"  # the one-shot service that writes the token and Redis's password


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_validates_against_the_compose_spec(compose: dict[str, Any]) -> None:
    jsonschema.validate(compose, json.loads(SCHEMA.read_text()))


def test_invalid_compose_is_rejected_by_the_schema(compose: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(compose))
    broken["services"]["reward"]["depends_on"] = {"redis": {"condition": "when_it_feels_like_it"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json.loads(SCHEMA.read_text()))


def test_every_service_has_a_health_check(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if name == SECRETS:  # one-shot: the others wait for it to complete
            continue
        assert "healthcheck" in service, name
        assert service["healthcheck"]["test"][0] == "CMD", name


def test_our_services_are_healthy_only_when_ready(compose: dict[str, Any]) -> None:
    """depends_on waits for `service_healthy`: that must mean /readyz (it can work), not /healthz (it runs)."""
    ports = {"reward": 8002, "rollout": 8001, "trainer": 8003, "rollout-gpu": 8001, "trainer-gpu": 8003}
    for name, port in ports.items():
        probe = " ".join(compose["services"][name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/readyz" in probe, (name, probe)
        assert "/healthz" not in probe, name


def test_dependencies_wait_for_healthy_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("rollout", "trainer", "rollout-gpu", "trainer-gpu"):
        for dep, cond in services[name]["depends_on"].items():
            waits_for = "service_completed_successfully" if dep == SECRETS else "service_healthy"
            assert cond == {"condition": waits_for}, (name, dep)
    assert set(services["trainer"]["depends_on"]) == {SECRETS, "redis", "reward", "rollout"}
    assert set(services["trainer-gpu"]["depends_on"]) == {SECRETS, "redis", "reward", "rollout-gpu"}


def test_cpu_is_the_default_profile_and_gpu_reserves_devices(compose: dict[str, Any]) -> None:
    env = dict(line.split("=", 1) for line in (ROOT / ".env").read_text().split())
    assert env["COMPOSE_PROFILES"] == "cpu"
    services = compose["services"]
    assert services["rollout"]["profiles"] == ["cpu"] and services["trainer"]["profiles"] == ["cpu"]
    for name in ("rollout-gpu", "trainer-gpu"):
        assert services[name]["profiles"] == ["gpu"]
        device = services[name]["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "--engine" in services["rollout-gpu"]["command"]
    assert services["rollout-gpu"]["command"][services["rollout-gpu"]["command"].index("--engine") + 1] == "vllm"


def test_rollout_can_scale(compose: dict[str, Any]) -> None:
    rollout = compose["services"]["rollout"]
    # --scale needs no fixed container name and no fixed host port.
    assert "container_name" not in rollout
    assert "ports" not in rollout
    assert rollout["environment"]["GRPO_ROLLOUT_REDIS_URL_FILE"] == "/run/grpo/redis/url"


def test_redis_persists_with_aof_on_a_volume(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert "redis-data" in compose["volumes"]


def test_volumes_for_models_and_checkpoints_and_mounted_config(compose: dict[str, Any]) -> None:
    trainer = compose["services"]["trainer"]
    assert "checkpoints:/checkpoints" in trainer["volumes"]
    assert "models:/cache" in trainer["volumes"]
    assert any(v.endswith(":/etc/grpo:ro") for v in trainer["volumes"])
    for name in ("reward", "rollout", "trainer"):
        config = compose["services"][name]["command"]
        path = config[config.index("--config") + 1]
        assert (ROOT / "deploy" / "compose" / Path(path).name).is_file(), path


def test_services_are_locked_down(compose: dict[str, Any]) -> None:
    for name in ("reward", "rollout", "trainer"):
        service = compose["services"][name]
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
    assert sorted(compose["services"]["reward"]["cap_add"]) == ["KILL", "SETGID", "SETUID", "SYS_ADMIN"]


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> volume (or host path) of a service's mounts."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}


def secret_path(path: str, compose: dict[str, Any], service: str) -> tuple[str, str]:
    """(volume, file name) holding `path` in `service`, a volume the secrets service writes."""
    folder, name = path.rsplit("/", 1)
    volume = mounts(compose["services"][service])[folder]
    assert mounts(compose["services"][SECRETS])[folder] == volume, (service, path)
    return volume, name


@pytest.mark.parametrize("bind", [None, "0.0.0.0"])
def test_published_ports_are_on_loopback_unless_told(compose: dict[str, Any], bind: str | None) -> None:
    """`docker compose up` published the verifier (code execution) on every interface of the host."""
    variables = {"GRPO_BIND": bind} if bind else {}
    published = [interpolate(str(port), variables) for s in compose["services"].values() for port in s.get("ports", [])]
    assert len(published) >= 3, published  # reward, trainer, trainer-gpu
    for port in published:
        host, _, _ = port.partition(":")
        assert host == (bind or "127.0.0.1"), port


def test_every_service_requires_the_generated_token(compose: dict[str, Any]) -> None:
    """With nothing set, compose still gives every service a token: one generated once, or GRPO_API_TOKEN."""
    services = compose["services"]
    secrets = services[SECRETS]
    assert secrets["restart"] == "no" and "ports" not in secrets and secrets["network_mode"] == "none"
    assert secrets["read_only"] is True and secrets["cap_drop"] == ["ALL"]
    assert secrets["environment"]["GRPO_API_TOKEN"] == "${GRPO_API_TOKEN:-}"
    prefixes = {"reward": "GRPO_REWARD_", "rollout": "GRPO_ROLLOUT_", "trainer": "GRPO_TRAINER_"}
    files = set()
    for name in OUR_SERVICES:
        env, prefix = services[name]["environment"], prefixes[name.split("-")[0]]
        assert f"{prefix}TOKEN" not in env, name  # beside its _FILE it would be refused
        files.add(secret_path(env[f"{prefix}TOKEN_FILE"], compose, name))
        assert services[name]["depends_on"][SECRETS] == {"condition": "service_completed_successfully"}, name
        if name.startswith("rollout"):
            files.add(secret_path(env["GRPO_ROLLOUT_REWARD_TOKEN_FILE"], compose, name))
    assert len(files) == 1, files  # one token for the deployment


def test_redis_requires_the_generated_password(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services[SECRETS]["environment"]["GRPO_REDIS_PASSWORD"] == "${GRPO_REDIS_PASSWORD:-}"
    redis = services["redis"]
    acl = redis["command"][redis["command"].index("--aclfile") + 1]
    acl_volume, _ = secret_path(acl, compose, "redis")
    assert redis["depends_on"][SECRETS] == {"condition": "service_completed_successfully"}
    assert "REDISCLI_AUTH" in " ".join(redis["healthcheck"]["test"])  # the probe authenticates too
    for name, var in (("rollout", "GRPO_ROLLOUT_REDIS_URL"), ("trainer", "GRPO_TRAINER_REDIS_URL"),
                      ("rollout-gpu", "GRPO_ROLLOUT_REDIS_URL"), ("trainer-gpu", "GRPO_TRAINER_REDIS_URL")):  # fmt: skip
        env = services[name]["environment"]
        assert var not in env, name  # the URL carries the password: from the file only
        assert secret_path(env[f"{var}_FILE"], compose, name)[0] == acl_volume, name
    # The reward container (generated code runs there) holds no Redis secret.
    assert acl_volume not in mounts(services["reward"]).values()


def networks(service: dict[str, Any]) -> set[str]:
    return set(service.get("networks") or ["default"])


def test_only_rollout_and_trainer_share_a_network_with_redis(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert not networks(services["reward"]) & networks(services["redis"])
    for name in ("rollout", "trainer", "rollout-gpu", "trainer-gpu"):
        assert networks(services[name]) & networks(services["redis"]), name
    for name in ("rollout", "rollout-gpu"):  # rollout scores with reward; the trainer pushes weights to it
        assert networks(services[name]) & networks(services["reward"]), name
    for trainer, rollout in (("trainer", "rollout"), ("trainer-gpu", "rollout-gpu")):
        assert networks(services[trainer]) & networks(services[rollout])
