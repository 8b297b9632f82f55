"""The trainer's HTTP side on a real server: liveness vs readiness, and /metrics before the first step."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from grpo.common.http_server import HttpServer
from grpo.trainer.control import RunControl
from grpo.trainer.http_api import http_routes


@pytest.fixture
def served() -> Iterator[tuple[RunControl, str]]:
    control = RunControl("run-1", total_steps=10)
    server = HttpServer(http_routes(control, CollectorRegistry()), "127.0.0.1", 0)
    server.start()
    try:
        yield control, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_readiness_is_separate_from_liveness(served: tuple[RunControl, str]) -> None:
    control, url = served
    assert get(f"{url}/healthz")[0] == 200  # alive while it loads
    code, body = get(f"{url}/readyz")
    assert code == 503 and json.loads(body)["missing"] == ["the run is starting"]
    control.update(phase="grpo")
    assert get(f"{url}/readyz")[0] == 200
    redis_down: list[str | None] = ["cannot reach redis://127.0.0.1:1/0"]
    control.readiness.add("redis", lambda: redis_down[0])
    code, body = get(f"{url}/readyz")
    assert code == 503 and json.loads(body)["missing"] == ["redis: cannot reach redis://127.0.0.1:1/0"]
    assert get(f"{url}/healthz")[0] == 200  # a dependency down is not a reason to restart the trainer
    redis_down[0] = None
    assert get(f"{url}/readyz")[0] == 200
    control.update(phase="failed", error="boom")
    assert get(f"{url}/healthz")[0] == 503 and get(f"{url}/readyz")[0] == 503


def test_metrics_describe_the_run_before_the_first_step(served: tuple[RunControl, str]) -> None:
    control, url = served
    code, text = get(f"{url}/metrics")
    assert code == 200
    assert "grpo_trainer_run_step 0.0" in text and "grpo_trainer_run_total_steps 10.0" in text
    assert 'grpo_trainer_run_phase{phase="starting"} 1.0' in text
    control.update(phase="grpo", step=3, dropped={"stale": 2}, tasks_published=40)
    text = get(f"{url}/metrics")[1]
    assert "grpo_trainer_run_step 3.0" in text and "grpo_trainer_run_tasks_published 40.0" in text
    assert 'grpo_trainer_run_dropped{reason="stale"} 2.0' in text
    assert 'grpo_trainer_run_phase{phase="grpo"} 1.0' in text


def test_status_needs_the_token_and_probes_stay_open() -> None:
    control = RunControl("run-1")
    server = HttpServer(http_routes(control, CollectorRegistry()), "127.0.0.1", 0, token="s3cret")
    server.start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{url}/v1/status")[0] == 401
        request = urllib.request.Request(f"{url}/v1/status", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.loads(response.read())["run_id"] == "run-1"
        assert [get(f"{url}{path}")[0] for path in ("/healthz", "/readyz", "/metrics")] == [200, 503, 200]
    finally:
        server.stop()


SIGNAL_SCRIPT = """
import os, signal, sys, time
from grpo.trainer.control import RunControl
from grpo.trainer.service import install_signal_handlers
control = RunControl("r")
control.update(phase=sys.argv[1])
install_signal_handlers(control)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("stopping" if control.stopping else "running")
"""


@pytest.mark.parametrize(("phase", "code", "out"), [("starting", 143, ""), ("grpo", 0, "stopping")])
def test_sigterm_exits_at_once_while_starting_and_finishes_the_step_later(phase: str, code: int, out: str) -> None:
    """Loading a large model takes minutes and there is nothing to checkpoint yet; mid-run the step is finished."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SIGNAL_SCRIPT, phase], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (code, out), done.stderr[-2000:]


def test_dropped_counts_tasks_and_duplicate_groups_are_reported_beside_it(served: tuple[RunControl, str]) -> None:
    """published = trained + dropped + in_flight holds on /metrics: duplicates and superseded groups settle no
    task, so they have gauges of their own instead of a reason inside grpo_trainer_run_dropped."""
    control, url = served
    control.update(phase="grpo", tasks_published=12, groups_trained=8, dropped={"zero_variance": 3}, in_flight=1,
                   duplicates=2, superseded=1)  # fmt: skip
    text = get(f"{url}/metrics")[1]
    assert "# HELP grpo_trainer_run_dropped tasks dropped, by reason" in text
    assert 'grpo_trainer_run_dropped{reason="zero_variance"} 3.0' in text and 'reason="duplicate"' not in text
    assert "grpo_trainer_run_duplicate_groups 2.0" in text and "grpo_trainer_run_superseded_groups 1.0" in text
    status = json.loads(get(f"{url}/v1/status")[1])
    assert (status["duplicates"], status["superseded"]) == (2, 1)
