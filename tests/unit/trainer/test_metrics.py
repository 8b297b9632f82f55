"""MetricsSink writes TensorBoard events, JSONL lines and Prometheus gauges."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from grpo.trainer.metrics import MetricsSink, prometheus_name


def test_sink_fans_out(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    with MetricsSink(
        tensorboard_dir=tmp_path / "tb", jsonl_path=tmp_path / "m.jsonl", prometheus_registry=registry
    ) as sink:
        sink.log(1, {"loss": 0.5, "reward/mean": 0.25})
        sink.log(2, {"loss": 0.25, "kl": float("nan")})
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in lines] == [(1, 0.5), (2, 0.25)] and lines[1]["kl"] == "nan"

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 0.5), (2, 0.25)]

    exposed = generate_latest(registry).decode()
    assert "grpo_trainer_loss 0.25" in exposed and "grpo_trainer_reward_mean 0.25" in exposed
    assert prometheus_name("clip-frac/high") == "grpo_trainer_clip_frac_high"


def test_wandb_offline_run_records_the_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B in offline mode (no network): the run directory holds the logged history."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = MetricsSink(wandb_project="grpo-test", wandb_run_name="unit", run_config={"lr": 0.1})
    sink.log(1, {"loss": 0.5, "reward/mean": 1.0})
    sink.log(2, {"loss": 0.25, "reward/mean": 1.5})
    sink.close()
    logs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1
    # The offline log holds the history items as (key, value_json) records. wandb-core (its own process)
    # may still be writing them when finish() returns (seen in CI: only the 7-byte file header), so wait.
    deadline = time.monotonic() + 20
    while b"1.5" not in (record := logs[0].read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert b"reward/mean" in record and b"0.25" in record and b"1.5" in record


def test_a_resumed_run_writes_each_step_once(tmp_path: Path) -> None:
    """Crashed at step 13 after a checkpoint at 10: the resumed run logs 11–13 again, and only those count."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    paths = {"tensorboard_dir": tmp_path / "tb", "jsonl_path": tmp_path / "m.jsonl"}
    with MetricsSink(**paths, start_step=-1) as sink:
        for step in range(0, 14):
            sink.log(step, {"loss": 1.0})
    # TensorBoard reads a folder's event files in name order: the creation second first, last a per-process counter
    # compared as text ("10" sorts before "9"). A resumed run starts in a later second; so does this one.
    time.sleep(1.1)
    with MetricsSink(**paths, start_step=10) as sink:
        for step in range(11, 16):
            sink.log(step, {"loss": 2.0})
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(16))
    assert [r["loss"] for r in rows] == [1.0] * 11 + [2.0] * 5
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")][-6:] == [(10, 1.0)] + [(s, 2.0) for s in range(11, 16)]
    with MetricsSink(**paths, start_step=-1):  # a fresh run in the same folder starts a fresh file
        pass
    assert (tmp_path / "m.jsonl").read_text() == ""


def test_a_row_cut_short_by_a_crash_is_dropped_on_resume(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Killed mid-write: the cut last line neither stops the restart nor swallows the next row."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n{"step": 3, "tasks/publ')
    with MetricsSink(jsonl_path=path, start_step=2) as sink:
        sink.log(3, {"x": 3.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert "dropping 1 line(s) that are not a JSON row" in caplog.text
    path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n{"step": 3, "x"')  # nothing after the start step
    with MetricsSink(jsonl_path=path, start_step=5) as sink:
        sink.log(6, {"x": 6.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 6]


def test_task_types_that_share_a_prometheus_name_do_not_stop_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """task/a-b/... and task/a_b/... are both grpo_trainer_task_a_b_...: the second is warned about and kept out of
    Prometheus only; every step still logs both to the JSONL file."""
    registry = CollectorRegistry()
    with caplog.at_level("WARNING"), MetricsSink(jsonl_path=tmp_path / "m.jsonl", prometheus_registry=registry) as sink:
        sink.log(1, {"task/a-b/groups": 1.0, "task/a_b/groups": 2.0})
        sink.log(2, {"task/a-b/groups": 3.0, "task/a_b/groups": 4.0})
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(r["task/a-b/groups"], r["task/a_b/groups"]) for r in rows] == [(1.0, 2.0), (3.0, 4.0)]
    assert "grpo_trainer_task_a_b_groups 3.0" in generate_latest(registry).decode()
    assert caplog.text.count("is not exported to Prometheus") == 1 and "'task/a_b/groups'" in caplog.text
