"""The trainer's start-up errors are one line, never a traceback: a setting (exit 2, before torch loads), the data
of the run or of any of its stages (exit 2, "invalid data: ...", before the first stage trains), or the run's folder
(exit 1, "the run failed: ...", before it waits for Redis or replicas).

Each of these once escaped as a traceback through the catch-all in service.serve.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo.common.net import free_port

ROW = {"prompt": "1 + 1?", "task_type": "math", "gold": "2"}


def run_trainer(argv: list[str], tmp_path: Path, rows: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """The trainer on free ports and a Redis nobody listens on (each error comes before it is used)."""
    data = tmp_path / "train.jsonl"
    data.write_bytes(rows if rows is not None else (json.dumps(ROW) + "\n").encode())
    cmd = [sys.executable, "-m", "grpo.trainer", "--grpc-port", "0", "--http-port", "0", "--host", "127.0.0.1",
           "--train-data", str(data), "--output-dir", str(tmp_path / "out"), "--torch-threads", "1",
           "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--redis-outage-s", "1", *argv]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**env, "OMP_NUM_THREADS": "1"})


def settings_error(argv: list[str], tmp_path: Path) -> str:
    done = run_trainer(argv, tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0].removeprefix("grpo-trainer: invalid settings: ")


def run_error(argv: list[str], tmp_path: Path, rows: bytes | None = None) -> str:
    done = run_trainer(argv, tmp_path, rows)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    failed = [line for line in done.stderr.splitlines() if "the run failed: " in line]
    assert len(failed) == 1, done.stderr[-3000:]
    return failed[0].split("the run failed: ", 1)[1]


def test_a_redis_url_without_a_redis_scheme(tmp_path: Path) -> None:
    line = settings_error(["--redis-url", "notaurl"], tmp_path)
    assert line == "redis_url: Value error, redis_url must start with redis://, rediss:// or unix:// (got …'notaurl')"
    # A mistyped scheme must not put the password into the container's log: only what follows the credentials.
    line = settings_error(["--redis-url", "rediss//:S3CRETPW@redis.example:6379/0"], tmp_path)
    assert line.endswith("(got …'redis.example:6379/0')") and "S3CRETPW" not in line


def test_resume_from_a_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "not-a-checkpoint"
    folder.mkdir()
    line = settings_error(["--resume", str(folder)], tmp_path)
    assert line.startswith(f"resume: Value error, '{folder}' is not a checkpoint (no trainer_state.json)")


def data_error(argv: list[str], tmp_path: Path, rows: bytes | None = None) -> str:
    return data_line(run_trainer(argv, tmp_path, rows))


def data_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a run refused for its data (exit 2, as a bad setting), without its prefix."""
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("grpo-trainer:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0].removeprefix("grpo-trainer: invalid data: ")


@pytest.mark.parametrize("flag", [["--zero-stage", "3"], ["--zero-stage", "1"]])
def test_zero_stage_from_the_command_line_is_accepted(flag: list[str], tmp_path: Path) -> None:
    # It got as far as the run (then failed on the unwritable folder), not refused as "Input should be 1, 2 or 3".
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert "output_dir" in run_error([*flag, "--output-dir", str(blocker / "out")], tmp_path)


def test_an_output_dir_that_cannot_be_made(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the folder's parent should be: as /proc/x, it cannot be created
    line = run_error(["--output-dir", str(blocker / "out")], tmp_path)
    assert line == f"output_dir {blocker / 'out'}: cannot create it (Not a directory)"


def test_process_credit_on_rows_without_steps_names_the_first_line(tmp_path: Path) -> None:
    rows = f"{json.dumps({**ROW, 'gold': '3'})}\n".encode()
    steps = {"math": {"gold": "2"}, "steps": {"source": "rule", "rule": "column_addition"}}
    rows = (json.dumps({"prompt": "1 + 1?", "checks": steps}) + "\n\n").encode() + rows
    line = data_error(["--preset", "prm"], tmp_path, rows)
    assert f"1 of 2 rows (the first: {tmp_path / 'train.jsonl'} line 3) have no checks.steps" in line


def test_reward_weights_that_name_no_check_of_the_rows(tmp_path: Path) -> None:
    line = data_error(["--reward-weights", '{"mathh": 1.0}'], tmp_path)
    assert line.startswith(f"reward_weights names 'mathh', but {tmp_path / 'train.jsonl'} line 1 has no 'mathh' check")


def test_a_data_file_that_is_not_utf8(tmp_path: Path) -> None:
    line = data_error([], tmp_path, rows=b'{"prompt": "caf\xe9", "gold": "1"}\n')
    assert line.startswith(f"{tmp_path / 'train.jsonl'} line 1: not UTF-8 text")


def staged_run(tmp_path: Path, grpo_stage: dict[str, object], grpo_rows: list[dict[str, object]],
               eval_rows: list[dict[str, object]] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:  # fmt: skip
    """SFT → GRPO with a Redis nobody listens on: whatever fails must fail before the SFT stage trains."""
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({**ROW, "response": "<answer>2</answer>"}) + "\n" for _ in range(4)))
    grpo = tmp_path / "grpo.jsonl"
    grpo.write_text("".join(json.dumps(r) + "\n" for r in grpo_rows))
    extra = []
    if eval_rows is not None:
        (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_rows))
        extra = ["--eval-data", str(tmp_path / "eval.jsonl")]
    stages = [{"mode": "sft", "train_data": str(sft), "steps": 50, "prompts_per_step": 4},
              {"mode": "grpo", "train_data": str(grpo), **grpo_stage}]  # fmt: skip
    began = time.monotonic()
    done = run_trainer(["--stages", json.dumps(stages), *extra], tmp_path)
    return done, time.monotonic() - began


