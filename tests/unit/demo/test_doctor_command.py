"""`grpo doctor RUN_DIR` end to end on run folders written by the test, and the doctor kept in step with the trainer.

The metrics.jsonl files are written by the trainer's own MetricsSink, so their format cannot drift from the
trainer's; the metric names the rules read are checked against those the trainer's code really logs (its
group_metrics, policy_loss's diagnostics, the accounting's verdicts, and the keys its loop adds, listed from
run.py as tests/unit/deploy/test_dashboard_metrics.py lists them), and every setting a remedy names against the
settings classes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import yaml

from grpo.cli.main import main
from grpo.common.doctor import RULES, RunSettings, diagnose
from grpo.local.stack import StackSpec
from grpo.rollout.settings import RolloutSettings
from grpo.trainer.accounting import GROUP_VERDICTS
from grpo.trainer.config import TrainerSettings
from grpo.trainer.metrics import MetricsSink
from tests.support.doctor_runs import const, ramp, run

# What GrpoRun's loop adds to a step's row beside group_metrics, the Learner's train/* and the accounting's books
# (grpo.trainer.run: _collect and run).
LOOP_KEYS = {"groups/zero_variance_fraction", "groups/refills", "staleness/mean", "staleness/max",
             "time/wait_rollouts_s", "time/push_s", "time/step_s", "policy_version",
             "train/beta", "train/steps_since_ref_refresh"}  # fmt: skip


def write_run(folder: Path, rows: list[dict[str, Any]], trainer: dict[str, Any] | None = None) -> Path:
    """A run folder as `grpo up` leaves it: metrics.jsonl (through the trainer's sink) and config/trainer.yaml."""
    with MetricsSink(jsonl_path=folder / "metrics.jsonl") as sink:
        for row in rows:
            sink.log(int(row["step"]), {k: v for k, v in row.items() if k != "step"})
    if trainer is not None:
        (folder / "config").mkdir()
        (folder / "config" / "trainer.yaml").write_text(yaml.safe_dump(trainer))
    return folder


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["doctor", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_healthy_run_is_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_run(tmp_path / "r1", run(), {"preset": "grpo", "max_staleness": 1, "group_size": 8})
    code, out, _ = doctor(capsys, str(folder))
    assert code == 0 and out == f"grpo doctor: {folder}, steps 1–40: no symptom found\n"
    code, out, _ = doctor(capsys, "--json", str(folder))
    shown = json.loads(out)
    assert code == 0 and shown["findings"] == [] and shown["steps"] == [1, 40]
    # β, the refresh and refills are the preset's; G and max_staleness what the file set.
    assert shown["settings"] == {"beta": 0.001, "ref_refresh_steps": 400, "group_size": 8, "max_staleness": 1,
                                 "refill_zero_variance": False}  # fmt: skip


def test_a_sick_run_names_symptom_evidence_and_remedy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """β small and the reference never refreshed; a reward that pays length (the issue's runs made to fail)."""
    rows = run(**{"train/kl": lambda step, t: 0.9 if step == 30 else 0.1, "rollout/truncation_rate": ramp(0.0, 0.3),
                  "rollout/accuracy": const(0.45), "rollout/reward/math_mean": const(0.45),
                  "rollout/response_len_mean": ramp(16, 40)})  # fmt: skip
    folder = write_run(tmp_path / "r2", rows, {"preset": "grpo", "beta": 0.001, "ref_refresh_steps": 0})
    code, out, _ = doctor(capsys, str(folder))
    assert code == 1 and out.startswith(f"grpo doctor: {folder}, steps 1–40: 3 symptom(s)\n"), out
    assert "kl_spike: KL to the reference spikes\n  evidence: train/kl 0.9 at step 30" in out
    assert "beta 0.001, ref_refresh_steps 0" in out and "  remedy:   raise beta" in out
    assert "reward_hacking:" in out and "tokens while rollout/accuracy went 0.45 → 0.45" in out and "truncation:" in out
    code, out, _ = doctor(capsys, "--json", str(folder))
    shown = json.loads(out)
    assert code == 1 and [f["rule"] for f in shown["findings"]] == ["reward_hacking", "truncation", "kl_spike"]
    assert shown["findings"][2]["steps"] == [30, 30] and shown["settings"]["group_size"] == 16  # grpo's G


def test_settings_come_from_the_preset_and_a_stage(tmp_path: Path) -> None:
    from grpo.cli.doctor import run_settings

    folder = write_run(tmp_path / "r3", run(3), {"preset": "dapo", "stages": [{"mode": "sft"}, {"mode": "grpo",
                                                                                              "beta": 0.01}]})  # fmt: skip
    assert run_settings(folder) == RunSettings(beta=0.0, ref_refresh_steps=0, group_size=16, max_staleness=0,
                                               refill_zero_variance=True)  # fmt: skip
    assert run_settings(folder / "stage-2-grpo").beta == 0.01  # the stage's own value over the run's
    assert run_settings(tmp_path) == RunSettings()  # no config: nothing known


def test_bad_input_is_exit_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = doctor(capsys, str(tmp_path / "nowhere"))
    assert code == 2 and out == "" and f"no run folder {tmp_path / 'nowhere'}" in err and err.count("\n") == 1
    code, _, err = doctor(capsys, str(tmp_path))
    assert code == 2 and f"no metrics.jsonl in {tmp_path}" in err and err.count("\n") == 1
    write_run(tmp_path / "stage-2-grpo", run(3))
    code, _, err = doctor(capsys, str(tmp_path))
    assert code == 2 and "is a staged run: give one stage's folder (stage-2-grpo)" in err
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "metrics.jsonl").write_text('{"step": 1, "rollout/rew')  # a crash mid-write
    code, _, err = doctor(capsys, str(tmp_path / "cut"))
    assert code == 2 and "holds no metrics row" in err


def test_a_run_id_under_runs_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "demo-1", run())
    code, out, _ = doctor(capsys, "--runs-dir", str(tmp_path), "demo-1")
    assert code == 0 and "no symptom found" in out


