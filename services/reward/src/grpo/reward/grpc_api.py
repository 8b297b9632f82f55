"""gRPC edge: grpo.v1.RewardService. Thin methods: protobuf -> pydantic -> core -> protobuf."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NoReturn, TypeVar

import grpc
from pydantic import BaseModel

from grpo.reward import metrics
from grpo.reward.convert import model_to_proto, parse_request
from grpo.reward.core import RewardCore
from grpo.reward.errors import DeadlineExceeded, InputError, Overloaded
from grpo.reward.schemas import ExecuteRequest, ScoreRequest, VerifyCodeRequest, VerifyMathRequest
from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
SERVICE_NAME = "grpo.v1.RewardService"
_DONE = object()


def _remaining(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None or remaining > 1e9 else max(0.0, remaining)


def _abort(context: grpc.ServicerContext, method: str, exc: BaseException) -> NoReturn:
    if isinstance(exc, InputError):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(exc, Overloaded):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
    elif isinstance(exc, DeadlineExceeded | FutureTimeout | TimeoutError):
        code = grpc.StatusCode.DEADLINE_EXCEEDED
    else:
        log.exception("unexpected error in %s", method, exc_info=exc)
        code = grpc.StatusCode.INTERNAL
    metrics.REQUESTS.labels(f"grpc/{method}", code.name).inc()
    context.abort(code, str(exc) or type(exc).__name__)
    raise AssertionError("context.abort always raises")  # for the type checker


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    """Each method: parse, hand the coroutine to the core, convert the answer."""

    def __init__(self, core: RewardCore) -> None:
        self.core = core

    def _call(self, method: str, context: grpc.ServicerContext, make: Any, request: Any, model: type[BaseModel]) -> Any:
        started = time.monotonic()
        try:
            req: BaseModel = parse_request(model, request)
            remaining = _remaining(context)
            coro: Coroutine[Any, Any, Any] = make(req, remaining)
            future = self.core.submit(coro)
            context.add_callback(future.cancel)
            # A little grace past the deadline: the core answers timeouts itself.
            wait = self.core.settings.max_timeout_s if remaining is None else remaining + 1.0
            result = future.result(timeout=wait + 5.0)
        except Exception as exc:
            _abort(context, method, exc)
        metrics.REQUESTS.labels(f"grpc/{method}", "OK").inc()
        metrics.REQUEST_SECONDS.labels(f"grpc/{method}").observe(time.monotonic() - started)
        return result

    def VerifyMath(self, request: pb.VerifyMathRequest, context: grpc.ServicerContext) -> pb.VerifyMathResponse:
        resp = self._call("VerifyMath", context, self.core.verify_math, request, VerifyMathRequest)
        return model_to_proto(resp, pb.VerifyMathResponse())

    def Execute(self, request: pb.ExecuteRequest, context: grpc.ServicerContext) -> pb.ExecuteResponse:
        resp = self._call("Execute", context, self.core.execute, request, ExecuteRequest)
        return model_to_proto(resp, pb.ExecuteResponse())

    def VerifyCode(self, request: pb.VerifyCodeRequest, context: grpc.ServicerContext) -> pb.VerifyCodeResponse:
        resp = self._call("VerifyCode", context, self.core.verify_code, request, VerifyCodeRequest)
        return model_to_proto(resp, pb.VerifyCodeResponse())

    def Score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreResponse:
        results = self._call("Score", context, self.core.score, request, ScoreRequest)
        return pb.ScoreResponse(results=[model_to_proto(r, pb.ScoreResult()) for r in results])

    def ScoreStream(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> Iterator[pb.ScoreResult]:
        try:
            req: ScoreRequest = parse_request(ScoreRequest, request)
            self.core.check_score(req)
        except Exception as exc:
            _abort(context, "ScoreStream", exc)
        out: queue.Queue[Any] = queue.Queue()

        async def pump() -> None:
            try:
                async for result in self.core.score_iter(req, _remaining(context)):
                    out.put(result)
            except BaseException as exc:  # admission refusal and cancellation end the stream too
                out.put(exc)
            finally:
                out.put(_DONE)

        future = self.core.submit(pump())
        context.add_callback(future.cancel)
        while True:
            item = out.get()
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                _abort(context, "ScoreStream", item)
            yield model_to_proto(item, pb.ScoreResult())
        metrics.REQUESTS.labels("grpc/ScoreStream", "OK").inc()


def register(core: RewardCore) -> Callable[[grpc.Server], None]:
    """The `register` callback GrpcServer takes."""

    def add(server: grpc.Server) -> None:
        reward_pb2_grpc.add_RewardServiceServicer_to_server(RewardServicer(core), server)

    return add
