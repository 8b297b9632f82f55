"""Which sandbox mode the sandbox fixtures start: GRPO_TEST_SANDBOX_MODE (auto, root or rootless; auto by default).

Rootless from a root test process: the zygotes are started as uid NOBODY with no capability and no supplementary
group (the sandbox's `user`), so the sandbox holds no privilege outside its own user namespace, as in a pod at
the baseline Pod Security level. From a non-root test process (tests/unit/reward/test_sandbox_rootless.py runs
the attack suites that way) it simply runs as this process does.
"""

from __future__ import annotations

import os
from typing import Any

NOBODY = 65534
ENV = "GRPO_TEST_SANDBOX_MODE"


def options(mode: str | None = None) -> dict[str, Any]:
    """make_sandbox's mode and user for `mode` (default: the environment's)."""
    mode = mode or os.environ.get(ENV, "auto")
    if mode == "rootless" and os.geteuid() == 0:
        return {"mode": "rootless", "user": NOBODY}
    return {"mode": mode}


def service_env(mode: str | None = None) -> dict[str, str]:
    """The same for a reward service process (its settings' sandbox_mode and sandbox_user)."""
    opts = options(mode)
    env = {"GRPO_REWARD_SANDBOX_MODE": opts["mode"]}
    if opts.get("user") is not None:
        env["GRPO_REWARD_SANDBOX_USER"] = str(opts["user"])
    return env


def modes() -> list[str]:
    """The modes a suite that runs in each takes: the environment's alone when it names one, else root (where
    this process is root) and rootless."""
    if os.environ.get(ENV):
        return [os.environ[ENV]]
    return ["root", "rootless"] if os.geteuid() == 0 else ["rootless"]