class RecordingRow(dict[str, Any]):
    """A metrics row that remembers every key a rule reads from it."""

    read: ClassVar[set[str]] = set()

    def get(self, key: str, default: Any = None) -> Any:
        RecordingRow.read.add(key)
        return super().get(key, default)


def trainer_keys() -> set[str]:
    """The keys a GRPO step's row holds, from the trainer's own code on two tiny groups and a tiny loss."""
    from grpo.algo import policy_loss
    from grpo.trainer.accounting import Accounting
    from grpo.trainer.consumer import group_metrics, group_spread
    from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2

    samples = [
        queue_pb2.SampleRecord(
            completion=rollout_pb2.Completion(token_ids=[7, 8], logprobs=[-0.5, -0.5], finish_reason=finish),
            components={name: reward_pb2.ComponentResult(score=score, status="ok") for name in ("math", "format")},
            reward=score,
        )
        for finish, score in (("stop", 1.0), ("length", 0.0))
    ]
    groups = [queue_pb2.GroupRecord(group_id=g, samples=samples, status="ok") for g in ("g1", "g2")]
    keys = set(group_metrics(groups)) | set(group_spread(groups))
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]])
    _, losses = policy_loss(
        logp, logp - 0.1, torch.tensor([1.0, -1.0]), torch.ones(2, 2), clip_low=0.2, clip_high=0.2, beta=0.001,
        kl_kind="k3", agg="token_mean", ratio_level="token", tis_cap=2.0, ref_logp=logp - 0.2, sampler_logp=logp,
    )  # fmt: skip
    keys |= {f"train/{k}" for k in losses} | {f"groups/{v}" for v in GROUP_VERDICTS} | LOOP_KEYS
    from grpo.trainer.run import NO_PUSHES  # the push/* counts every step logs

    return keys | set(Accounting().summary()) | set(NO_PUSHES)


def test_the_rules_read_only_metrics_the_trainer_logs() -> None:
    keys = trainer_keys()
    RecordingRow.read = set()
    diagnose([RecordingRow(step=s, **{k: 0.5 for k in keys}) for s in range(1, 41)])
    read = RecordingRow.read - {"step"}
    assert {"train/kl", "train/tis_weight_mean", "rollout/truncation_rate", "time/step_s"} <= read  # it records
    assert read <= keys, f"the doctor reads metrics no trainer logs: {sorted(read - keys)}"


def test_every_remedy_names_real_settings() -> None:
    """`reward_weights`, `rollout.engine`, `stack.replicas`: the trainer's fields, or the rollout's, or the stack
    file's, by their real names."""
    sick = run(**{"rollout/reward_mean": const(0.9), "groups/zero_variance_fraction": const(0.7),
                  "rollout/accuracy": const(0.5), "rollout/reward/format_mean": ramp(0.98, 0.5),
                  "rollout/truncation_rate": const(0.3), "train/kl": const(0.7), "train/clip_frac": const(0.4),
                  "train/tis_weight_mean": const(0.7), "groups/stale": const(20.0), "time/wait_rollouts_s": const(3.9)})  # fmt: skip
    found = [
        rule(rows, settings)
        for rule in RULES.values()
        for rows in (sick, run(**{"rollout/reward_mean": ramp(0.5, 1.5), "rollout/reward/format_mean": ramp(1, 0.5)}))
        for settings in (
            RunSettings(),
            RunSettings(beta=0.1, ref_refresh_steps=5, group_size=8, max_staleness=0, refill_zero_variance=True),
        )
    ]
    named = {name for f in found if f is not None for name in f.settings}
    assert {f.rule for f in found if f is not None} == set(RULES)  # every rule's remedies were looked at
    spaces = {"rollout": set(RolloutSettings.model_fields), "stack": {f.name for f in dataclasses.fields(StackSpec)}}
    wrong = [n for n in named if n not in TrainerSettings.model_fields and
             n.partition(".")[2] not in spaces.get(n.partition(".")[0], set())]  # fmt: skip
    assert not wrong, f"remedies name settings that do not exist: {wrong}"


def test_a_real_demo_run_has_no_symptom(capsys: pytest.CaptureFixture[str]) -> None:
    """`make demo`'s own run (tests/data/demo_run: its metrics.jsonl, the metrics the rules read, and its trainer
    settings), 50 % -> 77 % held-out: a healthy run the doctor must not alarm on."""
    run_dir = Path(__file__).resolve().parents[2] / "data" / "demo_run"
    assert main(["doctor", str(run_dir)]) == 0
    assert "steps 0–200: no symptom found" in capsys.readouterr().out
