"""Benchmark receiver host: K rollout weight receivers in one process, the real receive path with no engine.

Each receiver is what a rollout replica runs to take a weight update, minus the model: the rollout's own gRPC
servicer (`RolloutServicer.UpdateWeights`, `GetStatus`), `WeightUpdates` (one kept staging buffer, the
WeightAssembler's size / spec / version / sha256 checks, the apply under the update lock), a weights data
port, and a `Relayer` that forwards the receive buffer to the hops the call's plan names, at most at the
host's send rate. What stands in is `BenchReceiver`: the "service" with the specs of a synthetic checkpoint
whose `load_weights` records the version, checksum and the time it was applied, and copies nothing.

Several receivers share a process (bench_weight_fanout.py starts 8 per host) because 64 processes that
import torch (WeightAssembler.finish makes its tensors with it) would cost ~64 × its private memory on
top of the 64 staging buffers: measured, 8 hosts of 8 held 13.2 GiB private with every 201 MB buffer
mapped (12.0 GiB of buffers, ~0.15 GiB per process), so 64 processes would need ~21 GiB. Each receiver still has its own ports, sockets, threads and send-rate
bucket (its own "NIC"); they share the GIL, which the socket reads, sends and sha256 release.

Usage (driven by bench_weight_fanout.py over stdin / stdout, one JSON line each way):
  python bench/fanout_receivers.py --receivers 8 --prefix h0 --tensors 48 --elements 1048576
  → {"receivers": [{"replica_id": ..., "address": ..., "data_port": ...}, ...]}
  stdin: {"rate_mb_s": 10.0} (0: no cap) | {"specs": [tensors, elements]} | {"applied": version}
         → {"ok": true} | {"applied": {replica_id: [version, checksum, unix time applied]}}
  End of stdin stops the host.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from grpo.common.grpc_server import MAX_MESSAGE_BYTES
from grpo.common.send_rate import send_rate
from grpo.common.weights.codec import Specs
from grpo.common.weights.data_port import WeightDataPort
from grpo.common.weights.relay import Relayer
from grpo.rollout.grpc_api import RolloutServicer, add_servicer
from grpo.rollout.service import Status
from grpo.rollout.stats import Metrics
from grpo.rollout.weight_updates import WeightUpdates

log = logging.getLogger("fanout_receivers")


def synthetic_specs(tensors: int, elements: int) -> Specs:
    """The checkpoint the benchmark pushes: `tensors` fp32 tensors of `elements` each (48 × 1 Mi = 201 MB)."""
    return {f"layers.{i:03d}.weight": ("F32", (elements,)) for i in range(tensors)}


class BenchReceiver:
    """A benchmark stand-in for RolloutService: the weight-update half of it, no engine, no generation."""

    def __init__(self, replica_id: str, specs: Specs) -> None:
        self.replica_id = replica_id
        self.version, self.checksum = 0, ""
        self.applied: dict[int, tuple[str, float]] = {}
        self.metrics = Metrics()
        self.updates = WeightUpdates(specs, lambda: self.version, self.load_weights, self.metrics)
        self.updates.data_port = WeightDataPort("127.0.0.1", 0)
        self.relayer = Relayer(replica_id, on_sent=self.metrics.relayed_bytes.inc)

    def load_weights(self, version: int, checksum: str, tensors: dict[str, Any]) -> None:
        # An engine would copy `tensors` (views into the staging buffer) into the model here.
        self.version, self.checksum = version, checksum
        self.applied[version] = (checksum, time.time())

    def status(self) -> Status:
        port = self.updates.data_port
        return Status(self.replica_id, "synthetic", "none", self.version, self.checksum, 0, 0, 0, 0.0, 0,
                      port.port if port is not None else 0)  # fmt: skip

    def close(self) -> None:
        self.updates.close()


def serve(count: int, prefix: str, specs: Specs) -> tuple[list[BenchReceiver], list[grpc.Server], list[dict]]:
    receivers, servers, info = [], [], []
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    for i in range(count):
        receiver = BenchReceiver(f"{prefix}r{i}", specs)
        # An UpdateWeights call holds a thread for the whole push (and GetStatus calls come meanwhile).
        server = grpc.server(ThreadPoolExecutor(max_workers=6), options=options)
        add_servicer(RolloutServicer(receiver, 600.0, receiver.relayer), server)  # type: ignore[arg-type]
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        receivers.append(receiver)
        servers.append(server)
        assert receiver.updates.data_port is not None
        info.append({"replica_id": receiver.replica_id, "address": f"127.0.0.1:{port}",
                     "data_port": receiver.updates.data_port.port})  # fmt: skip
    return receivers, servers, info


def handle(command: dict, receivers: list[BenchReceiver]) -> dict:
    if "rate_mb_s" in command:
        for r in receivers:
            r.relayer.rate = send_rate(float(command["rate_mb_s"]))  # one bucket per receiver: its own NIC
        return {"ok": True}
    if "specs" in command:
        specs = synthetic_specs(*command["specs"])
        for r in receivers:
            r.updates.specs = specs
        return {"ok": True}
    if "applied" in command:
        version = int(command["applied"])
        return {"applied": {r.replica_id: [version, *r.applied[version]] for r in receivers if version in r.applied}}
    raise ValueError(f"unknown command {command}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--receivers", type=int, default=8)
    parser.add_argument("--prefix", default="h0")
    parser.add_argument("--tensors", type=int, default=48)
    parser.add_argument("--elements", type=int, default=1 << 20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {args.prefix} %(name)s %(message)s")
    receivers, servers, info = serve(args.receivers, args.prefix, synthetic_specs(args.tensors, args.elements))
    lock = threading.Lock()
    print(json.dumps({"receivers": info}), flush=True)
    try:
        for line in sys.stdin:  # end of stdin (the driver exited or died) stops the host
            with lock:
                print(json.dumps(handle(json.loads(line), receivers)), flush=True)
    finally:
        for server in servers:
            server.stop(grace=None)
        for r in receivers:
            r.close()


if __name__ == "__main__":
    main()
