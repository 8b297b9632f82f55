"""The doctor's rules in the trainer: a symptom is warned once when it shows, not again each check."""

from __future__ import annotations

import logging

import pytest

from grpo.algo.presets import PRESETS
from grpo.trainer.live_doctor import EVERY_STEPS, LiveDoctor
from tests.support.doctor_runs import const, run


def feed(doctor: LiveDoctor, rows: list[dict[str, object]]) -> None:
    for row in rows:
        step = int(row["step"])  # type: ignore[call-overload]
        doctor.observe(step, {k: v for k, v in row.items() if k != "step"})


def test_a_symptom_is_warned_once_and_a_healthy_run_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="grpo.trainer.live_doctor")
    doctor = LiveDoctor(PRESETS["grpo"], max_staleness=1)
    feed(doctor, run(40))
    assert doctor.findings == [] and "doctor:" not in caplog.text

    doctor = LiveDoctor(PRESETS["grpo"], max_staleness=1)
    feed(doctor, run(40, rollout__truncation_rate=const(0.4)))  # four of ten completions cut by the budget
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("doctor: truncation")]
    assert len(warned) == 1, warned  # checks at steps 10, 20, 30 and 40 found it; it was said once
    assert [f.rule for f in doctor.findings] == ["truncation"]
    assert len(doctor.rows) == 40 and 40 % EVERY_STEPS == 0
