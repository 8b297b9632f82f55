"""The doctor's rules in the trainer: a symptom is warned once when it shows, not again each check; and what the
trainer logs for them (the reference's age, how rewards spread across groups)."""

from __future__ import annotations

import logging

import pytest

from grpo.algo.presets import PRESETS
from grpo.trainer.consumer import group_spread
from grpo.trainer.control import StatusSnapshot
from grpo.trainer.grpc_api import to_proto
from grpo.trainer.live_doctor import EVERY_STEPS, LiveDoctor
from grpo.trainer.run import steps_since_ref_refresh
from grpo.v1 import queue_pb2
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


def _group(*correct: int) -> queue_pb2.GroupRecord:
    record = queue_pb2.GroupRecord(group_id="g", status="ok")
    for c in correct:
        sample = record.samples.add(reward=float(c))
        sample.components["math"].score = float(c)
        sample.completion.token_ids.extend([1, 2])
    return record


def test_the_trainer_logs_how_rewards_spread_across_groups() -> None:
    spread = group_spread([_group(1, 1), _group(0, 0), _group(0, 1), _group(1, 1)])
    assert spread["groups/all_solved_fraction"] == 0.5 and spread["groups/none_solved_fraction"] == 0.25
    assert spread["groups/reward_mean_std"] == pytest.approx(0.4146, abs=1e-3)  # std of 1, 0, 0.5, 1
    unjudged = _group(1, 0)
    del unjudged.samples[0].components["math"]  # no correctness on every sample: not judged solved or not
    assert group_spread([unjudged]) == {}  # and one group has no spread across groups
    # groups cut at their probe (2 of 4 here) are left out: short groups agree by chance far more often
    probed = group_spread([_group(1, 1), _group(0, 0, 1, 1), _group(1, 1, 1, 1)], probe_size=2)
    assert probed["groups/all_solved_fraction"] == 0.5 and probed["groups/none_solved_fraction"] == 0.0


def test_the_reference_age_the_trainer_logs() -> None:
    assert [steps_since_ref_refresh(u, 5, 0.04) for u in (1, 4, 5, 6)] == [1, 4, 0, 1]  # refreshed at 5
    assert steps_since_ref_refresh(7, 0, 0.04) == -1  # never refreshed
    assert steps_since_ref_refresh(7, 5, 0.0) == -1  # β 0: no reference at all


def test_the_findings_are_in_the_status_over_http_and_grpc_alike() -> None:
    doctor = LiveDoctor(PRESETS["grpo"], max_staleness=1)
    feed(doctor, run(10, rollout__truncation_rate=const(0.4)))
    snap = StatusSnapshot(run_id="r", doctor=doctor.view())
    (http,) = snap.to_json()["doctor"]
    assert http["rule"] == "truncation" and "max_new_tokens" in http["remedy"] and http["evidence"]
    assert set(http) == {"rule", "symptom", "evidence", "remedy"}
    (rpc,) = to_proto(snap).doctor
    assert (rpc.rule, rpc.symptom, rpc.evidence, rpc.remedy) == tuple(http.values())
    assert StatusSnapshot().to_json()["doctor"] == [] and not to_proto(StatusSnapshot()).doctor
