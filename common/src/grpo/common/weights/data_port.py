"""The weights data port: a side TCP connection that carries the tensor bytes of a weight update.

Python gRPC moves ~0.5 GB/s through a client stream here (each message is copied into and out
of the C core); a plain socket moves the same bytes at ~1.5-2 GB/s straight into the replica's
receive buffer. So an update keeps its control path on gRPC (authenticated, validated and
answered there) and sends the bytes here, on a connection that opens with a one-time token the
UpdateWeights call names in its metadata (`DATA_TOKEN_KEY`). A connection is only read once an
authenticated call claims its token, so the port needs no credentials of its own; when gRPC
runs TLS, so does this port, with the same certificate. A pusher that cannot connect, or whose
connection the replica reports never reached it (the port full or the greeting lost), sends the
bytes in the gRPC stream instead. `DataPortSender` and `DataPortSource` are this transport's two sides
(grpo.common.weights.base); `sender_for` picks it or the stream from what a replica advertises.

Because the call, not the header, names the connection, the bytes can flow while the pusher
is still hashing them: the header (with the sha256) follows when the hash is done, and the
replica, hashing as the bytes arrive, compares the two. Two sha256 passes of the model then
overlap instead of adding up.

Wire, pusher -> replica: MAGIC, the token (64 hex characters), the byte count (16 hex
characters), exactly that many bytes, end of stream. Nothing comes back on the socket: the
result is the UpdateWeights reply.
"""

from __future__ import annotations

import collections
import logging
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from grpo.common.net import read_exactly, shutdown_socket, split_host
from grpo.common.send_rate import SendRate, paced
from grpo.common.weights.base import Push, WeightSender, WeightSource, remaining, resolve
from grpo.common.weights.codec import CHUNK_BYTES, WeightUpdateError, data_chunks, make_header
from grpo.common.weights.receiver import StreamMessage, WeightAssembler
from grpo.common.weights.stream import StreamSender
from grpo.v1 import rollout_pb2

log = logging.getLogger(__name__)

MAGIC = b"GRPOWD1\n"
TOKEN_CHARS = 64
SIZE_CHARS = 16
HELLO_BYTES = len(MAGIC) + TOKEN_CHARS + SIZE_CHARS
DATA_TOKEN_KEY = "grpo-data-token"  # UpdateWeights call metadata
# How a replica says its update's connection never reached it (so none of the bytes did): the pusher then
# sends them in the stream instead.
NOT_ARRIVED = "no connection with this update's data token reached the weights data port"
READ_BYTES = 8 * 1024 * 1024
MAX_WAITING = 8  # connections a port holds at once, in their greeting or waiting for their claim


