"""Plug-ins and the optional reward model through a running service (one instance with both enabled)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.reward.helpers import save_tiny_reward_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"))


def test_plugins_and_reward_model(start_reward: Callable[..., Any], tiny_rm: Path) -> None:
    plugins = {
        "length": "tests.unit.reward.test_plugins:length_reward",
        "broken": "tests.unit.reward.test_plugins:raises",
    }
    env = {
        "PYTHONPATH": str(REPO),
        "GRPO_REWARD_PLUGINS": json.dumps(plugins),
        "GRPO_REWARD_REWARD_MODEL_PATH": str(tiny_rm),
        "OMP_NUM_THREADS": "1",
    }
    service = start_reward(workers=1, env=env)
    items = [
        {"id": "a", "prompt": "hi", "completion": "abcd", "checks": {"plugins": {"length": {}}, "reward_model": {}}},
        {"id": "b", "completion": "", "checks": {"plugins": {"length": {}}}},
        {"id": "c", "completion": "ab", "checks": {"plugins": {"length": {"kwargs": {"scale": 4}}}}},
        {"id": "d", "completion": "ab", "checks": {"plugins": {"broken": {}}, "format": {}}},
    ]
    r = httpx.post(f"{service.http_url}/v1/score", json={"items": items}, timeout=120)
    assert r.status_code == 200, r.text
    results = {res["id"]: res for res in r.json()["results"]}
    rm_score = results["a"]["components"]["reward_model"]["score"]
    assert isinstance(rm_score, float)
    assert results["a"]["reward"] == pytest.approx(0.25 + rm_score)
    assert results["b"]["reward"] is None and "cannot_judge" in results["b"]["error"]  # plug-in returned None
    assert results["c"]["reward"] == pytest.approx(2.0)  # per-item kwargs reach the plug-in column-wise
    assert results["d"]["status"] == "error" and results["d"]["reward"] is None  # a raising plug-in is never a 0
    assert "plug-in bug" in results["d"]["error"]
