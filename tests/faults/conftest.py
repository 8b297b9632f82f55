"""Fault-suite fixtures: reach the service tier's process helpers (reward and rollout start-up)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SERVICE_DIR = Path(__file__).resolve().parents[1] / "service"
sys.path.insert(0, str(SERVICE_DIR))  # rollout_proc
_spec = importlib.util.spec_from_file_location("service_tier_conftest_faults", SERVICE_DIR / "conftest.py")
assert _spec is not None and _spec.loader is not None
service_tier = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = service_tier  # dataclasses look their module up here
_spec.loader.exec_module(service_tier)
start_reward_service = service_tier.start_reward_service
stop_reward_service = service_tier.stop_reward_service
