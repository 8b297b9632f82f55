"""The stream transport: the bytes follow the header in the UpdateWeights call itself (always available).

Every other transport falls back to it; it is also what a replica with no data port gets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from grpo.common.weights.base import Push, WeightSender, WeightSource, remaining, resolve
from grpo.common.weights.codec import iter_wire_messages
from grpo.common.weights.receiver import StreamMessage, WeightAssembler
from grpo.v1 import rollout_pb2


class StreamSender(WeightSender):
    """The bytes in the gRPC stream, in chunks of at most `chunk_bytes` after the header."""

    via = "stream"

    def send(self, push: Push) -> rollout_pb2.UpdateWeightsResponse:
        messages = iter_wire_messages(push.tensors, push.version, self.chunk_bytes, resolve(push.checksum))
        reply: rollout_pb2.UpdateWeightsResponse = push.update(
            self._counted(messages), timeout=remaining(push.deadline), metadata=push.metadata
        )
        return reply

    def _counted(self, messages: Iterable[bytes]) -> Iterator[bytes]:
        for i, message in enumerate(messages):
            if i and self.rate is not None:
                self.rate.take(len(message))
            yield message
            if i:  # the first is the header; a data message is its bytes and a few of framing
                self.bytes_sent += len(message)


class StreamSource(WeightSource):
    """The bytes follow the header in the call's stream."""

    via = "stream"

    def fill(self, assembler: WeightAssembler, messages: Iterable[StreamMessage], deadline: float) -> None:
        for message in messages:  # the stream's own limit (the servicer's StreamLimit) bounds this
            assembler.feed(message)
