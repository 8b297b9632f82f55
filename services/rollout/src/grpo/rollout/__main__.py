"""`python -m grpo.rollout` / `grpo-rollout`: the engine, gRPC + HTTP servers, and the worker loop with --redis-url."""

from __future__ import annotations

import logging
import sys
import threading
from typing import TYPE_CHECKING

from grpo.common.logs import setup_logging
from grpo.common.settings import exit_on_invalid_settings
from grpo.common.signals import stop_on_signals
from grpo.rollout.settings import RolloutSettings, parse_settings

if TYPE_CHECKING:
    from grpo.rollout.engines.base import Engine

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


def serve(settings: RolloutSettings, stop: threading.Event) -> None:
    # Heavy imports (torch, transformers) only after the settings are known to be valid.
    from grpo.common.grpc_server import GrpcServer, server_credentials
    from grpo.common.http_server import HttpServer
    from grpo.common.tiny_model import resolve_model
    from grpo.common.weight_data_port import WeightDataPort, server_ssl_context
    from grpo.rollout.grpc_api import SERVICE_NAME, UPDATE_METHOD, register
    from grpo.rollout.http_api import http_routes
    from grpo.rollout.service import Limits, RolloutService

    model = resolve_model(settings.model)
    limits = Limits(settings.max_prompts, settings.max_n, settings.max_new_tokens_cap)
    service = RolloutService(build_engine(settings, model), model, settings.replica_id, limits)
    method_tokens = {UPDATE_METHOD: settings.weights_token} if settings.weights_token else None
    grpc_server = GrpcServer(
        register(service, settings.weights_stream_timeout_s),
        [SERVICE_NAME],
        settings.host,
        settings.grpc_port,
        workers=settings.grpc_workers,
        token=settings.token,
        method_tokens=method_tokens,
        credentials=server_credentials(settings.tls_cert_file, settings.tls_key_file),
    )
    service.grpc_port = grpc_server.port
    if settings.weights_data_port >= 0:
        service.data_port = WeightDataPort(
            settings.host,
            settings.weights_data_port,
            server_ssl_context(settings.tls_cert_file, settings.tls_key_file),
        )
    http = HttpServer(
        http_routes(service), settings.host, settings.http_port, name="rollout-http", token=settings.token
    )
    grpc_server.start()
    http.start()
    worker = None
    if settings.redis_url:
        from grpo.rollout.worker import run_worker

        worker = threading.Thread(target=run_worker, args=(service, settings, stop), name="rollout-worker")
        worker.start()
    log.info(
        "rollout ready: grpc %d, http %d, weights data %d, replica %s",
        grpc_server.port,
        http.port,
        service.data_port.port if service.data_port else 0,
        settings.replica_id,
    )
    try:
        while not stop.wait(0.5):
            if worker is not None and not worker.is_alive():
                log.error("the worker loop stopped; shutting down")
                stop.set()
    finally:
        grpc_server.set_serving(False)
        if worker is not None:
            worker.join(timeout=30)
        grpc_server.stop(grace=5)
        http.stop()
        service.close()
        log.info("rollout stopped")


def main(argv: list[str] | None = None) -> None:
    with exit_on_invalid_settings("grpo-rollout"):
        settings = parse_settings(argv)
    setup_logging(settings.log_level, settings.json_logs)
    serve(settings, stop_on_signals())


if __name__ == "__main__":
    main(sys.argv[1:])
