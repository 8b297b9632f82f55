"""The demo's settings: its preset choices are the trainer's, and the step presets get their step check."""

from __future__ import annotations

import typing

from grpo.demo.config import DemoConfig


def test_the_demo_offers_every_trainer_preset() -> None:
    from grpo.trainer.config import PRESETS

    assert set(typing.get_args(DemoConfig.model_fields["preset"].annotation)) == set(PRESETS)


def test_step_presets_get_the_scratchpad_rule() -> None:
    ports = {"model": "m", "train_data": "t", "eval_data": "e", "redis_url": "r", "run_id": "x", "output_dir": "o",
             "grpc_port": 1, "http_port": 2}  # fmt: skip
    for preset in ("prm", "vineppo"):
        settings = DemoConfig(preset=preset).trainer_settings(**ports)
        assert settings["step_check"] == {"source": "rule", "rule": "column_addition"}
    assert "step_check" not in DemoConfig(preset="grpo").trainer_settings(**ports)
