"""Small network helpers: free ports, exposure checks, addresses and the sockets the weight transports use."""

from __future__ import annotations

import ipaddress
import random
import socket
import ssl
import time
from pathlib import Path

LOWEST = 10_000


def _ephemeral_low() -> int:
    """The bottom of the kernel's ephemeral port range (32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (tests and local launchers).

    Chosen below the kernel's ephemeral range: the ports the kernel hands to bind(0) and outgoing connections
    (vLLM's own internal ports, for one) are then never the port a service was just told to listen on.
    """
    low = _ephemeral_low()
    for _ in range(100):
        port = random.randint(LOWEST, low - 1) if low - 1 > LOWEST else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def beyond_loopback(host: str) -> bool:
    """Does binding `host` accept connections from other machines? Only addresses that are all loopback do not
    (127.0.0.0/8, ::1, a name such as localhost resolving only to those); 0.0.0.0, :: and anything else do."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None)
    except (OSError, UnicodeError):
        return True  # the settings refuse such a host anyway
    return not infos or not all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def exposure_warning(host: str, token: str | None, env_prefix: str) -> str | None:
    """One line when a service with no token is bound beyond loopback (its control API is open to the network)."""
    if token or not beyond_loopback(host):
        return None
    return (
        f"bound to {host} with no token: anyone who reaches this machine may call every gRPC method; set "
        f"{env_prefix}TOKEN (--token), or bind to loopback (--host 127.0.0.1)"
    )


def split_host(address: str) -> str:
    """The host of a gRPC `host:port` address ("[::1]:50051" -> "::1")."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"."""
    host, port = address.rsplit(":", 1)
    return (host[1:-1] if host.startswith("[") else host), int(port)


def local_host_towards(host: str, port: int) -> str:
    """The local address this machine reaches `host` from: the interface gloo should listen on (a replica
    may have several; the one routing to the trainer is the one the trainer can reach back)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:  # UDP connect sends nothing, just routes
        probe.connect((host, port))
        return str(probe.getsockname()[0])


def server_ssl_context(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    """The TLS context of a listening socket serving `cert_file` (None: no TLS)."""
    if not cert_file:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context


def read_exactly(conn: socket.socket, size: int, deadline: float) -> bytes:
    """`size` bytes, or fewer when the peer ends first; TimeoutError at `deadline`, however the bytes trickle in."""
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the greeting did not arrive in time")
        conn.settimeout(left)  # each recv gets what is left, so one byte at a time cannot hold the slot
        more = conn.recv(size - len(data))
        if not more:
            break
        data += more
    return data


def shutdown_socket(conn: socket.socket) -> None:
    """Shut both directions now (a blocked send or recv on it returns), whether or not it is still open."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
