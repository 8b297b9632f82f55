"""Build a gRPC server the way every service needs it: health, reflection, auth, TLS, size limits.

`GrpcServer` serves from a thread pool, `AioGrpcServer` on the running asyncio loop; both are set up alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from grpo.common.auth import AioBearerTokenInterceptor, BearerTokenInterceptor, MethodTokens
from grpo.common.ports import PortInUse, PortSetting, check_port_free

log = logging.getLogger(__name__)

# 64 MiB: a whole weight chunk or a large Score batch fits; the weight stream is chunked anyway.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def server_credentials(cert_file: str | None, key_file: str | None) -> grpc.ServerCredentials | None:
    """TLS credentials when both a certificate and a key are configured."""
    if not cert_file and not key_file:
        return None
    if not (cert_file and key_file):
        raise ValueError("TLS needs both tls_cert_file and tls_key_file")
    return grpc.ssl_server_credentials([(Path(key_file).read_bytes(), Path(cert_file).read_bytes())])


def _options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Off: with SO_REUSEPORT a second server on a taken port would bind and share it silently.
        ("grpc.so_reuseport", 0),
    ]


def _bind(
    server: grpc.Server | grpc.aio.Server,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None,
    setting: PortSetting | None,
) -> int:
    """Listen on host:port; a taken port is PortInUse naming `setting`, not gRPC's reason-less RuntimeError."""
    check_port_free(host, port, setting)
    address = f"{host}:{port}"
    try:
        bound = (
            server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
        )
    except RuntimeError:
        raise _bind_failed(host, port, setting) from None
    if bound == 0:
        raise _bind_failed(host, port, setting)
    return int(bound)


def _bind_failed(host: str, port: int, setting: PortSetting | None) -> PortInUse:
    """gRPC's failed bind gives no reason: blame the port only if it really is taken (since the check above)."""
    check_port_free(host, port, setting)  # raises PortInUse naming the port when it is in use now
    where = f"{host}:{port}" + (f" ({setting})" if setting else "")
    return PortInUse(
        f"gRPC could not listen on {where}, and the port is free: check the host and the TLS certificate and key "
        "(gRPC logs its reason just above)",
        setting.prog if setting else "",
    )


class GrpcServer:
    """A started gRPC server (thread pool) with the standard health service and reflection."""

    def __init__(
        self,
        register: Callable[[grpc.Server], None],
        service_names: Sequence[str],
        host: str,
        port: int,
        *,
        workers: int = 16,
        token: str | None = None,
        method_tokens: MethodTokens | None = None,
        credentials: grpc.ServerCredentials | None = None,
        setting: PortSetting | None = None,
    ) -> None:
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers),
            interceptors=[BearerTokenInterceptor(token, method_tokens)],
            options=_options(),
        )
        register(self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        self.port = _bind(self.server, host, port, credentials, setting)
        self.service_names = list(service_names)

    def start(self) -> None:
        self.server.start()
        self.set_serving(True)
        log.info("gRPC listening on port %d (%s)", self.port, ", ".join(self.service_names))

    def set_serving(self, serving: bool) -> None:
        for name in ["", *self.service_names]:
            self.health.set(name, _status(serving))

    def stop(self, grace: float = 2.0) -> None:
        self.set_serving(False)
        self.server.stop(grace).wait()


class AioGrpcServer:
    """The same server on the running asyncio loop (grpc.aio): async servicers, no handler threads.

    Build it inside the loop that will serve it (grpc.aio binds the server to the current loop).
    """

    def __init__(
        self,
        register: Callable[[grpc.aio.Server], None],
        service_names: Sequence[str],
        host: str,
        port: int,
        *,
        token: str | None = None,
        method_tokens: MethodTokens | None = None,
        credentials: grpc.ServerCredentials | None = None,
        setting: PortSetting | None = None,
    ) -> None:
        self.server = grpc.aio.server(
            interceptors=[AioBearerTokenInterceptor(token, method_tokens)], options=_options()
        )
        register(self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        self.port = _bind(self.server, host, port, credentials, setting)
        self.service_names = list(service_names)

    async def start(self) -> None:
        await self.server.start()
        await self.set_serving(True)
        log.info("gRPC (aio) listening on port %d (%s)", self.port, ", ".join(self.service_names))

    async def set_serving(self, serving: bool) -> None:
        for name in ["", *self.service_names]:
            await self.health.set(name, _status(serving))

    async def stop(self, grace: float = 2.0) -> None:
        """NOT_SERVING first (balancers stop sending), then up to `grace` seconds for calls in flight."""
        await self.set_serving(False)
        await self.server.stop(grace)


def _status(serving: bool) -> health_pb2.HealthCheckResponse.ServingStatus.ValueType:
    return health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
