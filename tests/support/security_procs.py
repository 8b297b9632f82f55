"""The security tier's reward limits: short deadlines so a fuzzer's worst case costs seconds."""

from __future__ import annotations

# A 3600 s timeout on hard sympy input would otherwise cost minutes.
TIGHT = ("--max-timeout-s", "8", "--math-timeout-s", "2", "--code-timeout-s", "2", "--max-code-timeout-s", "3")
