"""The demo's settings: its preset choices are the trainer's, the step presets get their step check, and a bad
`grpo demo` option is one line and exit 2."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

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


def test_a_colocated_demo_gives_its_trainer_the_replicas_thread() -> None:
    """docs/colocated.md: `grpo demo --colocate` runs the trainer on 2 threads (it generates and trains in turn on
    what a trainer and a replica had between them), one replica fewer outside it."""
    ports = {"model": "m", "train_data": "t", "eval_data": "e", "redis_url": "r", "run_id": "x", "output_dir": "o",
             "grpc_port": 1, "http_port": 2}  # fmt: skip
    assert DemoConfig(colocate=True).trainer_settings(**ports)["torch_threads"] == 2
    assert DemoConfig().trainer_settings(**ports)["torch_threads"] == 1


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--preset", "foo"], "invalid option --preset foo: Input should be 'grpo', 'dapo',"),
        (["--steps", "0"], "invalid option --steps 0: Input should be greater than or equal to 1"),
        (["--replicas", "0"], "invalid option --replicas 0: Input should be greater than or equal to 1"),
        (["--quick", "--steps", "-3"], "invalid option --steps -3: Input should be greater than or equal to 1"),
    ],
)
def test_a_bad_demo_option_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], line: str
) -> None:
    """Like argparse's own refusals: no traceback, nothing started (no run folder)."""
    from grpo.cli.main import main

    assert main(["--runs-dir", str(tmp_path / "runs"), "demo", *options]) == 2
    err = capsys.readouterr().err
    assert line in err and "Traceback" not in err and "ValidationError" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_every_bad_demo_option_is_named() -> None:
    from pydantic import ValidationError

    from grpo.cli.main import bad_options

    with pytest.raises(ValidationError) as caught:
        DemoConfig(steps=0, replicas=0, max_staleness=-1)
    assert [line.split(":")[0] for line in bad_options(caught.value)] == [
        "invalid option --replicas 0", "invalid option --sync -1", "invalid option --steps 0"
    ]  # fmt: skip


def test_the_demo_report_measures_before_and_after_on_the_same_problems(tmp_path: Path) -> None:
    """Before is the trainer's step-0 evaluation (its eval_size problems, the reward service), not the cold start's
    in-process accuracy on sft_eval_size other problems; that one is kept apart as sft_accuracy."""
    from grpo.demo.demo import demo_report

    settings = DemoConfig.quick().trainer_settings(
        model="m", train_data="t", eval_data="e", redis_url="", run_id="r", output_dir="o", grpc_port=0, http_port=0
    )
    assert settings["eval_before_train"] is True
    rows = [{"step": 0, "eval/accuracy": 0.3, "eval/judged": 100, "eval/unjudged": 0, "eval/failed": 0,
             "eval/missing": 0}, {"step": 40, "eval/accuracy": 0.5, "eval/judged": 100, "eval/unjudged": 0,
             "eval/failed": 0, "eval/missing": 0}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = demo_report(tmp_path, wall_seconds=1.0, extra={"sft_accuracy": 0.45})
    assert summary["eval_accuracy_before"] == 0.3 and summary["eval_before_problems"] == 100
    assert summary["sft_accuracy"] == 0.45 and abs(summary["eval_accuracy_gain"] - 0.2) < 1e-9
