"""Optional bearer-token auth for gRPC servers and clients (HTTP servers share `token_matches`).

Health checks and reflection stay open: Kubernetes probes cannot send a token, and reflection only describes the
API the repository's protos publish anyway (README "Security").
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
# A full method name -> the token it needs instead of the server's, or the tokens it accepts (any one of them).
MethodTokens = dict[str, str | tuple[str, ...]]


def token_matches(given: str | None, expected: str) -> bool:
    """Is `given` (an `Authorization` value) `Bearer <expected>`? The scheme in any case (RFC 7235: `bearer x` is
    the same credential), the token compared in constant time."""
    scheme, _, credentials = (given or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.strip(" ").encode(), expected.encode())


class _TokenCheck:
    """The rule both interceptors apply: which token a method needs and whether the call carries it."""

    def __init__(self, token: str | None, method_tokens: MethodTokens | None = None) -> None:
        self.token = token
        self.method_tokens = method_tokens or {}

    def denial(self, details: grpc.HandlerCallDetails) -> str | None:
        """None when the call may go on, else the reason to refuse it."""
        method = details.method
        expected = self.method_tokens.get(method, self.token)
        if expected is None or method.startswith(OPEN_SERVICES):
            return None
        given = dict(details.invocation_metadata or ()).get("authorization")
        if any(token_matches(given, token) for token in ((expected,) if isinstance(expected, str) else expected)):
            return None
        return f"{method} needs 'authorization: Bearer <token>' metadata"


class BearerTokenInterceptor(_TokenCheck, grpc.ServerInterceptor):
    """Rejects calls without `authorization: Bearer <token>` (sync servers).

    `method_tokens` maps a full method name to its own token, or to the tokens it accepts (e.g. the weight-update
    endpoint can require a different one from Generate).
    """

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        message = self.denial(handler_call_details)
        if message is None:
            return continuation(handler_call_details)

        def abort(requests: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        # Streaming in both directions, whatever the method's own shape: a unary handler would first wait for the
        # request message on a worker thread, and callers that never send one (no token needed) would hold every
        # thread of the pool. A request-stream handler starts at once and refuses without reading.
        return grpc.stream_stream_rpc_method_handler(abort)


class AioBearerTokenInterceptor(_TokenCheck, grpc.aio.ServerInterceptor):
    """The same rule for grpc.aio servers."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        message = self.denial(handler_call_details)
        if message is None:
            return await continuation(handler_call_details)

        async def abort(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        return grpc.stream_stream_rpc_method_handler(abort)  # refused before any message, as above


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the token, or nothing when auth is off."""
    return (("authorization", f"Bearer {token}"),) if token else ()
