"""The rollout servicer is registered by hand (for the zero-copy weight stream): it must still serve every rpc."""

from __future__ import annotations

from grpo.common.weights.receiver import decode_chunk
from grpo.rollout.grpc_api import RolloutServicer, method_handlers
from grpo.v1 import rollout_pb2


def test_every_rpc_of_the_proto_has_a_handler() -> None:
    service = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
    handlers = method_handlers(RolloutServicer)  # type: ignore[arg-type]  # the unbound methods are enough here
    assert set(handlers) == {m.name for m in service.methods}
    for method in service.methods:
        handler = handlers[method.name]
        assert handler.request_streaming == method.client_streaming, method.name
        assert handler.response_streaming == method.server_streaming, method.name
    assert handlers["UpdateWeights"].request_deserializer is decode_chunk
