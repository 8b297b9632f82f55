"""Work of a request that has ended stops: its client went away, its deadline passed, or it was answered.

Math items are cancelled with their futures: one waiting for a worker never runs, one running past a moment has
its worker killed (pool.py). Sandbox work runs on threads, which cannot be cancelled: each request sees the
sandbox through a `RequestSandbox` that starts no run of a request whose ticket has ended, and hands the sandbox
the ticket's `ended` event, on which it kills the run under way (its zygote, replaced at once) and a batch's run
started ahead. A build always finishes: other requests may be waiting for the same one (build_cache.py).

The HTTP edge notices a client that goes away with `CancelOnDisconnect`; grpc.aio cancels the call's task itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grpo.reward import metrics
from grpo.reward.admission import RequestEnded, Ticket, current_ticket
from grpo.reward.sandbox.base import ExecResult, Limits, RunCancelled, Sandbox
from grpo.reward.sandbox.languages import BUILD_LIMITS

if TYPE_CHECKING:
    from grpo.reward.sandbox.languages import Launch

log = logging.getLogger(__name__)
WAIT_POLL_S = 0.05  # how often a call waiting for a sandbox worker looks whether its request has ended


class SandboxGate:
    """At most `workers` sandbox calls at once, so that a call's time inside is a worker's time (what admission
    learns from), and a call waiting for a worker can give up when its request ends. Re-entrant per thread: a
    call made while the thread holds a worker (a checker judging a run) passes, as it did before the gate."""

    def __init__(self, workers: int) -> None:
        self._free = max(1, workers)
        self._cond = threading.Condition()
        self._held = threading.local()

    @contextmanager
    def slot(self, ticket: Ticket | None, tests: int = 0) -> Iterator[None]:
        """A worker's turn for a call of `ticket`'s request; RequestEnded, its `tests` counted as not run, once the
        request has ended (checked while waiting and when its turn comes). No ticket: wait whatever happens."""
        if getattr(self._held, "depth", 0):
            yield
            return
        with self._cond:
            while ticket is None or not ticket.ended.is_set():
                if self._free:
                    break
                self._cond.wait(WAIT_POLL_S)
            else:
                ticket.skip(tests)
                ticket.check()  # raises: it has ended
            self._free -= 1
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            with self._cond:
                self._free += 1
                self._cond.notify()


class RequestSandbox(Sandbox):
    """The service's sandbox as one request sees it: through the gate, and only while its ticket lasts. Its runs'
    `cancel` is always the ticket's `ended`: a caller's own event is not used (none passes one)."""

    def __init__(self, inner: Sandbox, gate: SandboxGate, ticket: Ticket) -> None:
        self._inner, self._gate, self._ticket = inner, gate, ticket
        self.isolation, self.workers, self.languages = inner.isolation, inner.workers, inner.languages
        self.build_caches, self.idle_factor = inner.build_caches, inner.idle_factor

    def execute(
        self, launch: Launch, stdin: str = "", limits: Limits | None = None, cancel: threading.Event | None = None
    ) -> ExecResult:
        build = limits is BUILD_LIMITS  # languages.build's: others may wait for this very build
        with self._gate.slot(None if build else self._ticket, 1):
            started = time.monotonic()
            try:
                return self._inner.execute(launch, stdin, limits, None if build else self._ticket.ended)
            except RunCancelled:
                self._ticket.skip(1)
                self._ticket.check()  # raises RequestEnded: the only way `ended` is set
                raise
            finally:
                self._ticket.spent(time.monotonic() - started, 1)
                metrics.SANDBOX_RUNS.inc()

    def execute_many(
        self,
        launch: Launch,
        stdins: list[str],
        limits: Limits | None = None,
        stream: bool = False,
        cancel: threading.Event | None = None,
    ) -> Generator[ExecResult, None, None]:
        with self._gate.slot(self._ticket, len(stdins)):
            started, done = time.monotonic(), 0
            runs = self._inner.execute_many(launch, stdins, limits, stream, self._ticket.ended)
            try:
                for result in runs:
                    done += 1
                    metrics.SANDBOX_RUNS.inc()
                    yield result
                    if done < len(stdins):
                        self._starting(len(stdins) - done)
            except RunCancelled:
                self._ticket.skip(len(stdins) - done)
                self._ticket.check()
                raise
            finally:
                runs.close()  # stops the batch before its next run (kills it, the request having ended)
                self._ticket.spent(time.monotonic() - started, done)

    def _starting(self, tests: int) -> None:
        """Raise RequestEnded, counting the `tests` that will not run, once the request has ended."""
        try:
            self._ticket.check()
        except RequestEnded:
            self._ticket.skip(tests)
            raise

    def __getattr__(self, name: str) -> Any:
        """Whatever else the verifiers read of a sandbox (what it is, what it holds) is the service's sandbox's."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def problem(self) -> str | None:
        return self._inner.problem()

    def close(self) -> None:
        """The service's sandbox outlives every request: nothing to close here."""


def request_sandbox(sandbox: Sandbox) -> Sandbox:
    """The sandbox the current request runs in: its RequestSandbox when it holds a ticket with a gate, else
    `sandbox` itself (outside a request: tests, benchmarks)."""
    ticket = current_ticket()
    if ticket is None or ticket.gate is None:
        return sandbox
    return RequestSandbox(sandbox, ticket.gate, ticket)


class CancelOnDisconnect:
    """ASGI middleware: a /v1/ request whose client goes away before the answer starts is cancelled, and with it
    the request's work (its ticket ends). Starlette does not do this: a handler runs to its end for nobody.

    The body is read here first (the app gets it replayed), so that afterwards only this middleware listens to
    the connection; uvicorn answers that listening with `http.disconnect` when the client goes away."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        body: list[Message] = []
        while not body or (body[-1]["type"] == "http.request" and body[-1].get("more_body", False)):
            body.append(await receive())
        if body[-1]["type"] == "http.disconnect":
            _abandoned(scope, "while sending its body")
            return
        await self._serve(scope, body, receive, send)

    async def _serve(self, scope: Scope, body: list[Message], receive: Receive, send: Send) -> None:
        gone = asyncio.get_running_loop().create_future()
        answering = False

        async def replay() -> Message:
            if body:
                return body.pop(0)
            await asyncio.shield(gone)  # the app listening for a disconnect hears the one seen here
            return {"type": "http.disconnect"}

        async def sending(message: Message) -> None:
            nonlocal answering
            answering = True  # from the answer's first message on, the request is the app's to finish
            await send(message)

        app = asyncio.ensure_future(self.app(scope, replay, sending))
        listen = asyncio.ensure_future(receive())
        try:
            await asyncio.wait({app, listen}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            app.cancel()
            raise
        finally:
            if not listen.done():
                listen.cancel()
        if not app.done() and not answering:
            gone.set_result(None)
            _abandoned(scope, "before its answer")
            app.cancel()
        try:
            await app
        except asyncio.CancelledError:
            if not gone.done():  # cancelled from outside (shutdown), not by us
                raise


def _abandoned(scope: Scope, when: str) -> None:
    metrics.ABANDONED.labels("http").inc()
    log.info("%s %s: the client went away %s; its work is cancelled", scope.get("method"), scope.get("path"), when)
