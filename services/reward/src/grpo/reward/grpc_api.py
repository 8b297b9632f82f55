"""gRPC edge (grpc.aio): grpo.v1.RewardService. Thin methods: protobuf -> pydantic -> core -> protobuf.

The servicer runs on the same asyncio loop as the HTTP edge and awaits the core directly; a cancelled call
cancels its coroutine, and with it the items still running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeAlias

import grpc
from google.protobuf.message import DecodeError, Message
from pydantic import BaseModel

from grpo.reward import metrics
from grpo.reward.convert import Undecodable, model_to_proto, parse_request
from grpo.reward.core import RewardCore
from grpo.reward.errors import DeadlineExceeded, InputError, Overloaded
from grpo.reward.schemas import ExecuteRequest, ScoreRequest, VerifyCodeRequest, VerifyMathRequest
from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "grpo.v1.RewardService"
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


def _remaining(context: Context) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None or remaining > 1e9 else max(0.0, remaining)


async def _abort(context: Context, method: str, exc: BaseException) -> NoReturn:
    if isinstance(exc, InputError):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(exc, Overloaded):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
    elif isinstance(exc, DeadlineExceeded | TimeoutError):
        code = grpc.StatusCode.DEADLINE_EXCEEDED
    else:
        log.exception("unexpected error in %s", method, exc_info=exc)
        code = grpc.StatusCode.INTERNAL
    metrics.REQUESTS.labels(f"grpc/{method}", code.name).inc()
    await context.abort(code, str(exc) or type(exc).__name__)
    raise AssertionError("context.abort always raises")  # for the type checker


def _count_abandoned() -> None:
    """Count a call cancelled before its answer: its client went away (grpc.aio cancels the call's task, and
    `context.cancelled()` still says False then), or the shutdown's grace ran out."""
    metrics.ABANDONED.labels("grpc").inc()


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    """Each method: parse, await the core, convert the answer."""

    def __init__(self, core: RewardCore) -> None:
        self.core = core

    async def _call(
        self, method: str, context: Context, make: Callable[[Any, float | None], Awaitable[Any]], request: Any,
        model: type[BaseModel],
    ) -> Any:  # fmt: skip
        started = time.monotonic()
        try:
            req: BaseModel = parse_request(model, request)
            remaining = _remaining(context)
            # A backstop past the deadline only: the core answers its own timeouts.
            wait = self.core.settings.max_timeout_s if remaining is None else remaining + 1.0
            result = await asyncio.wait_for(make(req, remaining), wait + 5.0)
        except asyncio.CancelledError:  # grpc.aio cancels the call's task when its client goes away
            _count_abandoned()
            raise
        except Exception as exc:
            await _abort(context, method, exc)
        metrics.REQUESTS.labels(f"grpc/{method}", "OK").inc()
        metrics.REQUEST_SECONDS.labels(f"grpc/{method}").observe(time.monotonic() - started)
        return result

    async def VerifyMath(self, request: pb.VerifyMathRequest, context: Context) -> pb.VerifyMathResponse:
        resp = await self._call("VerifyMath", context, self.core.verify_math, request, VerifyMathRequest)
        return model_to_proto(resp, pb.VerifyMathResponse())

    async def Execute(self, request: pb.ExecuteRequest, context: Context) -> pb.ExecuteResponse:
        resp = await self._call("Execute", context, self.core.execute, request, ExecuteRequest)
        return model_to_proto(resp, pb.ExecuteResponse())

    async def VerifyCode(self, request: pb.VerifyCodeRequest, context: Context) -> pb.VerifyCodeResponse:
        resp = await self._call("VerifyCode", context, self.core.verify_code, request, VerifyCodeRequest)
        return model_to_proto(resp, pb.VerifyCodeResponse())

    async def Score(self, request: pb.ScoreRequest, context: Context) -> pb.ScoreResponse:
        results = await self._call("Score", context, self.core.score, request, ScoreRequest)
        return pb.ScoreResponse(results=[model_to_proto(r, pb.ScoreResult()) for r in results])

    async def ScoreStream(self, request: pb.ScoreRequest, context: Context) -> AsyncIterator[pb.ScoreResult]:
        try:
            req: ScoreRequest = parse_request(ScoreRequest, request)
            self.core.check_score(req)
        except Exception as exc:
            await _abort(context, "ScoreStream", exc)
        try:
            async for result in self.core.score_iter(req, _remaining(context)):
                yield model_to_proto(result, pb.ScoreResult())
        except asyncio.CancelledError:
            _count_abandoned()
            raise
        except Exception as exc:  # admission refusal ends the stream with its status
            await _abort(context, "ScoreStream", exc)
        metrics.REQUESTS.labels("grpc/ScoreStream", "OK").inc()


def _lenient(message: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    """A deserializer that hands undecodable bytes on, so they get INVALID_ARGUMENT (grpc.aio's own is UNKNOWN)."""

    def deserialize(data: bytes) -> Message | Undecodable:
        try:
            return message.FromString(data)
        except DecodeError as exc:
            return Undecodable(message.DESCRIPTOR.full_name, str(exc))

    return deserialize


def register(core: RewardCore) -> Callable[[grpc.aio.Server], None]:
    """The `register` callback AioGrpcServer takes: the generated table, with lenient request decoding."""
    servicer = RewardServicer(core)
    unary: dict[str, tuple[type[Message], Callable[..., Any]]] = {
        "VerifyMath": (pb.VerifyMathRequest, servicer.VerifyMath),
        "Execute": (pb.ExecuteRequest, servicer.Execute),
        "VerifyCode": (pb.VerifyCodeRequest, servicer.VerifyCode),
        "Score": (pb.ScoreRequest, servicer.Score),
    }
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            method, request_deserializer=_lenient(request), response_serializer=_serialize
        )
        for name, (request, method) in unary.items()
    }
    handlers["ScoreStream"] = grpc.unary_stream_rpc_method_handler(
        servicer.ScoreStream, request_deserializer=_lenient(pb.ScoreRequest), response_serializer=_serialize
    )

    def add(server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        server.add_registered_method_handlers(SERVICE_NAME, handlers)

    return add


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()
