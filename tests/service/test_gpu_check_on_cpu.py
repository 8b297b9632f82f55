"""bench/gpu_check/ on the CPU (its smaller sizes), so the script a GPU session runs in its few minutes works
when it gets there: each check answers, and the numbers that must hold on any device hold. (DeepSpeed's check is
left out here: its backend has tests of its own, and its two subprocesses cost half a minute.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKS = ("learner_precision", "sampler_logprobs", "engine_throughput", "weight_push")


def test_the_gpu_check_runs_on_the_cpu(tmp_path: Path) -> None:
    argv = [sys.executable, str(REPO / "bench" / "gpu_check"), "--device", "cpu", "--out", str(tmp_path)]
    done = subprocess.run([*argv, "--only", ",".join(CHECKS)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert {name: checks[name]["status"] for name in CHECKS} == dict.fromkeys(CHECKS, "ok")
    assert checks["learner_precision"]["compare"]["grad_cosine"] > 0.999  # bf16 autocast against fp32
    fp32 = checks["sampler_logprobs"]["sampler_float32_vs_trainer_fp32"]
    assert fp32["tokens"] > 0 and fp32["max_abs_diff"] < 1e-4  # the sampler's log-probs are the trainer's
    assert checks["engine_throughput"]["cpu_float32_small"]["tokens"] > 0
    push = checks["weight_push"]
    for route in ("fp32_replica_stream", "fp32_replica_data_port"):  # the replica holds exactly what was pushed
        assert push[route]["ok"] and push[route]["max_abs_diff_vs_fp32"] == 0.0, push[route]
    greedy = push["fp32_replica_stream"]["greedy_vs_trainer_model"]
    assert greedy["rows"] > 0 and greedy["rows_equal"] == greedy["rows"], greedy
