"""Security-tier fixtures: a reward service with tight limits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import sandbox_mode
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service
from tests.support.security_procs import TIGHT


@pytest.fixture(scope="module")
def tight_reward() -> Iterator[RewardService]:
    """A reward service (2 workers) with short deadlines, for this module; must be alive at the end."""
    service = start_reward_service(*TIGHT, workers=2, env=sandbox_mode.service_env())
    try:
        yield service
        service.assert_alive()
    finally:
        stop_reward_service(service)