def new_token() -> str:
    return secrets.token_hex(TOKEN_CHARS // 2)


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(c in "0123456789abcdef" for c in text)


def valid_token(token: str) -> bool:
    return _is_hex(token, TOKEN_CHARS)


class WeightDataPort:
    """The replica's listener: accepts connections, reads their token, hands them to the update that claims it.

    A connection and its claim may come in either order. One whose greeting takes longer than
    `hello_timeout_s` in all, or whose token nobody claims within `hello_timeout_s` after it, is
    closed, and at most `max_waiting` connections are held at once, so a stranger can neither pile
    up sockets nor hold one for long.
    """

    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        hello_timeout_s: float = 30.0,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=16)
        self.port: int = self._listener.getsockname()[1]
        self._ssl = ssl_context
        self.hello_timeout_s = hello_timeout_s
        self._max_waiting = max_waiting
        self._arrived: dict[str, tuple[socket.socket, int]] = {}
        self._discarded: collections.deque[str] = collections.deque(maxlen=64)
        self._held = 0  # connections in their hello or waiting for a claim
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="weights-data-port", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                if self._closed:
                    return
                continue
            with self._cond:
                full = self._held >= self._max_waiting
                if not full:
                    self._held += 1
            if full:
                log.warning("weights data port: %d connections already waiting; refusing %s", self._max_waiting, peer)
                conn.close()
                continue
            threading.Thread(target=self._hello, args=(conn, peer), name="weights-data-hello", daemon=True).start()

    def _hello(self, conn: socket.socket, peer: object) -> None:
        deadline = time.monotonic() + self.hello_timeout_s  # for the whole greeting, TLS handshake included
        try:
            conn.settimeout(self.hello_timeout_s)  # the handshake keeps to it as a whole
            if self._ssl is not None:
                conn = self._ssl.wrap_socket(conn, server_side=True)
            hello = read_exactly(conn, HELLO_BYTES, deadline)
            token = hello[len(MAGIC) : len(MAGIC) + TOKEN_CHARS].decode("ascii", "replace")
            size_hex = hello[len(MAGIC) + TOKEN_CHARS :].decode("ascii", "replace")
            if not hello.startswith(MAGIC) or not valid_token(token) or not _is_hex(size_hex, SIZE_CHARS):
                raise ValueError("not a weight data connection (bad greeting)")
        except (OSError, ValueError) as exc:
            log.warning("weights data port: dropped a connection from %s: %s", peer, exc)
            conn.close()
            with self._cond:
                self._held -= 1
            return
        with self._cond:
            # A token is good for one connection: a second one with it is dropped like a rejected update's.
            discarded = token in self._discarded or token in self._arrived
            if not discarded:
                self._arrived[token] = (conn, int(size_hex, 16))
                self._cond.notify_all()
                claimed = self._cond.wait_for(lambda: token not in self._arrived, self.hello_timeout_s)
                if not claimed:
                    del self._arrived[token]
            self._held -= 1
        if discarded:
            conn.close()
        elif not claimed:
            log.warning("weights data port: no update claimed the connection from %s; closed", peer)
            conn.close()

    def claim(self, token: str, timeout_s: float) -> tuple[socket.socket, int]:
        """(connection, byte count it announced) for `token`, once it has arrived; WeightUpdateError after
        `timeout_s`."""
        with self._cond:
            if not self._cond.wait_for(lambda: token in self._arrived or self._closed, timeout_s):
                raise WeightUpdateError(
                    f"{NOT_ARRIVED} {self.port} within {timeout_s:.0f}s (is the port reachable from the pusher?)"
                )
            if self._closed:
                raise WeightUpdateError("the weights data port is shutting down")
            return self._arrived.pop(token)

    def discard(self, token: str) -> None:
        """Drop the connection of a rejected update, now or as soon as it arrives."""
        with self._cond:
            arrived = self._arrived.pop(token, None)
            if arrived is None:
                self._discarded.append(token)
            self._cond.notify_all()
        if arrived is not None:
            arrived[0].close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            waiting, self._arrived = list(self._arrived.values()), {}
            self._cond.notify_all()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()
        for conn, _ in waiting:
            conn.close()
        self._thread.join(timeout=5)


def reader(conn: socket.socket, deadline: float) -> Callable[[memoryview], int]:
    """`recv_into` for WeightAssembler.receive: a stall or a dropped connection is a WeightUpdateError."""

    def read_into(view: memoryview) -> int:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WeightUpdateError("the weight data did not arrive in time")
        conn.settimeout(remaining)
        try:
            return conn.recv_into(view, min(len(view), READ_BYTES))
        except TimeoutError:
            raise WeightUpdateError("the weight data did not arrive in time") from None
        except OSError as exc:
            raise WeightUpdateError(f"the weight data connection failed: {exc}") from None

    return read_into


def expect_end(conn: socket.socket, timeout_s: float = 5.0) -> None:
    """After the announced bytes, the pusher must end the stream: a longer one is as wrong as a shorter one."""
    conn.settimeout(timeout_s)
    try:
        extra = conn.recv(1)
    except OSError as exc:
        raise WeightUpdateError(f"the weight data connection did not end after the announced bytes: {exc}") from None
    if extra:
        raise WeightUpdateError("the weight data is longer than the byte count it announced")


