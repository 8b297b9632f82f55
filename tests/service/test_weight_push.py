"""The trainer's weight push to real replicas when one of them is down."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from grpo.common.net import free_port
from grpo.common.registry import ReplicaInfo
from grpo.common.tiny_model import ensure_tiny_model
from tests.support.rollout_proc import start_rollout_service
from tests.support.trainer_proc import trainer_config

NO_REPLICA = "no replica accepted version"


def test_a_replica_down_is_no_error_while_another_serves_the_version(
    tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Replica `up` takes version 8; `down` is still registered but nothing listens. The next sync (the loop
    calls it again at the top of the next step) pushes only to `down`, fails, and must not say that no replica
    took version 8. With only `down` live, version 9 really has no taker: that is still an error."""
    from grpo.trainer.config import TrainerSettings
    from grpo.trainer.control import RunControl
    from grpo.trainer.run import GrpoRun

    up = start_rollout_service("--model", str(ensure_tiny_model()), log_dir=tmp_path)
    config = json.loads(trainer_config(tmp_path, "half", redis_url, push_timeout_s=5, push_retries=0).read_text())
    run = GrpoRun(TrainerSettings(**config), RunControl())
    try:
        down = ReplicaInfo("down", f"127.0.0.1:{free_port()}", 0, "", time.time())
        run.registry.heartbeat(down)
        run.registry.heartbeat(ReplicaInfo("up", up.address, 0, "", time.time(), weights_data_port=up.data_port))
        run.learner.set_version(8)
        with caplog.at_level(logging.DEBUG, logger="grpo.trainer"):
            run._sync_replicas()  # after a step: both are targets, `up` takes it
            run._sync_replicas()  # the next step's start: only `down` is a target
        assert run.confirmed == {"up": 8}
        pushes = [r.message for r in caplog.records if "pushed version 8 to up" in r.message or "to down" in r.message]
        assert len(pushes) == 3, pushes  # `up` once, `down` twice: the second sync did run and fail
        # One INFO line per push, not one per replica and another for the push (each failure has its own ERROR).
        info = [r.message for r in caplog.records if r.levelno == logging.INFO and "version 8" in r.message]
        assert [m.split(" in ")[0] for m in info] == ["pushed version 8 to 1 of 2 replicas",
                                                      "pushed version 8 to 0 of 1 replicas"], info  # fmt: skip
        assert not [r.message for r in caplog.records if NO_REPLICA in r.message]

        caplog.clear()
        run.learner.set_version(9)
        with caplog.at_level(logging.ERROR, logger="grpo.trainer"):
            run._sync_replicas([down])
        assert [r.message for r in caplog.records if NO_REPLICA in r.message] == [
            f"{NO_REPLICA} 9; its groups will be dropped as stale until one does"
        ]
    finally:
        run.close()
        up.stop()
