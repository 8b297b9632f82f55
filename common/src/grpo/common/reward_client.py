"""gRPC client of the reward service, with retries; it raises rather than ever inventing a reward.

It speaks the protobuf contract (grpo.v1.reward), so the rollout and the trainer need nothing of the
reward service's package. Items are `ScoreItem` messages or dicts in the message's JSON form.

>>> client = RewardClient("127.0.0.1:7052")                       # doctest: +SKIP
>>> client.score([{"id": "a", "completion": "\\\\boxed{4}", "checks": {"math": {"gold": "4"}}}])[0].reward  # doctest: +SKIP
1.0
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import json_format

from grpo.common.auth import bearer_metadata
from grpo.common.channels import make_channel
from grpo.common.retry import Backoff, RetryPolicy
from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc

log = logging.getLogger(__name__)

# The largest wall-clock limit of a code run, as a multiple of its CPU-time limit (the reward service's
# code_idle_factor is at most this).
IDLE_FACTOR_MAX = 10.0
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


class RewardServiceError(RuntimeError):
    """The reward service could not score the request (after retries, or a non-retryable error).

    `code` is the gRPC status; INVALID_ARGUMENT means the request itself was wrong (the message says how)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class RewardClient:
    """Score completions over gRPC. Each attempt has a deadline; retryable failures are retried under the
    common policy (grpo.common.retry: doubling waits from `backoff_s` up to `max_backoff_s`, with jitter) for up
    to `retry_budget_s` after the first failure (long enough to ride out a restart of the service); `stop` cuts
    the waiting short when the caller shuts down."""

    def __init__(
        self,
        addr: str,
        token: str | None = None,
        timeout_s: float = 60.0,
        retry_budget_s: float = 30.0,
        backoff_s: float = 0.25,
        max_backoff_s: float = 2.0,
        root_certificates: bytes | None = None,
        ca_file: str | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.channel = make_channel(addr, ca_file, root_certificates=root_certificates)
        self.stub = reward_pb2_grpc.RewardServiceStub(self.channel)
        self.addr, self.timeout_s, self.retry_budget_s = addr, timeout_s, retry_budget_s
        self.retry_policy = RetryPolicy(base_s=backoff_s, cap_s=max_backoff_s, deadline_s=retry_budget_s)
        self.stop = stop
        self.metadata = bearer_metadata(token)

    def _call(self, method: Any, request: Any, name: str, extra_s: float = 0.0) -> Any:
        backoff = Backoff(self.retry_policy, f"{name} to {self.addr}", self.stop, log)
        while True:
            try:
                return method(request, timeout=self.timeout_s + extra_s, metadata=self.metadata)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code not in RETRYABLE:
                    raise RewardServiceError(f"{name} failed: {code}: {_details(exc)}", code) from exc
                if not backoff.wait(f"{code}: {_details(exc)}"):
                    stopped = " (stopping)" if self.stop is not None and self.stop.is_set() else ""
                    raise RewardServiceError(
                        f"{name} to {self.addr} failed after {backoff.failures} attempts in {backoff.elapsed_s:.1f}s "
                        f"(retry budget {self.retry_budget_s:g}s){stopped}: {code}: {_details(exc)}",
                        code,
                    ) from exc

    @staticmethod
    def _request(items: Sequence[pb.ScoreItem | Mapping[str, Any]], timeout_s: float | None) -> pb.ScoreRequest:
        request = pb.ScoreRequest(items=[_score_item(i) for i in items])
        if timeout_s is not None:
            request.timeout_s = timeout_s
        return request

    def score(
        self, items: Sequence[pb.ScoreItem | Mapping[str, Any]], timeout_s: float | None = None
    ) -> list[pb.ScoreResult]:
        """One result per item, in order; raises RewardServiceError instead of returning made-up rewards."""
        response = self._call(self.stub.Score, self._request(items, timeout_s or self.timeout_s), "Score")
        if len(response.results) != len(items):
            raise RewardServiceError(f"Score returned {len(response.results)} results for {len(items)} items")
        return list(response.results)

    def score_stream(self, items: Sequence[pb.ScoreItem | Mapping[str, Any]]) -> Iterator[pb.ScoreResult]:
        """Results as they finish, in any order (no retries: a broken stream raises RewardServiceError)."""
        request = self._request(items, self.timeout_s)
        try:
            yield from self.stub.ScoreStream(request, timeout=self.timeout_s, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise RewardServiceError(f"ScoreStream failed: {exc.code()}: {_details(exc)}", exc.code()) from exc

    def verify_math(self, answer: str, gold: str, timeout_s: float | None = None) -> pb.VerifyMathResponse:
        request = pb.VerifyMathRequest(answer=answer, gold=gold)
        if timeout_s is not None:
            request.timeout_s = timeout_s
        return self._call(self.stub.VerifyMath, request, "VerifyMath")

    def execute(
        self,
        code: str,
        language: str = "python",
        *,
        stdin: str = "",
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        return_output_bytes: int | None = None,
        read_back: Sequence[str] = (),
    ) -> pb.ExecuteResponse:
        """Run one program in the reward service's sandbox (the Execute rpc, retried as `score` is).

        The program's own failures (an exception, its timeout, its memory limit) come back in the response's
        `status`; RewardServiceError means the service could not run it at all (unreachable after the retries,
        or a request it rejected: INVALID_ARGUMENT names what to change). The rpc's deadline is the client's
        `timeout_s` plus the program's wall-clock limit, so a slow program is never mistaken for an unreachable
        service: `timeout_s` is CPU time, and the server lets a run take up to its `code_idle_factor` (at most
        IDLE_FACTOR_MAX) times that on the wall clock."""
        request = pb.ExecuteRequest(language=language, code=code, stdin=stdin)
        if timeout_s is not None:
            request.timeout_s = timeout_s
        if memory_mb:
            request.memory_mb = memory_mb
        if return_output_bytes is not None:
            request.return_output_bytes = return_output_bytes
        request.read_back.extend(read_back)
        return self._call(self.stub.Execute, request, "Execute", extra_s=IDLE_FACTOR_MAX * (timeout_s or 0.0))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _score_item(item: pb.ScoreItem | Mapping[str, Any]) -> pb.ScoreItem:
    if isinstance(item, pb.ScoreItem):
        return item
    try:
        return json_format.ParseDict(item, pb.ScoreItem())
    except json_format.ParseError as exc:
        raise ValueError(f"not a grpo.v1.ScoreItem: {exc}") from None


def _details(exc: grpc.RpcError | None) -> str:
    if exc is None:
        return ""
    return exc.details() if hasattr(exc, "details") else str(exc)  # type: ignore[no-any-return]
