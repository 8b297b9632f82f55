"""Sandboxed execution of untrusted programs: one interface (Sandbox), one file per implementation."""

from __future__ import annotations

import os
from collections.abc import Collection

from grpo.reward.sandbox.base import (
    DEFAULT_IDLE_FACTOR,
    DEFAULT_MAX_OUTPUT_BYTES,
    STATUSES,
    ExecResult,
    Limits,
    Sandbox,
    SandboxUnavailable,
)

__all__ = ["STATUSES", "ExecResult", "Limits", "Sandbox", "SandboxUnavailable", "make_sandbox"]


def make_sandbox(
    kind: str = "auto",
    workers: int = os.cpu_count() or 2,
    languages: Collection[str] | None = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    mode: str = "auto",
    user: int | None = None,
    idle_factor: float = DEFAULT_IDLE_FACTOR,
) -> Sandbox:
    """Start a sandbox of `kind` ("namespace", or "auto" = the same) and prove it works with one run; with
    `languages`, it serves those of the installed toolchains only; `max_output_bytes` caps the stdout of runs whose
    limits set no cap. `mode` (auto, root, rootless), `user` and `idle_factor`: NamespaceSandbox's.

    Raises SandboxUnavailable with an actionable message when the machine lacks what the sandbox needs;
    there is deliberately no weaker fallback that would run untrusted code unconfined.
    """
    from grpo.reward.sandbox.namespace import NamespaceSandbox

    if kind not in ("auto", "namespace"):
        raise ValueError(f"unknown sandbox kind {kind!r}; choose 'auto' or 'namespace'")
    sandbox = NamespaceSandbox(
        workers=workers,
        languages=languages,
        max_output_bytes=max_output_bytes,
        mode=mode,
        user=user,
        idle_factor=idle_factor,
    )
    probe = sandbox.run("print(6 * 7)", limits=Limits(timeout_s=10.0))
    if probe.status != "ok" or probe.stdout.strip() != "42" or not probe.proof:
        sandbox.close()
        raise SandboxUnavailable(f"sandbox self-test failed: {probe.status}: {probe.stderr.strip()[:500]}")
    return sandbox
