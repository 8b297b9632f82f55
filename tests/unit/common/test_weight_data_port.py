"""The weights data port over real loopback sockets: the rendezvous, the framing checks, TLS, and strangers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from grpo.common.net import free_port, server_ssl_context, split_host
from grpo.common.weights import data_port as wdp
from grpo.common.weights.codec import WeightUpdateError, make_header, specs_of, tensor_bytes, weights_checksum
from grpo.common.weights.receiver import WeightAssembler
from grpo.v1 import rollout_pb2
from tests.unit.reward.helpers import self_signed_cert


@pytest.fixture
def port() -> Iterator[wdp.WeightDataPort]:
    listener = wdp.WeightDataPort("127.0.0.1", 0, hello_timeout_s=1.0, max_waiting=2)
    yield listener
    listener.close()


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"a": torch.randn(1000, 300, generator=g), "b": torch.randn(7, generator=g)}  # ~1.2 MB


def _payload(tensors: dict[str, torch.Tensor]) -> bytes:
    return b"".join(tensor_bytes(tensors[n]) for n in sorted(tensors))


def _receive(listener: wdp.WeightDataPort, tensors: dict[str, torch.Tensor], token: str) -> WeightAssembler:
    """What the rollout service does for a call that names `token`: claim, read, check the end, then the header."""
    assembler = WeightAssembler(specs_of(tensors), loaded_version=0)
    conn, size = listener.claim(token, timeout_s=5)
    with conn:
        assembler.receive(size, wdp.reader(conn, time.monotonic() + 10))
        if assembler.offset == len(assembler.buffer):
            wdp.expect_end(conn)
    assembler.feed(_header_chunk(tensors))
    return assembler


def _header_chunk(tensors: dict[str, torch.Tensor]) -> rollout_pb2.WeightChunk:
    return rollout_pb2.WeightChunk(header=make_header(tensors, 1))


def _connect(port: int, token: str, ca_file: Path | None = None) -> socket.socket | None:
    return wdp.connect("127.0.0.1", port, token, len(_payload(_tensors())), ca_file)


def _send(conn: socket.socket, data: bytes) -> None:
    conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)


@pytest.mark.parametrize("connect_first", [True, False])
def test_bytes_arrive_whole_whichever_side_comes_first(port: wdp.WeightDataPort, connect_first: bool) -> None:
    tensors, token = _tensors(), wdp.new_token()
    sender = threading.Thread(target=lambda: None)
    if connect_first:
        conn = _connect(port.port, token)
        assert conn is not None
        sender = threading.Thread(target=_send, args=(conn, _payload(tensors)))
        sender.start()
    else:
        conns: list[socket.socket] = []

        def late() -> None:
            time.sleep(0.3)  # the claim is already waiting
            c = _connect(port.port, token)
            assert c is not None
            conns.append(c)
            _send(c, _payload(tensors))

        sender = threading.Thread(target=late)
        sender.start()
    version, checksum, got = _receive(port, tensors, token).finish()
    sender.join()
    assert (version, checksum) == (1, weights_checksum(tensors))
    assert all(torch.equal(got[n], tensors[n]) for n in tensors)


@pytest.mark.parametrize(
    ("how", "message"),
    [("corrupt", "sha256 mismatch"), ("short", "truncated"), ("long", "longer than the byte count it announced")],
)
def test_bad_data_is_rejected(port: wdp.WeightDataPort, how: str, message: str) -> None:
    tensors, token = _tensors(), wdp.new_token()
    data = bytearray(_payload(tensors))
    if how == "corrupt":
        data[12345] ^= 0x10
    elif how == "short":
        del data[-3:]
    else:
        data += b"\0"
    conn = _connect(port.port, token)
    assert conn is not None
    with conn:
        sender = threading.Thread(target=_send, args=(conn, bytes(data)))
        sender.start()
        with pytest.raises(WeightUpdateError, match=message):
            _receive(port, tensors, token).finish()
        sender.join()


def test_a_claim_without_a_connection_times_out_naming_the_port(port: wdp.WeightDataPort) -> None:
    with pytest.raises(WeightUpdateError, match=f"weights data port {port.port} within"):
        port.claim(wdp.new_token(), timeout_s=0.2)


def test_a_stalled_sender_fails_at_the_deadline(port: wdp.WeightDataPort) -> None:
    tensors, token = _tensors(), wdp.new_token()
    conn = _connect(port.port, token)
    assert conn is not None
    with conn:
        conn.sendall(_payload(tensors)[:1000])  # then nothing
        assembler = WeightAssembler(specs_of(tensors), loaded_version=0)
        server_side, size = port.claim(token, timeout_s=5)
        with server_side, pytest.raises(WeightUpdateError, match="in time"):
            assembler.receive(size, wdp.reader(server_side, time.monotonic() + 0.5))
        assembler.close()


def _closed_by_server(conn: socket.socket, within_s: float) -> bool:
    conn.settimeout(within_s)
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_strangers_and_unclaimed_connections_are_dropped(port: wdp.WeightDataPort) -> None:
    stranger = socket.create_connection(("127.0.0.1", port.port))
    stranger.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 64)
    assert _closed_by_server(stranger, 5), "a wrong greeting is closed at once"
    silent = socket.create_connection(("127.0.0.1", port.port))
    assert _closed_by_server(silent, 5), "a connection that says nothing is closed after the hello timeout"
    unclaimed = _connect(port.port, wdp.new_token())
    assert unclaimed is not None
    started = time.monotonic()
    assert _closed_by_server(unclaimed, 5) and time.monotonic() - started < 4, "closed after the hello timeout"
    for conn in (stranger, silent, unclaimed):
        conn.close()


def test_at_most_max_waiting_connections_are_held(port: wdp.WeightDataPort) -> None:
    held = [_connect(port.port, wdp.new_token()) for _ in range(2)]
    time.sleep(0.2)  # both greeted and waiting for a claim
    extra = socket.create_connection(("127.0.0.1", port.port))
    assert _closed_by_server(extra, 0.8), "a third connection is refused at once"
    for conn in [*held, extra]:
        assert conn is not None
        conn.close()


def _trickle(conn: socket.socket, every_s: float, stop: threading.Event) -> None:
    """A slow client: a good-looking greeting one byte every `every_s` (under the hello timeout) until dropped."""
    greeting = wdp.MAGIC + wdp.new_token().encode("ascii") + b"0" * wdp.SIZE_CHARS
    for i in range(len(greeting)):
        try:
            conn.send(greeting[i : i + 1])
        except OSError:
            return  # the server closed it: the next send after its FIN is refused
        if stop.wait(every_s):
            return


def test_slow_greetings_lose_their_slots_at_the_hello_timeout(port: wdp.WeightDataPort) -> None:
    stop = threading.Event()
    slow = [socket.create_connection(("127.0.0.1", port.port)) for _ in range(2)]  # every slot
    trickles = [threading.Thread(target=_trickle, args=(conn, 0.25, stop), daemon=True) for conn in slow]
    started = time.monotonic()
    try:
        for t in trickles:
            t.start()
        for t in trickles:
            t.join(timeout=5)
        assert not any(t.is_alive() for t in trickles), "a byte now and then keeps a greeting going"
        assert time.monotonic() - started < 2.5, "dropped about the hello timeout (1s) after they connected"
        tensors, token = _tensors(), wdp.new_token()
        conn = _connect(port.port, token)  # the slots are free again: a real transfer goes through
        assert conn is not None
        with conn:
            sender = threading.Thread(target=_send, args=(conn, _payload(tensors)))
            sender.start()
            _, checksum, _ = _receive(port, tensors, token).finish()
            sender.join()
        assert checksum == weights_checksum(tensors)
    finally:
        stop.set()
        for conn in slow:
            conn.close()


def test_a_discarded_token_is_dropped_before_and_after_it_arrives(port: wdp.WeightDataPort) -> None:
    early = wdp.new_token()
    port.discard(early)  # the header was rejected before its connection came
    conn = _connect(port.port, early)
    assert conn is not None and _closed_by_server(conn, 0.5)
    waiting = wdp.new_token()
    conn2 = _connect(port.port, waiting)
    assert conn2 is not None
    time.sleep(0.2)
    again = _connect(port.port, waiting)  # a token is good for one connection
    assert again is not None and _closed_by_server(again, 0.5)
    again.close()
    port.discard(waiting)
    assert _closed_by_server(conn2, 0.5)
    conn.close()
    conn2.close()


def test_connect_returns_none_when_the_port_is_closed(caplog: pytest.LogCaptureFixture) -> None:
    assert wdp.connect("127.0.0.1", free_port(), wdp.new_token(), 10, timeout_s=2) is None
    assert "sending the weights over gRPC" in caplog.text


def test_tls_round_trip_and_plaintext_refused(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    listener = wdp.WeightDataPort("127.0.0.1", 0, server_ssl_context(str(cert), str(key)), hello_timeout_s=1)
    try:
        tensors, token = _tensors(), wdp.new_token()
        conn = _connect(listener.port, token, cert)
        assert conn is not None
        sender = threading.Thread(target=_send, args=(conn, _payload(tensors)))
        sender.start()
        _, checksum, _ = _receive(listener, tensors, token).finish()
        sender.join()
        conn.close()
        assert checksum == weights_checksum(tensors)
        plain_token = wdp.new_token()
        plain = _connect(listener.port, plain_token)  # no CA: plaintext greeting to a TLS port
        assert plain is not None
        with pytest.raises(WeightUpdateError, match="within"):
            listener.claim(plain_token, timeout_s=1.5)
        plain.close()
    finally:
        listener.close()


def test_split_host_and_token_shape() -> None:
    assert split_host("10.0.0.7:50051") == "10.0.0.7"
    assert split_host("[::1]:50051") == "::1"
    assert split_host("rollout-0.rollout:50051") == "rollout-0.rollout"
    token = wdp.new_token()
    assert wdp.valid_token(token) and not wdp.valid_token(token.upper()) and not wdp.valid_token(token[:-1])


def test_announced_size_is_checked_before_and_against_the_header(port: wdp.WeightDataPort) -> None:
    tensors = _tensors()
    size = len(_payload(tensors))
    too_big = WeightAssembler(specs_of(tensors), loaded_version=0)
    with pytest.raises(WeightUpdateError, match="this model's weights are 1 to"):
        too_big.receive(size * 2 + 1, lambda view: 0)  # nothing is allocated for it
    other = WeightAssembler(specs_of(tensors), loaded_version=0)
    other.receive(size - 4, lambda view: len(view))
    with pytest.raises(WeightUpdateError, match=f"header total_bytes {size} != the {size - 4} bytes"):
        other.feed(_header_chunk(tensors))
    other.close()
