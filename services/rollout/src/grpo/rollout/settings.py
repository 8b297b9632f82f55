"""Settings of the rollout service: defaults < config file < GRPO_ROLLOUT_* env < CLI flags."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from grpo.common.settings import LogLevel, ServiceSettings, load_settings, redis_url_problem, service_config


def hostname_and_pid() -> str:
    """The default replica id, unique per process (a named function: --help prints its name)."""
    return f"{socket.gethostname()}-{os.getpid()}"


class RolloutSettings(ServiceSettings):
    """grpo-rollout: samples completions with vLLM or transformers and accepts live weight updates."""

    model_config = service_config("GRPO_ROLLOUT_", "grpo-rollout")

    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: `hf` (transformers, CPU or GPU) or `vllm`."""
    model: str | None = None
    """A local model folder or a hub id; empty means the built-in tiny model."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weight and compute dtype of the engine."""
    device: str = "auto"
    """Device for the `hf` engine: auto, cpu, cuda, cuda:1, ..."""
    torch_threads: int = Field(0, ge=0)
    """torch intra-op threads for the `hf` engine on CPU; 0 keeps torch's default."""
    vllm_kv_cache_bytes: int = Field(0, ge=0)
    """vLLM KV-cache size in bytes; 0 = 512 MiB on CPU, vLLM's own sizing on GPU."""
    vllm_max_model_len: int | None = Field(None, ge=16)
    """vLLM context length; unset = the model's."""
    vllm_in_process: bool | None = None
    """Run vLLM's engine core in this process (fast start; CPU default) or in its own (GPU default)."""
    vllm_gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """Fraction of GPU memory vLLM may use (GPU only)."""
    redis_url: str | None = None
    """When set, the worker loop consumes prompt tasks from this Redis."""
    reward_addr: str | None = None
    """host:port of the reward service's gRPC API (used by the worker loop)."""
    host: str = "0.0.0.0"
    """Address the gRPC and HTTP servers bind to."""
    grpc_port: int = Field(7051, ge=0, le=65535)
    """gRPC port (0 picks a free one)."""
    http_port: int = Field(8001, ge=0, le=65535)
    """HTTP port for /healthz and /metrics (0 picks a free one)."""
    weights_data_port: int = Field(7054, ge=-1, le=65535)
    """TCP port that takes the bytes of weight updates (about 3x faster than the gRPC stream; TLS when gRPC
    has it). 0 picks a free one; -1 turns it off, and updates then send their bytes in the gRPC stream."""
    advertise_host: str = Field(default_factory=socket.gethostname)
    """Host name other services use to reach this replica (registered in Redis)."""
    replica_id: str = Field(default_factory=hostname_and_pid)
    """Unique name of this replica."""
    token: str | None = None
    """Bearer token every gRPC call must carry (health and reflection stay open)."""
    weights_token: str | None = None
    """Separate bearer token for UpdateWeights; defaults to `token`."""
    relay_tls_ca_file: str | None = None
    """PEM root certificates this replica trusts in the replicas it relays weight updates to (the trainer's
    weight_push=relay); unset with TLS on: its own tls_cert_file (one certificate for the deployment)."""
    weights_send_rate_mb_s: float = Field(0.0, ge=0)
    """Cap on the rate this replica relays weight updates on at, in MB/s (10^6 bytes) over all the replicas it
    forwards to together (10 Gb/s = 1,250); 0: no cap. Keeps relay traffic from starving other traffic."""
    weights_stream_timeout_s: float = Field(300.0, gt=0)
    """Longest one UpdateWeights stream may take to arrive (whatever the pusher's deadline); then it is cancelled."""
    tls_cert_file: str | None = None
    """PEM certificate for gRPC TLS (with tls_key_file); plaintext when unset."""
    tls_key_file: str | None = None
    """PEM private key for gRPC TLS."""
    max_prompts: int = Field(256, ge=1)
    """Most prompts accepted in one Generate request."""
    max_n: int = Field(64, ge=1)
    """Most samples per prompt."""
    max_new_tokens_cap: int = Field(4096, ge=1)
    """Largest max_new_tokens a request may ask for."""
    run: str = "default"
    """Run namespace of the Redis keys (grpo:{run}:...); the trainer uses the same."""
    reward_token: str | None = None
    """Bearer token for the reward service."""
    reward_timeout_s: float = Field(60.0, gt=0)
    """Deadline of one Score call (retried with backoff before a group is marked failed)."""
    reward_retry_budget_s: float = Field(30.0, ge=0)
    """How long a Score call keeps retrying while the reward service is unavailable or overloaded (a restart)."""
    reward_tls_ca_file: str | None = None
    """PEM root certificates to verify the reward service's TLS certificate; plaintext when unset."""
    worker_batch_tasks: int = Field(4, ge=1)
    """Most tasks generated together in one engine call (the engine batches prompts × n)."""
    worker_eval_batch_tasks: int = Field(64, ge=1)
    """Most evaluation tasks generated together in one engine call. They ask for one greedy answer each, so
    worker_batch_tasks of them would leave the engine's batch nearly empty (bench/bench_eval.py: 4 per call made a
    500-problem evaluation 5.5× an in-process loop's time, 64 per call 1.5×)."""
    worker_block_ms: int = Field(1000, ge=1, le=5000)
    """How long one read waits for new tasks; bounds how fast a stop is noticed."""
    reclaim_idle_s: float = Field(30.0, gt=0)
    """A task pending this long without a lease renewal belongs to a dead replica and is reclaimed."""
    heartbeat_s: float = Field(2.0, gt=0)
    """Registry heartbeat and lease-renewal period (keep it well under reclaim_idle_s)."""
    registry_ttl_s: float = Field(10.0, gt=0)
    """A replica silent for this long drops out of the registry."""
    task_max_attempts: int = Field(3, ge=1)
    """Attempts (in-process retries and deliveries) before a task is written as failed."""
    wait_for_task_weights: bool = True
    """Take no task published under weights newer than this replica holds (a replica that joined or restarted
    waits for the trainer's push instead of making groups that would be dropped stale). Off: generate with
    whatever it holds (tasks published by hand, with no trainer pushing)."""
    tool_plugins: dict[str, str] = Field(default_factory=dict)
    """Tools episodes may call besides the built-in `python` (the reward service's sandbox), as
    {"name": "package.module:function"}; the function takes the call's arguments (a dict) and returns the result
    text; an exception it raises becomes an `Error: ...` result the model sees (docs/multi-turn.md)."""
    tool_concurrency: int = Field(8, ge=1)
    """Most tool calls of one episode batch run at the same time."""
    grpc_workers: int = Field(16, ge=1)
    """gRPC server threads."""
    log_level: LogLevel = "INFO"
    """Logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)."""
    json_logs: bool = False
    """Log one JSON object per line."""

    @field_validator("run")
    @classmethod
    def _run_name(cls, value: str) -> str:
        from grpo.common.queue import stream_keys  # the queue's own rule; imported here to keep --help light

        stream_keys(value)
        return value

    @field_validator("tool_plugins")
    @classmethod
    def _tool_plugins(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            if name == "python":
                raise ValueError("'python' is the built-in sandbox tool; give the plug-in another name")
            module, sep, function = path.partition(":")
            if not name or not sep or not module or not function:
                raise ValueError(f"{name!r}: {path!r} must look like 'package.module:function'")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        problem = redis_url_problem(value) if value is not None else None
        if problem:  # in the trainer's words (redis-py's own name no setting)
            raise ValueError(problem)
        return value

    @field_validator("reward_addr")
    @classmethod
    def _reward_addr_with_redis(cls, value: str | None, info: ValidationInfo) -> str | None:
        # The worker loop starts only after the model has loaded: a half-configured one must fail here instead.
        # (redis_url is declared above reward_addr, so it is in info.data when it is valid.)
        if info.data.get("redis_url") and not value:
            raise ValueError("the worker loop (redis_url is set) needs the reward service's gRPC host:port")
        return value


def parse_settings(argv: list[str] | None = None) -> RolloutSettings:
    # The trainer and `grpo` call the run `--run-id`; the rollout takes that name too (`--run` stays).
    return load_settings(RolloutSettings, argv, env_file_var="GRPO_ROLLOUT_CONFIG", flag_aliases={"--run": "--run-id"})
