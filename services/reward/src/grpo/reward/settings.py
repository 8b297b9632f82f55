"""Settings of the reward service: defaults < config file (GRPO_REWARD_CONFIG / --config) < env (GRPO_REWARD_*) < flags."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator

from grpo.common.net import beyond_loopback
from grpo.common.settings import LogLevel, ServiceSettings, load_settings, service_config

BUILTIN_COMPONENTS = ("math", "code", "format", "language", "overlong", "reward_model")


def one_per_cpu() -> int:
    """The default of `workers` (a named function: --help prints its name)."""
    return os.cpu_count() or 1


class RewardSettings(ServiceSettings):
    """grpo-reward: sandboxed verifier service (math, code, format, language) over gRPC and HTTP."""

    model_config = service_config("GRPO_REWARD_", "grpo-reward")

    host: str = "127.0.0.1"
    """Address both servers bind to: this machine only by default. Beyond loopback (0.0.0.0 in a container) the
    service runs code for whoever reaches it, so it needs a token (or allow_unauthenticated, or sandbox off)."""
    grpc_port: int = Field(default=7052, ge=0, le=65535)
    """gRPC port (0 picks a free one)."""
    http_port: int = Field(default=8002, ge=0, le=65535)
    """HTTP port (FastAPI: /v1/..., /docs, /healthz, /metrics)."""
    workers: int = Field(default_factory=one_per_cpu, ge=1, le=512)
    """Math worker processes, and concurrent sandbox runs unless sandbox_workers is set."""
    sandbox: Literal["auto", "namespace", "off"] = "auto"
    """Sandbox for code: auto (= namespace, the only one), or off for a math-only server. Readiness (/readyz)
    waits for a working sandbox unless it is off; without one, code requests answer sandbox_error."""
    sandbox_mode: Literal["auto", "root", "rootless"] = "auto"
    """How the sandbox gets its namespaces: root (root with CAP_SYS_ADMIN, SETUID, SETGID and KILL: a uid per
    worker), rootless (no root, no added capability: a user namespace where the kernel and the container's seccomp
    and AppArmor profiles allow it; every run under one uid), or auto (root where those capabilities are in effect,
    else rootless; neither: code verification off, with both ways named in /healthz). docs/reward.md#sandbox-modes."""
    sandbox_user: int | None = Field(default=None, ge=1, lt=2**32 - 1)
    """A root service starts its sandbox rootless as this uid and gid (no capability, no supplementary group):
    rootless mode for a service that must itself stay root. Unset: the sandbox runs as the service does."""
    sandbox_workers: int | None = Field(default=None, ge=1, le=512)
    """Concurrent sandbox runs; defaults to workers."""
    languages: list[str] | None = None
    """Languages code may be in: a subset of the toolchains installed (the image's LANGUAGES build argument
    decides those); unset: all of them. `/healthz` lists what is served; any other is a 400. Naming one that is
    not installed leaves code verification off, with the reason in /healthz."""
    token: str | None = None
    """Bearer token required on /v1/* and on every gRPC method but health and reflection; off when unset."""
    allow_unauthenticated: bool = False
    """Serve without a token on a host beyond loopback with code execution on: anyone who reaches the port runs
    code in the sandbox. Off: such a service refuses to start."""
    tls_cert_file: str | None = None
    """PEM certificate for gRPC TLS (with tls_key_file); plaintext when unset."""
    tls_key_file: str | None = None
    """PEM private key for gRPC TLS."""
    log_level: LogLevel = "INFO"
    """Root log level: DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)."""
    json_logs: bool = False
    """One JSON object per log line (for log shippers)."""
    max_queue: int = Field(default=4096, ge=1)
    """Items admitted but not finished, across all requests; beyond it requests get 429 / RESOURCE_EXHAUSTED. An upper
    bound: a request is refused sooner when it would not finish by its deadline behind the work admitted
    (docs/reward.md "Overload")."""
    retry_after_s: int = Field(default=1, ge=1)
    """Retry-After hint sent with 429."""
    max_items: int = Field(default=1024, ge=1)
    """Items per /v1/score request."""
    max_tests: int = Field(default=512, ge=1)
    """Code tests per item or /v1/verify/code request."""
    max_body_bytes: int = Field(default=32 << 20, ge=1024)
    """Largest HTTP request body."""
    max_code_chars: int = Field(default=200_000, ge=1)
    """Longest code (or whole completion given as code) and longest test program."""
    max_text_chars: int = Field(default=400_000, ge=1)
    """Longest completion, prompt, answer or gold."""
    max_test_chars: int = Field(default=16 << 20, ge=1)
    """Longest test data: a stdin/stdout test's `stdin` or `expected_stdout`, and /v1/execute's `stdin`
    (CodeContests and TACO tests run to megabytes). A request is still bounded by max_body_bytes."""
    max_output_bytes: int = Field(default=16 << 20, ge=1, le=1 << 30)
    """Most bytes of stdout a code run may write; past it the run is stopped as output_limit. stderr does not
    count: a run's is kept to its first and last 32 KiB, and only a flood (256 MiB) stops it."""
    max_response_output_bytes: int = Field(default=8 << 20, ge=0, le=1 << 30)
    """Most bytes of program output (stdout and stderr) one /v1/execute or /v1/verify/code response returns, its
    runs together: each stream returns its head and tail, 64 KiB by default (a request's return_output_bytes), at
    most an equal share of this (512 tests: 8 KiB a stream). The judge always sees the whole stdout."""
    default_timeout_s: float = Field(default=60.0, gt=0)
    """Request deadline when the request sets none."""
    max_timeout_s: float = Field(default=600.0, gt=0)
    """Cap on any requested deadline."""
    math_timeout_s: float = Field(default=10.0, gt=0)
    """Deadline of one math verification; the worker is killed past it."""
    code_timeout_s: float = Field(default=10.0, gt=0)
    """Default time limit per code run / test: CPU time (user + system), as contest judges count it, so that a
    loaded host does not turn a correct program into a timeout."""
    max_code_timeout_s: float = Field(default=60.0, gt=0)
    """Cap on a requested per-run code limit."""
    code_idle_factor: float = Field(default=3.0, ge=1.0, le=10.0)  # le: grpo.common.reward_client.IDLE_FACTOR_MAX
    """A code run's wall-clock limit, as a multiple of its time limit: a run that sleeps, blocks, or cannot get its
    CPU time on a host this loaded is stopped as a timeout after timeout_s x this of wall time. Request deadlines
    allow for it."""
    code_memory_mb: int = Field(default=512, ge=16)
    """Default memory limit per code run."""
    max_code_memory_mb: int = Field(default=4096, ge=16)
    """Cap on a requested memory limit."""
    checker_cache_entries: int = Field(default=256, ge=0)
    """Built checkers kept between requests (an LRU per process, with checker_cache_mb): one checker sent with
    thousands of submissions is built once, not per request (a testlib checker takes 4.5-20 s). 0: none kept."""
    checker_cache_mb: int = Field(default=128, ge=0)
    """Most MiB of built checkers kept (a testlib checker is ~0.3 MiB)."""
    program_cache_entries: int = Field(default=128, ge=0)
    """Built candidate programs kept between requests (apart from the checkers, which they cannot evict): the same
    code sent again (a retry, another batch of its tests, identical samples of a group) is not rebuilt. 0: none."""
    program_cache_mb: int = Field(default=64, ge=0)
    """Most MiB of built candidate programs kept."""
    build_error_cache_s: float = Field(default=60.0, ge=0)
    """How long a compiler's rejection of a source (a compile error) is kept, checkers' and programs' alike: a
    broken checker sent with every submission is built once a minute, not per request. Builds killed, timed out or
    failed by the sandbox are never kept. 0: compile errors are not kept."""
    math_batch: int = Field(default=16, ge=1, le=64)
    """Most math verifications sent to a worker per round trip (a fair share of the queue; keeps workers busy)."""
    reward_model_path: str | None = None
    """Local path of a HF sequence-classification model; the reward_model component is off when unset."""
    reward_model_batch_size: int = Field(default=16, ge=1)
    """Pairs per reward-model forward pass."""
    reward_model_max_length: int = Field(default=1024, ge=8)
    """Token limit per (prompt, completion) pair for the reward model."""
    prm_path: str | None = None
    """A process reward model (local folder or hub id) for `steps` with source prm; off when unset. Loaded as open
    PRMs are used: a token-classification head read at a separator token after each step (Qwen2.5-Math-PRM)."""
    prm_step_token: str = "<extra_0>"
    """The separator placed after each step; the PRM's P(good step) is read at it (Qwen2.5-Math-PRM's token)."""
    prm_trust_remote_code: bool = False
    """Allow the PRM folder's own modelling code (Qwen2.5-Math-PRM ships its head as remote code)."""
    prm_max_length: int = Field(default=4096, ge=8)
    """Token limit of one (prompt, steps) input; steps past it cannot be judged (null)."""
    plugins: dict[str, str] = Field(default_factory=dict)
    """Plug-in reward functions, name -> 'package.module:function' (config file or JSON in env)."""
    plugin_timeout_s: float = Field(default=30.0, gt=0)
    """Deadline of one plug-in call (the whole batch)."""

    def code_wall_s(self, timeout_s: float) -> float:
        """A code run's wall-clock limit: code_idle_factor x its time limit (CPU time), within the longest request
        deadline less a second, so that a run reaching it is judged `timeout` rather than cut off as a request past
        its deadline (a 3 s limit under a 8 s max_timeout_s: 7 s, not 9)."""
        return min(self.code_idle_factor * timeout_s, max(timeout_s, self.max_timeout_s - 1.0))

    @model_validator(mode="after")
    def _check(self) -> RewardSettings:
        self._refuse_open_code_execution()
        clash = sorted(set(self.plugins) & set(BUILTIN_COMPONENTS))
        if clash:
            raise ValueError(f"plugins: names {clash} clash with built-in components")
        if self.languages is not None:
            from grpo.reward.sandbox.languages import TOOLCHAINS

            known = {"python", *TOOLCHAINS}
            unknown = sorted(set(self.languages) - known)
            if unknown or not self.languages:
                raise ValueError(f"languages: {unknown or 'none'} given; choose from {sorted(known)}")
        return self

    def _refuse_open_code_execution(self) -> None:
        # /v1/execute runs any program it is sent: on a network interface without a token that is remote code
        # execution for whoever reaches the port (the sandbox confines it, but it still runs). Said before start-up.
        if self.token or self.allow_unauthenticated or self.sandbox == "off" or not beyond_loopback(self.host):
            return
        raise ValueError(
            f"host {self.host} accepts connections from other machines and /v1/execute runs their code, but no "
            "token is set: set one (GRPO_REWARD_TOKEN / --token), or bind to loopback (--host 127.0.0.1), or serve "
            "unauthenticated on purpose (GRPO_REWARD_ALLOW_UNAUTHENTICATED=1 / --allow-unauthenticated)"
        )


def parse_settings(argv: list[str] | None = None) -> RewardSettings:
    """Settings from defaults, config file, env and flags (flags win)."""
    return load_settings(RewardSettings, argv, env_file_var="GRPO_REWARD_CONFIG")
