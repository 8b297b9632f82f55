"""Security-tier fixtures: reward services with tight limits, built from the service tier's start-up helpers."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SERVICE_DIR = Path(__file__).resolve().parents[1] / "service"
sys.path.insert(0, str(SERVICE_DIR))  # rollout_proc
_spec = importlib.util.spec_from_file_location("service_tier_conftest", SERVICE_DIR / "conftest.py")
assert _spec is not None and _spec.loader is not None
service_tier = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = service_tier  # dataclasses look their module up here
_spec.loader.exec_module(service_tier)
start_reward_service = service_tier.start_reward_service
stop_reward_service = service_tier.stop_reward_service

# Short deadlines so a fuzzer's worst case (a 3600 s timeout on hard sympy input) costs seconds, not minutes.
TIGHT = ("--max-timeout-s", "8", "--math-timeout-s", "2", "--code-timeout-s", "2", "--max-code-timeout-s", "3")


@pytest.fixture(scope="module")
def tight_reward() -> Iterator[Any]:
    """A reward service (2 workers) with short deadlines, for this module; must be alive at the end."""
    service = start_reward_service(*TIGHT, workers=2)
    try:
        yield service
        service.assert_alive()
    finally:
        stop_reward_service(service)
