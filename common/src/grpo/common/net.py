"""Small network helpers."""

from __future__ import annotations

import ipaddress
import random
import socket
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