def refused_at_start_up(done: subprocess.CompletedProcess[str], tmp_path: Path) -> str:
    """Exit 2 with one line, and nothing trained: the SFT stage left no metrics, checkpoint or model."""
    assert not list((tmp_path / "out").glob("stage-*/metrics.jsonl")), "a stage trained before the refusal"
    return data_line(done)


def test_a_later_stages_row_without_a_weighted_check_is_refused_before_the_first_stage(tmp_path: Path) -> None:
    """Issue 34: such a row used to fail the GRPO stage 4.7 minutes in, after the SFT stage had trained."""
    rows = [{**ROW, "checks": {"format": {}}}, {**ROW, "checks": {"format": {}}}, ROW]
    done, seconds = staged_run(tmp_path, {"reward_weights": {"math": 1.0, "format": 1.0}}, rows)
    line = refused_at_start_up(done, tmp_path)
    assert line.startswith(f"stage 2 (grpo): reward_weights names 'format', but {tmp_path / 'grpo.jsonl'} line 3 "
                           "has no 'format' check"), line  # fmt: skip
    assert seconds < 90, f"refused after {seconds:.0f}s"


@pytest.mark.parametrize(
    ("grpo_rows", "eval_rows", "where", "message"),
    [
        (
            [ROW, {"prompt": "1 + 1?", "checks": {"math": {}}}, ROW],
            None,
            "grpo.jsonl line 2",
            "checks.math.gold is missing",
        ),
        ([ROW], [ROW, ROW, {"prompt": "2 + 2?"}], "eval.jsonl line 3", "no 'checks' (or 'gold')"),
    ],
)
def test_a_later_stages_bad_row_is_named_with_its_stage_file_and_line(
    tmp_path: Path, grpo_rows: list[dict[str, object]], eval_rows: list[dict[str, object]] | None, where: str,
    message: str,
) -> None:  # fmt: skip
    done, _ = staged_run(tmp_path, {}, grpo_rows, eval_rows)
    line = refused_at_start_up(done, tmp_path)
    assert line.startswith(f"stage 2 (grpo): {tmp_path / where}: {message}"), line
