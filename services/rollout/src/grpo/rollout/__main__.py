"""`python -m grpo.rollout` / `grpo-rollout`: the engine, gRPC + HTTP servers, and the worker loop with --redis-url."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

from grpo.common.logs import setup_logging
from grpo.common.net import exposure_warning
from grpo.common.settings import exit_on_invalid_settings
from grpo.common.signals import exit_on_signals, stop_on_signals
from grpo.common.tiny_model import check_model
from grpo.rollout.settings import RolloutSettings, parse_settings

if TYPE_CHECKING:
    from grpo.common.grpc_server import GrpcServer
    from grpo.common.http_server import HttpServer
    from grpo.common.weights.relay import Relayer
    from grpo.rollout.engines.base import Engine
    from grpo.rollout.service import RolloutService

log = logging.getLogger("grpo.rollout")


def build_engine(settings: RolloutSettings, model: str) -> Engine:
    """The engine named by --engine; vLLM is imported only when asked for."""
    if settings.engine == "vllm":
        from grpo.rollout.engines.vllm import VLLMEngine

        return VLLMEngine(
            model=model,
            dtype=settings.dtype,
            kv_cache_bytes=settings.vllm_kv_cache_bytes,
            max_model_len=settings.vllm_max_model_len,
            in_process=settings.vllm_in_process,
            gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
        )
    from grpo.rollout.engines.hf import HFEngine

    return HFEngine(model, dtype=settings.dtype, device=settings.device, torch_threads=settings.torch_threads or None)


def serve(settings: RolloutSettings, stop: threading.Event) -> int:
    """Start the engine and servers (a signal meanwhile exits at once), then serve until `stop` or a signal.

    Returns the process's exit code: 0 after a stop, 1 when the worker loop died first.
    """
    with exit_on_signals("start-up"):
        grpc_server, http, service = start(settings)
    stop_on_signals(stop)
    worker = None
    if settings.redis_url:
        worker = threading.Thread(target=run_worker_logged, args=(service, settings, stop), name="rollout-worker")
        worker.start()
    log.info(
        "rollout ready: grpc %d, http %d, weights data %d, replica %s",
        grpc_server.port,
        http.port,
        service.data_port.port if service.data_port else 0,
        settings.replica_id,
    )
    try:
        return wait_until_stopped(stop, worker)
    finally:
        service.on_whole = None  # an update applied while we stop must not say SERVING again
        grpc_server.set_serving(False)
        if worker is not None:
            worker.join(timeout=30)
        grpc_server.stop(grace=5)
        http.stop()
        service.close()
        log.info("rollout stopped")


def run_worker_logged(service: RolloutService, settings: RolloutSettings, stop: threading.Event) -> None:
    """The worker thread: its failure goes to our log (JSON logs included), not to threading's bare traceback."""
    from grpo.rollout.worker_wiring import run_worker

    try:
        run_worker(service, settings, stop)
    except Exception:
        log.exception("the worker loop failed")


def wait_until_stopped(stop: threading.Event, worker: threading.Thread | None) -> int:
    """Block until `stop` (0) or until the worker thread has ended without one (1: a replica that takes no
    tasks must not look like a clean stop to its supervisor, which then would not restart it)."""
    while not stop.wait(0.5):
        if worker is not None and not worker.is_alive():
            log.error("the worker loop stopped; shutting down")
            stop.set()
            return 1
    return 0


def relayer(settings: RolloutSettings, service: RolloutService) -> Relayer:
    """How this replica relays weight updates on: with the deployment's weights token, over TLS when it has TLS."""
    from grpo.common.send_rate import send_rate
    from grpo.common.weights.relay import Relayer

    ca_file = settings.relay_tls_ca_file or settings.tls_cert_file
    token = settings.weights_token or settings.token
    return Relayer(settings.replica_id, token, ca_file, on_sent=service.metrics.relayed_bytes.inc,
                   rate=send_rate(settings.weights_send_rate_mb_s))  # fmt: skip


def start(settings: RolloutSettings, engine: Engine | None = None) -> tuple[GrpcServer, HttpServer, RolloutService]:
    """The servers up around `engine` (default: the one the settings name, loaded here)."""
    if engine is None:
        log.info("starting: loading %s with the %s engine", settings.model, settings.engine)
    if warning := exposure_warning(settings.host, settings.token, "GRPO_ROLLOUT_"):
        log.warning(warning)  # UpdateWeights would take a policy from anyone: said, not refused (no code runs)
    # Heavy imports (torch, transformers) only after the settings are known to be valid.
    from grpo.common.api_servers import api_servers
    from grpo.common.auth import MethodTokens
    from grpo.common.net import server_ssl_context
    from grpo.common.ports import check_ports
    from grpo.common.readiness import Readiness, grpc_health_check, redis_check
    from grpo.common.tiny_model import resolve_model
    from grpo.common.weights.data_port import WeightDataPort
    from grpo.rollout.grpc_api import SERVICE_NAME, STATUS_METHOD, UPDATE_METHOD, register
    from grpo.rollout.http_api import http_routes
    from grpo.rollout.service import Limits, RolloutService

    # A taken port is said before the model loads.
    check_ports(settings, "grpc_port", "http_port", *(["weights_data_port"] if settings.weights_data_port > 0 else []))
    model = resolve_model(settings.model)
    limits = Limits(settings.max_prompts, settings.max_n, settings.max_new_tokens_cap)
    service = RolloutService(engine or build_engine(settings, model), model, settings.replica_id, limits)
    method_tokens: MethodTokens = {}
    if settings.weights_token:
        method_tokens[UPDATE_METHOD] = settings.weights_token
        if settings.token:  # relaying replicas hold only the weights token and ask a hop what it already holds
            method_tokens[STATUS_METHOD] = (settings.token, settings.weights_token)
    readiness = Readiness()
    if settings.redis_url:  # worker mode: no tasks without Redis, no rewards without the reward service
        readiness.add("redis", redis_check(settings.redis_url))
        if settings.reward_addr:
            readiness.add("reward", grpc_health_check(settings.reward_addr, settings.reward_tls_ca_file))
    grpc_server, http = api_servers(
        settings,
        register(service, settings.weights_stream_timeout_s, relayer(settings, service)),
        [SERVICE_NAME],
        http_routes(service, readiness),
        "rollout-http",
        workers=settings.grpc_workers,
        method_tokens=method_tokens or None,
    )
    service.grpc_port = grpc_server.port
    if settings.weights_data_port >= 0:
        service.data_port = WeightDataPort(
            settings.host,
            settings.weights_data_port,
            server_ssl_context(settings.tls_cert_file, settings.tls_key_file),
        )
    grpc_server.start()
    # Mixed weights (a copy failed part-way) are NOT_SERVING to gRPC health checks too, as /readyz is 503.
    service.on_whole = grpc_server.set_serving
    http.start()
    return grpc_server, http, service


def main(argv: list[str] | None = None) -> None:
    with exit_on_invalid_settings("grpo-rollout"):
        settings = parse_settings(argv)
        setup_logging(settings.log_level, settings.json_logs)
        with exit_on_signals("the model check"):
            settings = settings.model_copy(update={"model": check_model(settings.model)})
    code = serve(settings, threading.Event())
    # Everything this process owns is closed. What is left is the interpreter's teardown of torch and vLLM
    # objects: ~2 s here for nothing (the OS frees the memory), 10 s and more on a loaded machine, where it
    # ran past compose's and the tests' stop grace and ended in SIGKILL.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
