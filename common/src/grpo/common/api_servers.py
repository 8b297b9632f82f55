"""A service's two API servers as its settings describe them: gRPC and HTTP on its host and ports, its token, TLS.

The rollout and the trainer serve both from threads (grpc_server.GrpcServer, http_server.HttpServer); the reward
service's are asyncio's and uvicorn's, started in its own __main__.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from grpo.common.auth import MethodTokens
from grpo.common.grpc_server import GrpcServer, server_credentials
from grpo.common.http_server import HttpServer, Routes
from grpo.common.ports import PortSetting
from grpo.common.settings import ServiceSettings

SERVED = ("host", "grpc_port", "http_port", "token", "tls_cert_file", "tls_key_file")


def api_servers(
    settings: ServiceSettings,
    register: Callable[[grpc.Server], None],
    service_names: Sequence[str],
    routes: Routes,
    http_name: str,
    *,
    workers: int = 16,
    method_tokens: MethodTokens | None = None,
) -> tuple[GrpcServer, HttpServer]:
    """Both servers bound, not started; `settings` must have the SERVED fields (the rollout's and trainer's do).
    A taken port is said by its setting's flag and environment variable."""
    s = settings.model_dump(include=set(SERVED))
    grpc_server = GrpcServer(
        register,
        service_names,
        s["host"],
        s["grpc_port"],
        workers=workers,
        token=s["token"],
        method_tokens=method_tokens,
        credentials=server_credentials(s["tls_cert_file"], s["tls_key_file"]),
        setting=PortSetting.of(settings, "grpc_port"),
    )
    http = HttpServer(
        routes,
        s["host"],
        s["http_port"],
        name=http_name,
        token=s["token"],
        setting=PortSetting.of(settings, "http_port"),
    )
    return grpc_server, http