def connect(
    host: str, port: int, token: str, size: int, ca_file: str | Path | None = None, timeout_s: float = 5.0
) -> socket.socket | None:
    """A pusher's connection to a replica's data port with the greeting sent; None (logged) when it cannot
    connect, so the caller sends the bytes in the gRPC stream instead. TLS verified against `ca_file` when set."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        log.warning("weights data port %s:%d unreachable (%s); sending the weights over gRPC", host, port, exc)
        return None
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ca_file:
            context = ssl.create_default_context(cafile=str(ca_file))
            conn = context.wrap_socket(conn, server_hostname=host)
        conn.sendall(MAGIC + token.encode("ascii") + f"{size:0{SIZE_CHARS}x}".encode("ascii"))
    except (OSError, ssl.SSLError) as exc:
        conn.close()
        log.warning("weights data port %s:%d failed (%s); sending the weights over gRPC", host, port, exc)
        return None
    return conn


class DataPortSender(WeightSender):
    """The bytes on the replica's data port `port` while the header, once hashed, goes in the call; the gRPC
    stream when the port cannot be reached or the replica says the connection never reached it."""

    via = "data_port"

    def __init__(self, port: int, chunk_bytes: int, rate: SendRate | None = None) -> None:
        super().__init__(chunk_bytes, rate)
        self.port = port

    def send(self, push: Push) -> rollout_pb2.UpdateWeightsResponse:
        token, address = new_token(), push.address
        size = sum(t.numel() * t.element_size() for t in push.tensors.values())
        conn = connect(split_host(address), self.port, token, size, push.ca_file)
        if conn is None:  # logged: the bytes go in the stream instead
            return self._over_stream(push)
        try:
            return self._over_port(push, conn, token)
        except grpc.RpcError as exc:
            # A connection the port refused (all its slots held) or dropped before its greeting was read: the
            # replica claimed nothing, so the update was never applied and the stream can carry it whole.
            if exc.code() != grpc.StatusCode.INVALID_ARGUMENT or NOT_ARRIVED not in (exc.details() or ""):
                raise
            host = split_host(address)
            log.warning("weights data port %s:%d took none of the data; sending the weights over gRPC", host, self.port)
            return self._over_stream(push)

    def _over_stream(self, push: Push) -> rollout_pb2.UpdateWeightsResponse:
        fallback = StreamSender(self.chunk_bytes, self.rate)
        try:
            return fallback.send(push)
        finally:
            self.bytes_sent += fallback.bytes_sent  # the pusher's egress, whichever way the bytes went

    def _over_port(self, push: Push, conn: socket.socket, token: str) -> rollout_pb2.UpdateWeightsResponse:
        tensors, version, address = push.tensors, push.version, push.address
        with conn, ThreadPoolExecutor(1, thread_name_prefix="weights-sha256") as hasher:
            # The bytes go out while the header's sha256 is computed (hashlib releases the GIL).
            header = hasher.submit(lambda: make_header(tensors, version, resolve(push.checksum)))

            def header_message() -> Iterator[bytes]:  # gRPC's sending thread waits here for the hash
                yield rollout_pb2.WeightChunk(header=header.result()).SerializeToString()

            left = remaining(push.deadline)
            call = push.update.future(
                header_message(), timeout=left, metadata=(*push.metadata, (DATA_TOKEN_KEY, token))
            )
            # A rejected call ends at once: closing the socket then unblocks a send in progress.
            call.add_done_callback(lambda _: shutdown_socket(conn))
            conn.settimeout(left)
            try:
                send_data(conn, data_chunks(tensors, self.chunk_bytes), self.rate, self._count)
            except OSError as exc:
                log.debug("weight data send to %s stopped: %s (the reply says why)", address, exc)
            reply: rollout_pb2.UpdateWeightsResponse = call.result()
            return reply

    def _count(self, size: int) -> None:
        self.bytes_sent += size


def send_data(
    conn: socket.socket, views: Iterable[memoryview], rate: SendRate | None, on_sent: Callable[[int], None]
) -> None:
    """The update's bytes on a data-port connection, paced by `rate` (`on_sent` hears of each piece), then the
    end of the stream; OSError when the connection fails (the UpdateWeights reply says why)."""
    for view in views:
        for piece in paced(view, rate):
            conn.sendall(piece)
            on_sent(len(piece))
    conn.shutdown(socket.SHUT_WR)


class DataPortSource(WeightSource):
    """The bytes from the connection on `port` that opened with `token`; then the call's stream, header only."""

    via = "data_port"

    def __init__(self, port: WeightDataPort | None, token: str) -> None:
        self.port = port
        self.token = token

    def fill(self, assembler: WeightAssembler, messages: Iterable[StreamMessage], deadline: float) -> None:
        if self.port is None:
            raise WeightUpdateError("this replica has no weights data port: send the bytes in the stream")
        # The pusher connects before it starts the call, so its connection is here or about to be.
        wait = min(deadline - time.monotonic(), self.port.hello_timeout_s)
        try:
            conn, size = self.port.claim(self.token, max(wait, 0.0))
        except WeightUpdateError:
            self.port.discard(self.token)  # should it come after all
            raise
        with conn:
            assembler.receive(size, reader(conn, deadline))
            if assembler.offset == len(assembler.buffer):
                expect_end(conn)
        for message in messages:
            assembler.feed(message)

    def abandon(self) -> None:
        if self.port is not None:
            self.port.discard(self.token)


def sender_for(data_port: int, chunk_bytes: int = CHUNK_BYTES, rate: SendRate | None = None) -> WeightSender:
    """The transport for a replica that advertises `data_port` (0: none, so the gRPC stream), sending at most at
    `rate` (shared with the host's other senders) when set."""
    if data_port:
        return DataPortSender(data_port, chunk_bytes, rate)
    return StreamSender(chunk_bytes, rate)
