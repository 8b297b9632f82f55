"""`grpo-reward` / `python -m grpo.reward`: gRPC and HTTP in one process around one core."""

from __future__ import annotations

import logging
import sys
import threading

from grpo.common.logs import setup_logging
from grpo.common.settings import exit_on_invalid_settings
from grpo.reward.settings import RewardSettings, parse_settings

log = logging.getLogger("grpo.reward")


def serve(settings: RewardSettings) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""
    # Heavy imports only after the settings are known to be valid (`--help` stays instant).
    import uvicorn

    from grpo.common.grpc_server import GrpcServer, server_credentials
    from grpo.common.signals import stop_on_signals
    from grpo.reward.core import RewardCore
    from grpo.reward.grpc_api import SERVICE_NAME, register
    from grpo.reward.http_api import create_app

    stop = stop_on_signals()

    core = RewardCore(settings)
    credentials = server_credentials(settings.tls_cert_file, settings.tls_key_file)
    grpc_server = GrpcServer(
        register(core),
        [SERVICE_NAME],
        settings.host,
        settings.grpc_port,
        workers=settings.grpc_threads,
        token=settings.token,
        credentials=credentials,
    )
    grpc_server.start()
    app = create_app(core, settings.token)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.http_port,
        log_level=settings.log_level.lower(),
        access_log=False,
        log_config=None,
    )
    http = uvicorn.Server(config)
    # Off the main thread uvicorn installs no signal handlers; this process owns shutdown.
    http_thread = threading.Thread(target=http.run, name="http", daemon=True)
    http_thread.start()
    code = 0
    while not stop.wait(0.2):
        if not http_thread.is_alive():
            log.error("HTTP server stopped unexpectedly (port %d in use?)", settings.http_port)
            code = 1
            break
    # Stop taking requests, give those in flight a short grace, then end the rest as errors (never silent 0s).
    http.should_exit = True
    grpc_server.stop(grace=2.0)
    core.drain(grace_s=2.0)
    core.close()
    http_thread.join(10)
    log.info("stopped")
    return code


def main(argv: list[str] | None = None) -> int:
    with exit_on_invalid_settings("grpo-reward"):
        settings = parse_settings(argv)
    setup_logging(settings.log_level, settings.json_logs)
    log.info(
        "grpo-reward starting: gRPC %s:%d, HTTP %s:%d, %d workers",
        settings.host,
        settings.grpc_port,
        settings.host,
        settings.http_port,
        settings.workers,
    )
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
