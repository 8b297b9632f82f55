"""docker-compose.yml validates against the Compose specification and wires the services
the way the deployment promises (health checks, dependencies, profiles, scaling)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
# Vendored so the test runs from a fresh clone, offline: schema/compose-spec.json of
# https://github.com/compose-spec/compose-spec (Apache License 2.0).
SCHEMA = Path(__file__).with_name("compose-spec.json")


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
            assert cond == {"condition": "service_healthy"}, (name, dep)
    assert set(services["trainer"]["depends_on"]) == {"redis", "reward", "rollout"}
    assert set(services["trainer-gpu"]["depends_on"]) == {"redis", "reward", "rollout-gpu"}


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
    assert rollout["environment"]["GRPO_ROLLOUT_REDIS_URL"].startswith("redis://redis:")


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
