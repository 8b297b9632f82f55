"""The gRPC servicer: proto messages in, checked plain values to RolloutService, proto messages out."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict

import grpc

from grpo.common.weights.broadcast import BROADCAST_KEY
from grpo.common.weights.codec import WeightUpdateError
from grpo.common.weights.data_port import DATA_TOKEN_KEY, valid_token
from grpo.common.weights.receiver import StreamMessage, decode_chunk
from grpo.common.weights.relay import Relayer, ReplicaRelay, plan_in, relayed_trailer
from grpo.rollout.engines.base import GenerationCancelled, PromptOutput
from grpo.rollout.request_checks import BadRequest, encode_prompts, sampling_params
from grpo.rollout.service import RolloutService, WeightsBroken
from grpo.rollout.weight_updates import UpdateBusy
from grpo.v1 import rollout_pb2, rollout_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
UPDATE_METHOD = f"/{SERVICE_NAME}/UpdateWeights"
STATUS_METHOD = f"/{SERVICE_NAME}/GetStatus"


class StreamLimit:
    """Cancels an RPC whose request stream has not ended within `limit_s`, even if no message ever arrives."""

    def __init__(self, context: grpc.ServicerContext, limit_s: float) -> None:
        self.limit_s = limit_s
        self.expired = False
        self._context = context
        self._lock = threading.Lock()
        self._done = False
        # A timer rather than a per-chunk clock check: a stalled stream sends no chunk to check on.
        self._timer = threading.Timer(limit_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
        log.warning("weight stream not finished within %.0fs: cancelling it", self.limit_s)
        self._context.cancel()  # the blocked read of the stream raises; the partial stream is dropped

    def wrap(self, chunks: Iterable[StreamMessage]) -> Iterator[StreamMessage]:
        """`chunks`, and the limit stops once the last one has arrived (the apply is not cut off)."""
        yield from chunks
        self.finish()
        if self.expired:  # lost the race with the timer: the caller has been told CANCELLED, so do not apply
            raise WeightUpdateError(f"the stream did not finish within {self.limit_s:.0f}s")

    def finish(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


def to_response(
    outputs: list[PromptOutput], version: int, checksum: str, wall_s: float
) -> rollout_pb2.GenerateResponse:
    results = [
        rollout_pb2.PromptResult(
            prompt_token_ids=o.prompt_token_ids,
            completions=[
                rollout_pb2.Completion(
                    text=s.text, token_ids=s.token_ids, logprobs=s.logprobs, finish_reason=s.finish_reason
                )
                for s in o.samples
            ],
        )
        for o in outputs
    ]
    return rollout_pb2.GenerateResponse(
        results=results, weight_version=version, weight_checksum=checksum, wall_s=wall_s
    )


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(
        self, service: RolloutService, weights_stream_timeout_s: float = 300.0, relayer: Relayer | None = None
    ) -> None:
        self.service = service
        self.weights_stream_timeout_s = weights_stream_timeout_s
        # How this replica relays an update to the replicas its call names (grpo.common.weights.relay).
        self.relayer = relayer or Relayer(service.replica_id)

    def Generate(
        self, request: rollout_pb2.GenerateRequest, context: grpc.ServicerContext
    ) -> rollout_pb2.GenerateResponse:
        start = time.monotonic()
        try:
            params = sampling_params(request.sampling, self.service.limits)
            prompts = encode_prompts(self.service, list(request.prompts), params.max_new_tokens)
        except BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            outputs, version, checksum = self.service.generate(prompts, params, wanted=context.is_active)
        except WeightsBroken as exc:  # until a complete update: another replica, or a retry then, can serve it
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except GenerationCancelled as exc:
            # The caller has its status already (gRPC ended the call); this one is for the server's own records.
            left = context.time_remaining()
            expired = left is not None and left <= 0
            log.info("generate dropped: %s", exc)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED, str(exc))
        except Exception as exc:  # an engine failure: the caller gets what failed, not gRPC's bare UNKNOWN
            log.exception("generate failed")
            context.abort(grpc.StatusCode.INTERNAL, f"generation failed on replica {self.service.replica_id}: "
                          f"{type(exc).__name__}: {exc}")  # fmt: skip
        return to_response(outputs, version, checksum, time.monotonic() - start)

    def UpdateWeights(
        self, request_iterator: Iterator[StreamMessage], context: grpc.ServicerContext
    ) -> rollout_pb2.UpdateWeightsResponse:
        # Bounded on the server: a pusher that sets no deadline and stops sending must not hold a stream forever.
        limit = StreamLimit(context, self.weights_stream_timeout_s)
        metadata = dict(context.invocation_metadata())
        data_token = metadata.get(DATA_TOKEN_KEY)
        relay: ReplicaRelay | None = None
        try:
            if data_token is not None and not valid_token(data_token):
                raise WeightUpdateError(f"{DATA_TOKEN_KEY} metadata must be 64 lowercase hex characters")
            try:
                plan = plan_in(metadata)
            except ValueError as exc:
                raise WeightUpdateError(str(exc)) from None
            if plan is not None and plan.hops:  # started now: the hops' connections open before any byte comes
                relay = ReplicaRelay(self.relayer, plan, self._deadline(context))
            updates = self.service.updates
            result = updates.update(
                limit.wrap(request_iterator),
                updates.source(data_token, metadata.get(BROADCAST_KEY)),
                lock_timeout_s=limit.limit_s,
                data_timeout_s=limit.limit_s,
                relay=relay,
                # gRPC ends the call when it is cancelled or its deadline passes. Reading the deadline here as
                # well raced the caller's own timer, which then got our ABORTED for its DEADLINE_EXCEEDED.
                wanted=context.is_active,
            )
        except WeightUpdateError as exc:
            code = grpc.StatusCode.FAILED_PRECONDITION if exc.precondition else grpc.StatusCode.INVALID_ARGUMENT
            self._reject(context, relay, code, f"weight update rejected, version {self.service.version} keeps "
                         f"serving: {exc}")  # fmt: skip
        except WeightsBroken as exc:
            self._reject(context, relay, grpc.StatusCode.INTERNAL, f"weight update failed: {exc}")
        except UpdateBusy as exc:
            self._reject(
                context, relay, grpc.StatusCode.ABORTED, f"{exc}; version {self.service.version} keeps serving"
            )
        finally:
            limit.finish()
        relayed = relay.results() if relay is not None else None
        return rollout_pb2.UpdateWeightsResponse(**asdict(result), relayed=relayed or [])

    def _deadline(self, context: grpc.ServicerContext) -> float:
        """When this call's relaying must be over: the caller's deadline, at most the stream limit."""
        left = context.time_remaining()
        return time.monotonic() + min(left if left is not None else float("inf"), self.weights_stream_timeout_s)

    @staticmethod
    def _reject(context: grpc.ServicerContext, relay: ReplicaRelay | None, code: grpc.StatusCode, message: str) -> None:
        """Abort the call; a relaying replica's subtree results ride in its trailing metadata."""
        relayed = relay.results() if relay is not None else None
        if relayed is not None:
            context.set_trailing_metadata(relayed_trailer(relayed))
        context.abort(code, message)

    def GetStatus(
        self, request: rollout_pb2.GetStatusRequest, context: grpc.ServicerContext
    ) -> rollout_pb2.RolloutStatus:
        return rollout_pb2.RolloutStatus(**asdict(self.service.status()))


