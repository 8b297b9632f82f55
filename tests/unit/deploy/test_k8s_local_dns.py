"""scripts/k8s_local_dns.py, the test cluster's DNS: real queries over UDP and TCP to the running server."""

from __future__ import annotations

import importlib.util
import socket
import struct
import threading
from pathlib import Path
from types import ModuleType

import pytest

from grpo.common.net import free_port

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "k8s_local_dns.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("k8s_local_dns", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def query(name: str, qtype: int = 1, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, 1)


def decode(reply: bytes) -> tuple[int, int, list[str]]:
    """(id, rcode, the A records' addresses) of a reply to one question."""
    ident, flags, _, ancount = struct.unpack("!HHHH", reply[:8])
    at = 12
    while reply[at]:
        at += 1 + reply[at]
    at += 5
    addresses = []
    for _ in range(ancount):
        _, rtype, _, _, size = struct.unpack("!HHHIH", reply[at : at + 12])
        if rtype == 1:
            addresses.append(socket.inet_ntoa(reply[at + 12 : at + 12 + size]))
        at += 12 + size
    return ident, flags & 0xF, addresses


@pytest.fixture(scope="module")
def server() -> tuple[int, ModuleType]:
    dns = load()
    records = dns.Records.__new__(dns.Records)  # no API server here: the names are set directly
    records.domain = "cluster.local"
    records.names = {"demo-grpo-redis.ns.svc.cluster.local": "10.96.0.42"}
    port = free_port()
    threading.Thread(target=dns.serve, args=(records, "127.0.0.1", port), daemon=True).start()
    for _ in range(100):  # until the TCP listener (started first) accepts
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            threading.Event().wait(0.05)
    return port, dns


def ask_udp(port: int, packet: bytes) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.sendto(packet, ("127.0.0.1", port))
        return sock.recv(512)


def test_a_service_name_resolves_to_its_cluster_ip(server: tuple[int, ModuleType]) -> None:
    port, _ = server
    assert decode(ask_udp(port, query("demo-grpo-redis.ns.svc.cluster.local"))) == (0x1234, 0, ["10.96.0.42"])
    assert decode(ask_udp(port, query("DEMO-grpo-redis.ns.svc.Cluster.Local", ident=7))) == (7, 0, ["10.96.0.42"])


def test_other_names_are_nxdomain_and_other_types_have_no_data(server: tuple[int, ModuleType]) -> None:
    port, _ = server
    # The resolver walks the search list: demo-grpo-redis.<ns>.svc.cluster.local is tried before the bare name.
    assert decode(ask_udp(port, query("demo-grpo-redis.svc.cluster.local"))) == (0x1234, 3, [])
    assert decode(ask_udp(port, query("huggingface.co"))) == (0x1234, 3, [])
    assert decode(ask_udp(port, query("demo-grpo-redis.ns.svc.cluster.local", qtype=28))) == (0x1234, 0, [])


def test_tcp_queries_and_malformed_packets(server: tuple[int, ModuleType]) -> None:
    port, dns = server
    packet = query("demo-grpo-redis.ns.svc.cluster.local")
    aaaa = query("demo-grpo-redis.ns.svc.cluster.local", qtype=28, ident=5)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # two queries pipelined, as glibc does
        sock.sendall(struct.pack("!H", len(packet)) + packet + struct.pack("!H", len(aaaa)) + aaaa)
        replies = sock.makefile("rb")
        first = replies.read(struct.unpack("!H", replies.read(2))[0])
        second = replies.read(struct.unpack("!H", replies.read(2))[0])
        assert decode(first) == (0x1234, 0, ["10.96.0.42"]) and decode(second) == (5, 0, [])
    assert struct.unpack("!HH", dns.answer(b"\x00\x09garbage", {})[:4]) == (9, 0x8001)  # FORMERR, same id
