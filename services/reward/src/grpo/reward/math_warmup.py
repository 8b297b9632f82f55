"""Imported once by the math workers' forkserver (the pool's preload): one verification there builds what every
worker forked from it would otherwise build on its first item (the LaTeX parser, sympy's caches: ~1 s on this
2-core machine, 1.09 s against 0.05 s for the next item). A worker replaced after a kill then starts warm, so its
first item is not judged on a second less of its own limit (a `(x+1)^2` once timed out at math_timeout_s 1).

No threads, timers or signals (math-verify's timeouts are off): nothing a fork would inherit half-done.
"""

from __future__ import annotations

import logging

from grpo.reward.verifiers.math import verify_math

log = logging.getLogger(__name__)

try:
    verify_math("\\boxed{(x+1)^2}", "x^2+2x+1", None)
except Exception:  # a failed warm-up costs the first item its second, never the pool (preload must not raise)
    log.exception("math warm-up failed")
