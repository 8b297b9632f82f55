"""`grpo-trainer --mode sft` as a real process: the cold-start SFT lowers the response loss and exports a model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from grpo.common.net import free_port
from tests.support.polling import exited, wait_until

pytestmark = pytest.mark.slow


def test_sft_mode_learns_and_exports(tmp_path: Path) -> None:
    rows = [
        {"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "gold": str(i + 1),
         "response": f"<think>{i} + 1 = {i + 1}</think><answer>{i + 1}</answer>"}
        for i in range(8)
    ]  # fmt: skip
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "grpo.trainer", "--mode", "sft", "--train-data", str(data), "--output-dir", str(out),
           "--steps", "12", "--prompts-per-step", "4", "--lr", "3e-3", "--checkpoint-every", "5",
           "--grpc-port", str(free_port()), "--http-port", str(free_port()), "--host", "127.0.0.1",
           "--torch-threads", "1", "--json-logs"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert_one_json_event_per_line(done.stdout + done.stderr)  # no progress bars in a service log
    losses = [json.loads(line)["sft/sft_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 12 and losses[-1] < 0.7 * losses[0], losses
    assert (out / "final" / "model.safetensors").is_file() and (out / "final" / "tokenizer.json").is_file()
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == [
        "step-00000005",
        "step-00000010",
        "step-00000012",
    ]
    # Its summary, as an SFT-only staged run's (issue 34: a run without stages wrote none): the run as its one stage.
    summary = json.loads((out / "summary.json").read_text())
    (stage,) = summary["stages"]
    assert summary["run_id"] == "default" and (stage["mode"], stage["steps"]) == ("sft", 12)
    assert (stage["sft_loss_first"], stage["sft_loss_last"]) == (losses[0], losses[-1])
    # The same command again: the run is finished, and it says so instead of silently doing nothing.
    metrics = (out / "metrics.jsonl").read_text()
    again = subprocess.run(cmd, capture_output=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr.decode()[-3000:]
    events = assert_one_json_event_per_line(again.stdout + again.stderr)
    assert [e["msg"] for e in events if "has finished" in e["msg"]] == [
        f"run 'default' has finished: checkpoint {out / 'checkpoints' / 'step-00000012'} is at step 12 of 12 "
        f"(final model: {out / 'final'}); nothing to do. To train further raise --steps (it resumes from there); "
        "to start again use --resume never or another --output-dir"
    ]
    assert (out / "metrics.jsonl").read_text() == metrics
    # --when-done serve (the chart's StatefulSet): the finished run stays up, Ready, until SIGTERM.
    http_port = free_port()
    served = [*cmd, "--when-done", "serve", "--http-port", str(http_port)]
    proc = subprocess.Popen(served, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    try:
        ready = wait_ready(f"http://127.0.0.1:{http_port}/readyz", proc)
        assert ready == {"ready": True, "phase": "done", "step": 12, "missing": []}
        time.sleep(1)
        assert proc.poll() is None  # still serving
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> dict[str, object]:
    """`url`'s body once it answers 200; fails with the trainer's stderr if it exits first."""

    def ready() -> list[dict[str, object]]:
        try:
            reply = httpx.get(url, timeout=2)
        except httpx.HTTPError:
            return []
        return [dict(reply.json())] if reply.status_code == 200 else []

    def stderr() -> str:
        return ":\n" + proc.stderr.read().decode()[-3000:] if proc.stderr and proc.poll() is not None else ""

    return wait_until(ready, timeout, f"{url} to be ready", every=0.3, stop=exited(proc), context=stderr)[0]


def test_bad_settings_exit_2_naming_the_field(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "grpo.trainer", "--train-data", str(tmp_path / "x.jsonl"),
                           "--max-staleness", "-2"], capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert b"max_staleness" in done.stderr


def test_deepspeed_logs_through_the_service_logger(tmp_path: Path) -> None:
    """DeepSpeed prints through its own stdout handler and warns it cannot find a GPU: neither in our log."""
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1?", "response": str(i + 1)}) + "\n" for i in range(4)))
    cmd = [sys.executable, "-m", "grpo.trainer", "--mode", "sft", "--backend", "deepspeed", "--train-data", str(data),
           "--output-dir", str(tmp_path / "out"), "--steps", "1", "--prompts-per-step", "2", "--grpc-port", "0",
           "--http-port", "0", "--host", "127.0.0.1", "--torch-threads", "1", "--json-logs"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    events = assert_one_json_event_per_line(done.stdout + done.stderr)
    assert any(e["msg"].startswith("deepspeed distributed init") for e in events)
    assert not [e for e in events if "unable to detect" in e["msg"]]


def assert_one_json_event_per_line(output: bytes) -> list[dict[str, object]]:
    lines = [line for line in output.decode().splitlines() if line.strip()]
    strays = [line for line in lines if not line.startswith("{")]
    assert not strays, strays[:5]
    return [json.loads(line) for line in lines]
