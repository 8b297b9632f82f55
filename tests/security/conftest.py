"""Security-tier fixtures: a reward service with tight limits, built from the service tier's start-up helpers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # security_procs, also for the test modules
from security_procs import TIGHT, start_reward_service, stop_reward_service


@pytest.fixture(scope="module")
def tight_reward() -> Iterator[Any]:
    """A reward service (2 workers) with short deadlines, for this module; must be alive at the end."""
    service = start_reward_service(*TIGHT, workers=2)
    try:
        yield service
        service.assert_alive()
    finally:
        stop_reward_service(service)
