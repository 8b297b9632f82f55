"""Start the reward service as a subprocess on free ports for a benchmark (shared by the bench scripts)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from grpo.common.net import free_port


def start_reward_service(*flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m grpo.reward` with `flags`, once /healthz answers; returns (process, base URL)."""
    http_port = free_port()
    cmd = [sys.executable, "-m", "grpo.reward", "--host", "127.0.0.1", "--grpc-port", str(free_port())]
    cmd += ["--http-port", str(http_port), "--log-level", "WARNING", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{http_port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"reward service exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError("reward service did not become healthy")
