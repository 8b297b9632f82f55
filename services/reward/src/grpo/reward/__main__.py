"""`grpo-reward` / `python -m grpo.reward`: gRPC (grpc.aio) and HTTP (uvicorn) on one asyncio loop around one core."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from grpo.common.logs import setup_logging
from grpo.common.settings import exit_on_invalid_settings
from grpo.reward.settings import RewardSettings, parse_settings

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("grpo.reward")
# Past these, work still in flight at shutdown is ended (answered as errors, never as silent 0s).
GRACE_S = 2.0
HTTP_CLOSE_S = 10.0


def serve(settings: RewardSettings) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""
    return asyncio.run(_serve(settings))


async def _serve(settings: RewardSettings) -> int:
    # Heavy imports only after the settings are known to be valid (`--help` stays instant).
    from grpo.common.grpc_server import AioGrpcServer, server_credentials
    from grpo.common.ports import PortSetting, bind_tcp, check_port_free
    from grpo.reward.core import RewardCore
    from grpo.reward.grpc_api import SERVICE_NAME, register
    from grpo.reward.http_api import create_app

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, sig, stop)
    # Both ports before the pools start: a taken port is one line at once, not after seconds of start-up.
    grpc_setting = PortSetting.of(settings, "grpc_port")
    http_socket = bind_tcp(settings.host, settings.http_port, PortSetting.of(settings, "http_port"))
    check_port_free(settings.host, settings.grpc_port, grpc_setting)
    # Blocks the loop for the seconds the pools take; a signal meanwhile is seen right after (the check below).
    # Built on the main thread: /proc lists a thread's children under that thread.
    core = RewardCore(settings)
    try:
        if stop.is_set():
            return 0
        grpc_server = AioGrpcServer(
            register(core),
            [SERVICE_NAME],
            settings.host,
            settings.grpc_port,
            token=settings.token,
            credentials=server_credentials(settings.tls_cert_file, settings.tls_key_file),
            setting=grpc_setting,
        )
        await grpc_server.start()
        http = _http_server(create_app(core, settings.token), settings)
        http_task = asyncio.create_task(http.serve(sockets=[http_socket]))
        await asyncio.wait({http_task, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if http_task.done():
            log.error("HTTP server stopped unexpectedly: %s", http_task.exception() or "no error")
            code = 1
        # Stop taking requests, give those in flight a short grace, then end the rest as errors.
        http.should_exit = True
        await grpc_server.stop(grace=GRACE_S)
        await core.drain(grace_s=GRACE_S)
    finally:
        # Closing the pools blocks; off the loop, so the answers it causes still go out.
        await asyncio.to_thread(core.close)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(http_task), HTTP_CLOSE_S)
    http_socket.close()
    log.info("stopped")
    return code


def _on_signal(sig: signal.Signals, stop: asyncio.Event) -> None:
    log.info("signal %s: shutting down", sig.name)
    stop.set()


def _http_server(app: object, settings: RewardSettings) -> uvicorn.Server:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # This process owns its signals (the loop's handlers above); uvicorn's would re-raise them at exit.
            yield

    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=settings.host,
        port=settings.http_port,
        log_level=settings.log_level.lower(),
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=int(HTTP_CLOSE_S),
    )
    return Server(config)


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
