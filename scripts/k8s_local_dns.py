"""A cluster DNS for scripts/k8s_local.sh's single-node cluster, which has none (no CoreDNS package exists here).

Answers A queries for `<service>.<namespace>.svc.<domain>` with the Service's ClusterIP, read from the API
server every second; every other name is NXDOMAIN (the cluster has no way out anyway). Runs in the cluster's
network namespace; the kubelet's `clusterDNS` points at it, so pods get the usual `search` list and resolve
`grpo-redis`, `grpo-redis.<ns>` and the full name as on any cluster. Standard library only (UDP and TCP).

    python scripts/k8s_local_dns.py --api https://127.0.0.1:6443 --pki /var/tmp/k8s-local/cluster/pki
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import socketserver
import ssl
import struct
import threading
import time
import urllib.request
from pathlib import Path

log = logging.getLogger("k8s-local-dns")
TYPE_A, CLASS_IN = 1, 1
NOERROR, NXDOMAIN, FORMERR = 0, 3, 1


class Records:
    """Service name -> ClusterIP, refreshed from the API server."""

    def __init__(self, api: str, pki: Path, domain: str) -> None:
        self.url = f"{api}/api/v1/services"
        self.domain = domain
        self.context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.names: dict[str, str] = {}

    def refresh(self) -> None:
        with urllib.request.urlopen(self.url, context=self.context, timeout=5) as reply:
            services = json.load(reply)["items"]
        names = {}
        for svc in services:
            ip = svc["spec"].get("clusterIP")
            if ip and ip != "None":
                names[f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.{self.domain}"] = ip
        if names != self.names:
            log.info("%d services", len(names))
        self.names = names

    def follow(self, every_s: float) -> None:
        while True:
            try:
                self.refresh()
            except Exception as exc:  # the API server restarting, or a reply we cannot read: keep the last answers
                log.warning("cannot list services: %s", exc)
            time.sleep(every_s)


def parse_question(query: bytes) -> tuple[int, int, str, int, bytes]:
    """(id, flags, lower-case name, qtype, the question section as sent) of a one-question query."""
    ident, flags, qdcount = struct.unpack("!HHH", query[:6])
    if qdcount != 1:
        raise ValueError("one question per query")
    labels, at = [], 12
    while query[at]:
        length = query[at]
        if length & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(query[at + 1 : at + 1 + length].decode("ascii", "replace"))
        at += 1 + length
    qtype, _ = struct.unpack("!HH", query[at + 1 : at + 5])
    return ident, flags, ".".join(labels).lower(), qtype, query[12 : at + 5]


def answer(query: bytes, names: dict[str, str]) -> bytes:
    """The reply to one query: the ClusterIP for a Service's A record, no data for its other types, else NXDOMAIN."""
    try:
        ident, flags, name, qtype, question = parse_question(query)
    except (ValueError, IndexError, struct.error):
        return struct.pack("!HHHHHH", int.from_bytes(query[:2] or b"\0\0", "big"), 0x8000 | FORMERR, 0, 0, 0, 0)
    ip = names.get(name)
    rcode = NOERROR if ip else NXDOMAIN
    records = b""
    if ip and qtype == TYPE_A:  # a pointer to the question's name (offset 12), TTL 5 s
        records = struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, 5, 4) + socket.inet_aton(ip)
    reply_flags = 0x8000 | 0x0400 | (flags & 0x0100) | rcode  # response, authoritative, RD copied
    return struct.pack("!HHHHHH", ident, reply_flags, 1, 1 if records else 0, 0, 0) + question + records


def serve(records: Records, host: str, port: int) -> None:
    class Udp(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data, sock = self.request
            sock.sendto(answer(data, records.names), self.client_address)

    class Tcp(socketserver.StreamRequestHandler):
        def handle(self) -> None:  # length-prefixed queries, several per connection (A and AAAA pipelined)
            while len(head := self.rfile.read(2)) == 2:
                reply = answer(self.rfile.read(struct.unpack("!H", head)[0]), records.names)
                self.wfile.write(struct.pack("!H", len(reply)) + reply)

    class UdpServer(socketserver.ThreadingUDPServer):
        allow_reuse_address = True
        daemon_threads = True

    class TcpServer(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    udp = UdpServer((host, port), Udp)  # bound before TCP listens: TCP up means both are
    tcp = TcpServer((host, port), Tcp)
    threading.Thread(target=tcp.serve_forever, daemon=True).start()
    log.info("answering for *.svc.%s on %s:%d (UDP and TCP)", records.domain, host, port)
    udp.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", default="https://127.0.0.1:6443")
    parser.add_argument("--pki", type=Path, default=Path("/var/tmp/k8s-local/cluster/pki"))
    parser.add_argument("--domain", default="cluster.local")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=53)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    records = Records(args.api, args.pki, args.domain)
    threading.Thread(target=records.follow, args=(1.0,), daemon=True).start()
    serve(records, args.host, args.port)


if __name__ == "__main__":
    main()
