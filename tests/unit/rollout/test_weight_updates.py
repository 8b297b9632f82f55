"""The replica's receive path takes any WeightSource: a backend that is neither the stream nor the data port
(here the bytes handed over in memory, as a shared-memory backend would) gets the same checks and apply."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.weights.base import WeightSource
from grpo.common.weights.codec import WeightUpdateError, data_pieces, make_header, model_weights
from grpo.common.weights.receiver import StreamMessage, WeightAssembler
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.service import RolloutService
from grpo.v1 import rollout_pb2


class MemorySource(WeightSource):
    """The bytes of the update from memory, before the header (as a data port delivers them)."""

    via = "memory"

    def __init__(self, data: bytes) -> None:
        self.data = data

    def fill(self, assembler: WeightAssembler, messages: Iterable[StreamMessage], deadline: float) -> None:
        sent = 0

        def read_into(view: memoryview) -> int:
            nonlocal sent
            n = min(len(view), len(self.data) - sent)
            view[:n] = self.data[sent : sent + n]
            sent += n
            return n

        assembler.receive(len(self.data), read_into)
        for message in messages:
            assembler.feed(message)


@pytest.fixture(scope="module")
def service() -> Iterator[RolloutService]:
    svc = RolloutService(HFEngine(str(ensure_tiny_model()), torch_threads=1), "tiny")
    yield svc
    svc.close()


def _update(service: RolloutService, seed: int) -> tuple[rollout_pb2.WeightHeader, bytes]:
    g = torch.Generator().manual_seed(seed)
    new = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in model_weights(service.engine.model).items()}
    data = b"".join(b"".join(pieces) for pieces in data_pieces(new, 1 << 20))
    return make_header(new, service.version + 1), data


def test_a_new_backend_plugs_into_the_receive_path(service: RolloutService) -> None:
    header, data = _update(service, seed=1)
    result = service.updates.update([rollout_pb2.WeightChunk(header=header)], MemorySource(data))
    assert (result.version, result.checksum) == (header.version, header.sha256)
    assert (service.version, service.checksum) == (header.version, header.sha256)
    assert service.metrics.update_bytes.labels("memory")._value.get() == len(data)


def test_a_new_backend_gets_the_same_checks(service: RolloutService) -> None:
    header, data = _update(service, seed=2)
    before = (service.version, service.checksum)
    corrupt = bytes([data[0] ^ 1]) + data[1:]
    with pytest.raises(WeightUpdateError, match="sha256 mismatch"):
        service.updates.update([rollout_pb2.WeightChunk(header=header)], MemorySource(corrupt), data_timeout_s=5)
    with pytest.raises(WeightUpdateError, match="total_bytes"):
        service.updates.update([rollout_pb2.WeightChunk(header=header)], MemorySource(data[:-4]), data_timeout_s=5)
    assert (service.version, service.checksum) == before
