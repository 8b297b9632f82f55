"""Build a gRPC server the way every service needs it: health, reflection, auth, TLS."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from grpo.common.auth import BearerTokenInterceptor

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


class GrpcServer:
    """A started gRPC server with the standard health service and reflection."""

    def __init__(
        self,
        register: Callable[[grpc.Server], None],
        service_names: Sequence[str],
        host: str,
        port: int,
        *,
        workers: int = 16,
        token: str | None = None,
        method_tokens: dict[str, str] | None = None,
        credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers),
            interceptors=[BearerTokenInterceptor(token, method_tokens)],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        register(self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self.server)
        address = f"{host}:{port}"
        if credentials is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, credentials)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC to {address}")
        self.service_names = list(service_names)

    def start(self) -> None:
        self.server.start()
        self.set_serving(True)
        log.info("gRPC listening on port %d (%s)", self.port, ", ".join(self.service_names))

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.service_names]:
            self.health.set(name, status)

    def stop(self, grace: float = 2.0) -> None:
        self.set_serving(False)
        self.server.stop(grace).wait()