def method_handlers(servicer: RolloutServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The generated handlers, except that UpdateWeights data chunks arrive as zero-copy views of the
    received bytes (`decode_chunk`) instead of parsed copies: at 200 MB a copy costs more than the hash."""
    return {
        "Generate": grpc.unary_unary_rpc_method_handler(
            servicer.Generate,
            request_deserializer=rollout_pb2.GenerateRequest.FromString,
            response_serializer=rollout_pb2.GenerateResponse.SerializeToString,
        ),
        "UpdateWeights": grpc.stream_unary_rpc_method_handler(
            servicer.UpdateWeights,
            request_deserializer=decode_chunk,
            response_serializer=rollout_pb2.UpdateWeightsResponse.SerializeToString,
        ),
        "GetStatus": grpc.unary_unary_rpc_method_handler(
            servicer.GetStatus,
            request_deserializer=rollout_pb2.GetStatusRequest.FromString,
            response_serializer=rollout_pb2.RolloutStatus.SerializeToString,
        ),
    }


def add_servicer(servicer: RolloutServicer, server: grpc.Server) -> None:
    """`add_RolloutServiceServicer_to_server` with `method_handlers`."""
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def register(
    service: RolloutService, weights_stream_timeout_s: float = 300.0, relayer: Relayer | None = None
) -> Callable[[grpc.Server], None]:
    def add(server: grpc.Server) -> None:
        add_servicer(RolloutServicer(service, weights_stream_timeout_s, relayer), server)

    return add
