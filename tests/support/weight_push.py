"""`push_weights`: one weight update to one rollout replica, for tests and benchmarks (the trainer uses its pusher).

The trainer pushes through grpo.trainer.pusher (every replica, retries, relay, broadcast); tests and benchmarks
often want exactly one update to exactly one replica and the raw reply, or its gRPC error.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING

from grpo.common.weights.codec import CHUNK_BYTES
from grpo.common.weights.data_port import sender_for
from grpo.v1 import rollout_pb2

if TYPE_CHECKING:
    import torch


def push_weights(
    address: str,
    tensors: Mapping[str, torch.Tensor],
    version: int,
    token: str | None = None,
    timeout_s: float = 120.0,
    chunk_bytes: int = CHUNK_BYTES,
    checksum: str | Future[str] | None = None,
    ca_file: str | None = None,
    data_port: int = 0,
) -> rollout_pb2.UpdateWeightsResponse:
    """Send `tensors` as `version` to the rollout replica at `address` (TLS when `ca_file` is set);
    raises grpc.RpcError on rejection.

    With `data_port` (the replica's RolloutStatus.weights_data_port) the bytes go over that port,
    about 2x faster end to end; without it, or when the port cannot be reached, they follow the
    header in the gRPC stream (grpo.common.weights says how a transport is chosen).
    `checksum` may be a future (one hash shared by pushes to several replicas); None means compute it here.
    """
    return sender_for(data_port, chunk_bytes).push(
        address, tensors, version, token=token, timeout_s=timeout_s, checksum=checksum, ca_file=ca_file
    )
