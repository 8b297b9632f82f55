"""MetricsSink writes TensorBoard events, JSONL lines and Prometheus gauges."""

from __future__ import annotations

import json
from pathlib import Path

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
