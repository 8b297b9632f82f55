"""The reward service's main process verifies math through its workers without importing sympy or math-verify:
they cost ~40 MB RSS there (bench/bench_footprint.py), and only the workers (forked from a preloaded forkserver)
use them."""

from __future__ import annotations

import json
import subprocess
import sys

# A fresh interpreter: this test process has sympy already (other tests import the verifier).
SCRIPT = """
import asyncio, json, sys
from grpo.reward.core import RewardCore
from grpo.reward.schemas import VerifyMathRequest
from grpo.reward.settings import RewardSettings

core = RewardCore(RewardSettings(workers=1))
try:
    right = asyncio.run(core.verify_math(VerifyMathRequest(answer="<answer>\\\\boxed{4}</answer>", gold="4")))
    wrong = asyncio.run(core.verify_math(VerifyMathRequest(answer="<answer>5</answer>", gold="4", precision=3)))
finally:
    core.close()
print(json.dumps({"right": right.status, "wrong": wrong.status,
                  "imported": sorted(m for m in ("sympy", "math_verify") if m in sys.modules)}))
"""


def test_main_process_verifies_math_without_sympy() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"right": "correct", "wrong": "incorrect", "imported": []}
