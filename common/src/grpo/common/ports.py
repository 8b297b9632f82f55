"""Binding a server's port: a taken port is one line naming the port and the setting that moves it, not a traceback."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings


@dataclass(frozen=True)
class PortSetting:
    """Where a port comes from, for error messages: its flag and its environment variable."""

    flag: str
    env: str
    prog: str = ""

    @classmethod
    def of(cls, settings: BaseSettings, field: str) -> PortSetting:
        """The flag and env var of `field` in a service's settings (`grpc_port` -> --grpc-port, GRPO_REWARD_GRPC_PORT)."""
        prefix = str(settings.model_config.get("env_prefix", ""))
        prog = str(settings.model_config.get("cli_prog_name") or "")
        return cls("--" + field.replace("_", "-"), f"{prefix}{field}".upper(), prog)

    def __str__(self) -> str:
        return f"{self.flag} / {self.env}"


class PortInUse(SystemExit):
    """A server could not bind its port. A SystemExit: the process ends with this one line and exit code 1."""

    def __init__(self, message: str, prog: str = "") -> None:
        self.message = f"{prog}: {message}" if prog else message
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


def bind_error(host: str, port: int, setting: PortSetting | None, exc: OSError | None = None) -> PortInUse:
    """The one-line error for a port that cannot be bound, with what to do about it."""
    named = f"port {port} ({setting})" if setting else f"port {port}"
    pick = f"pick another with {setting.flag}" if setting else "pick another port"
    prog = setting.prog if setting else ""
    if exc is None or exc.errno == errno.EADDRINUSE:
        return PortInUse(f"{named} is in use by another process; {pick} or stop that process", prog)
    if exc.errno == errno.EACCES:
        return PortInUse(f"{named}: permission denied (ports below 1024 need privileges); {pick}", prog)
    if exc.errno == errno.EADDRNOTAVAIL:
        return PortInUse(f"cannot bind {host}:{port}: no such local address; check the host setting", prog)
    return PortInUse(f"cannot bind {host}:{port} ({setting or 'port'}): {exc.strerror or exc}", prog)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def bind_tcp(host: str, port: int, setting: PortSetting | None = None) -> socket.socket:
    """A listening TCP socket on host:port (SO_REUSEADDR, as servers set it), or PortInUse."""
    # proto named: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP (0 means Nagle's
    # algorithm stays on, and a response's header and body writes cost a delayed ACK, ~40 ms, each request).
    sock = socket.socket(_family(host), socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise bind_error(host, port, setting, exc) from None
    return sock


def check_port_free(host: str, port: int, setting: PortSetting | None = None) -> None:
    """Raise PortInUse when host:port cannot be bound now; for servers (gRPC) that bind it themselves.

    Checked before gRPC's own bind so the error is ours: gRPC's is a RuntimeError without the reason.
    """
    if port != 0:
        bind_tcp(host, port, setting).close()


def check_ports(settings: BaseSettings, *fields: str) -> None:
    """Before a slow start (loading a model): each named port of `settings` can be bound now, else PortInUse."""
    host = str(getattr(settings, "host", "0.0.0.0"))
    for field in fields:
        check_port_free(host, int(getattr(settings, field)), PortSetting.of(settings, field))
