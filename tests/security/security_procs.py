"""Start-up helpers for the security tier, borrowed from the service tier (reward processes, rollout_proc)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SERVICE_DIR = Path(__file__).resolve().parents[1] / "service"
if str(SERVICE_DIR) not in sys.path:
    sys.path.insert(0, str(SERVICE_DIR))  # rollout_proc, test_trainer_service
_spec = importlib.util.spec_from_file_location("grpo_service_tier_conftest", SERVICE_DIR / "conftest.py")
assert _spec is not None and _spec.loader is not None
if _spec.name not in sys.modules:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _module  # dataclasses look their module up here
    _spec.loader.exec_module(_module)
service_tier = sys.modules[_spec.name]
start_reward_service = service_tier.start_reward_service
stop_reward_service = service_tier.stop_reward_service

# Short deadlines so a fuzzer's worst case (a 3600 s timeout on hard sympy input) costs seconds, not minutes.
TIGHT = ("--max-timeout-s", "8", "--math-timeout-s", "2", "--code-timeout-s", "2", "--max-code-timeout-s", "3")
