"""Every server builder turns a taken port into one PortInUse line naming the port and its setting."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator

import grpc
import pytest

from grpo.common.grpc_server import AioGrpcServer, GrpcServer
from grpo.common.http_server import HttpServer, json_response
from grpo.common.ports import PortInUse, PortSetting, bind_error, bind_tcp
from grpo.common.settings import ServiceSettings, service_config

SETTING = PortSetting("--grpc-port", "GRPO_TEST_GRPC_PORT", "grpo-test")


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _expected(port: int) -> str:
    return (
        f"grpo-test: port {port} (--grpc-port / GRPO_TEST_GRPC_PORT) is in use by another process; "
        "pick another with --grpc-port or stop that process"
    )


def _nothing(server: grpc.Server | grpc.aio.Server) -> None:
    pass


class _Settings(ServiceSettings):
    model_config = service_config("GRPO_TEST_", "grpo-test")
    http_port: int = 8000


def test_setting_names_come_from_the_settings_class() -> None:
    setting = PortSetting.of(_Settings(), "http_port")
    assert (setting.flag, setting.env, setting.prog) == ("--http-port", "GRPO_TEST_HTTP_PORT", "grpo-test")


def test_sync_grpc_server_on_a_taken_port(taken: int) -> None:
    with pytest.raises(PortInUse) as info:
        GrpcServer(_nothing, [], "127.0.0.1", taken, setting=SETTING)
    assert str(info.value) == _expected(taken)
    assert info.value.code == _expected(taken)  # a SystemExit: the interpreter prints this line, exit code 1


def test_aio_grpc_server_on_a_taken_port(taken: int) -> None:
    async def build() -> None:
        AioGrpcServer(_nothing, [], "127.0.0.1", taken, setting=SETTING)

    with pytest.raises(PortInUse) as info:
        asyncio.run(build())
    assert str(info.value) == _expected(taken)


def test_http_server_on_a_taken_port(taken: int) -> None:
    with pytest.raises(PortInUse) as info:
        HttpServer({"/healthz": lambda: json_response({})}, "127.0.0.1", taken, setting=SETTING)
    assert str(info.value) == _expected(taken)


def test_other_bind_errors_say_what_to_do() -> None:
    denied = bind_error("0.0.0.0", 80, SETTING, OSError(errno.EACCES, "Permission denied"))
    assert "permission denied" in str(denied) and "--grpc-port" in str(denied)
    nowhere = bind_error("10.255.0.1", 7052, SETTING, OSError(errno.EADDRNOTAVAIL, "Cannot assign"))
    assert "no such local address" in str(nowhere)


def test_aio_server_serves_health_and_refuses_calls_without_the_token() -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async def run() -> tuple[int, grpc.StatusCode]:
        server = AioGrpcServer(_nothing, ["grpo.v1.Nothing"], "127.0.0.1", 0, token="s3cret")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                call = channel.unary_unary("/grpo.v1.Nothing/Call")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(b"", timeout=5)
                return health.status, info.value.code()
        finally:
            await server.stop(0)

    status, code = asyncio.run(run())
    assert status == 1  # SERVING
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_connections_accepted_on_a_bound_socket_send_without_nagle_delay() -> None:
    """asyncio turns on TCP_NODELAY only for IPPROTO_TCP sockets; without it each HTTP answer waited ~40 ms."""

    async def run() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listening = bind_tcp("127.0.0.1", 0)
        server = await asyncio.start_server(on_connect, sock=listening)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", listening.getsockname()[1])
            nodelay = await asyncio.wait_for(accepted, 5)
            writer.close()
        return nodelay

    assert asyncio.run(run()) != 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("port", [0, "free"])
@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_a_grpc_bind_that_fails_on_a_free_port_does_not_blame_the_port(port: int | str, kind: str) -> None:
    """Bad TLS material makes gRPC's bind fail with no reason: the port is free, so do not say it is in use."""
    number = _free_port() if port == "free" else int(port)
    garbage = grpc.ssl_server_credentials([(b"garbage", b"garbage")])

    async def build() -> None:
        AioGrpcServer(_nothing, [], "127.0.0.1", number, credentials=garbage, setting=SETTING)

    with pytest.raises(PortInUse) as info:
        if kind == "sync":
            GrpcServer(_nothing, [], "127.0.0.1", number, credentials=garbage, setting=SETTING)
        else:
            asyncio.run(build())
    assert str(info.value) == (
        f"grpo-test: gRPC could not listen on 127.0.0.1:{number} (--grpc-port / GRPO_TEST_GRPC_PORT), and the port "
        "is free: check the host and the TLS certificate and key (gRPC logs its reason just above)"
    )
