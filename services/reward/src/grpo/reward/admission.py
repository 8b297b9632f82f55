"""Admission: take a request only when it can be answered within its deadline; a ticket ends its work.

The rule (docs/reward.md "Overload"): each kind of capacity is a lane, the math worker processes and the sandbox
workers. A lane knows the units it has admitted and not finished (math items; code tests, an execute being one)
and how long a unit keeps one worker busy (a moving average of what it measured). A request is refused with 429 /
RESOURCE_EXHAUSTED when, in a lane it needs and that already holds work, its estimated finish

    ceil((units admitted + its own units) / workers) * seconds per unit

times the lane's correction is past ADMIT_SHARE of the time left to its deadline. The correction is a moving
average of how long requests served by that lane alone took against that estimate: it takes in what a worker's
busy time does not show (the CPUs shared with the other lane and the HTTP edge, hand-overs between runs), which
left the estimate 1.3-2x short under 64 clients. The rest of the deadline absorbs what error remains. An idle lane
admits any request: nothing waits ahead of it, and a refusal there would repeat forever, since only finished
work corrects the estimate. `max_queue` stays an upper bound on the items in flight.

Before this, admission only counted items against max_queue (4,096): nothing was ever refused, and under 64
clients requests queued until their clients gave up, their work still done after they left.
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grpo.reward import metrics
from grpo.reward.errors import DeadlineExceeded, InputError, Overloaded

if TYPE_CHECKING:
    from grpo.reward.cancellation import SandboxGate

log = logging.getLogger(__name__)

ADMIT_SHARE = 0.75  # of the time to its deadline a request's estimated finish may take
# Weight of one unit's measurement in a lane's moving average (the first replaces the prior). Small: a mix of
# requests is not one kind of unit (0.2 let a run of quick requests halve it, and admit twice what fit).
ALPHA = 0.05
CORRECTION_ALPHA = 0.2  # weight of one request in a lane's correction
MAX_RETRY_AFTER_S = 30  # a Retry-After past this says nothing a client could use
CALIBRATE_MIN_S = 0.25  # estimates shorter than this are mostly the fixed cost of a request: not a correction
# Never below 1: the plain estimate errs high at times (a request half done still counts whole), and trusting
# that made the correction fall to 0.7 and admit requests that then took their whole deadline.
CORRECTION_BOUNDS = (1.0, 4.0)
# What a unit costs before anything was measured: a math verification, a short sandboxed run.
PRIOR_S = {"math": 0.05, "code": 0.25}


class RequestEnded(Exception):
    """The request this work belongs to has ended (answered, past its deadline, or its client went away)."""


class Lane:
    """One kind of capacity: `workers` at once, units admitted and not finished, seconds per unit measured."""

    def __init__(self, name: str, workers: int, unit_s: float) -> None:
        self.name, self.workers, self.unit_s = name, max(1, workers), unit_s
        self.outstanding = 0
        self.measured = False
        self.correction = 1.0  # how long requests took against the plain estimate (a moving average)
        self._lock = threading.Lock()
        metrics.ADMISSION_UNIT_SECONDS.labels(name).set_function(lambda: self.unit_s)
        metrics.ADMISSION_CORRECTION.labels(name).set_function(lambda: self.correction)
        metrics.ADMISSION_WAIT_SECONDS.labels(name).set_function(lambda: self.finish_s(0))

    def plain_finish_s(self, units: int) -> float:
        """Seconds until `units` more are done behind every unit admitted before them, at the measured rate."""
        return math.ceil((self.outstanding + units) / self.workers) * self.unit_s

    def finish_s(self, units: int) -> float:
        """The estimate admission uses: the plain one, corrected by how long requests actually took."""
        return self.plain_finish_s(units) * self.correction

    def calibrate(self, took_s: float, plain_s: float) -> None:
        """Fold in a request this lane alone served: it took `took_s` where the plain estimate said `plain_s`."""
        if plain_s < CALIBRATE_MIN_S or not math.isfinite(took_s):
            return
        low, high = CORRECTION_BOUNDS
        with self._lock:
            self.correction += CORRECTION_ALPHA * (min(high, max(low, took_s / plain_s)) - self.correction)

    def observe(self, seconds_per_unit: float, units: int = 1) -> None:
        """Fold in a measurement of `units` units that kept a worker busy `seconds_per_unit` each."""
        if units <= 0 or not math.isfinite(seconds_per_unit) or seconds_per_unit < 0:
            return
        weight = 1.0 - (1.0 - ALPHA) ** units if self.measured else 1.0
        with self._lock:
            self.unit_s += weight * (seconds_per_unit - self.unit_s)
            self.measured = True


@dataclass
class Ticket:
    """One admitted request: its units per lane, its sandbox time, and the event that ends its work."""

    math_units: int
    code_units: int
    gate: SandboxGate | None = None  # the sandbox's, through which its runs go (cancellation.py)
    ended: threading.Event = field(default_factory=threading.Event)
    busy_s: float = 0.0  # sandbox worker-seconds its runs took
    runs: int = 0  # sandbox runs that came back (builds and checker runs included)
    skipped: int = 0  # tests not run because the request had ended
    plain_s: dict[str, float] = field(default_factory=dict)  # each lane's plain estimate of its finish, admitted
    admitted: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self) -> None:
        """Raise RequestEnded once the request has ended: no further work of it may start."""
        if self.ended.is_set():
            raise RequestEnded("the request has ended (answered, past its deadline, or its client went away)")

    def spent(self, seconds: float, runs: int) -> None:
        with self._lock:
            self.busy_s += seconds
            self.runs += runs

    def skip(self, tests: int) -> None:
        with self._lock:
            self.skipped += tests
        metrics.CANCELLED.labels("code").inc(tests)


# The ticket of the request being served; asyncio tasks inherit it, so each item of a /v1/score request sees it.
CURRENT: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("grpo_reward_ticket", default=None)


class Admission:
    """Admission of one service process: the items in flight (max_queue) and the math and code lanes."""

    def __init__(
        self, max_queue: int, retry_after_s: int, math_workers: int, code_workers: int, gate: SandboxGate | None
    ) -> None:
        self.max_queue, self.retry_after_s, self.gate = max_queue, retry_after_s, gate
        self.math = Lane("math", math_workers, PRIOR_S["math"])
        self.code = Lane("code", code_workers, PRIOR_S["code"])
        self.inflight = 0  # items, as max_queue counts them
        # Admission runs on the one loop today; the lock keeps the counts right should a thread ever admit.
        self._lock = threading.Lock()

    @contextmanager
    def admit(self, items: int, deadline: float, *, math_units: int = 0, code_units: int = 0) -> Iterator[Ticket]:
        """Hold `items` against max_queue and the units against their lanes while the request runs; refuse it
        (Overloaded) when it cannot finish by `deadline` (monotonic). Its ticket ends when the block exits."""
        if items > self.max_queue:
            raise InputError(
                f"{items} items exceed this server's queue capacity of {self.max_queue}; split the request"
            )
        ticket = Ticket(math_units, code_units, self.gate)
        with self._lock:
            ticket.plain_s = self._refuse_if_late(items, deadline, math_units, code_units)
            self.inflight += items
            self.math.outstanding += math_units
            self.code.outstanding += code_units
            metrics.INFLIGHT.set(self.inflight)
        token = CURRENT.set(ticket)
        measured = False  # whether its time says how long its work took (not a client that left early)
        try:
            yield ticket
            measured = True
        except DeadlineExceeded:  # it took at least this long: the estimate was short, which must count
            measured = True
            raise
        finally:
            try:
                CURRENT.reset(token)
            except ValueError:  # a stream's generator closed from another task (its context); nothing to undo
                pass
            ticket.ended.set()  # whatever still runs for it stops at its next test
            with self._lock:
                self.inflight -= items
                self.math.outstanding -= math_units
                self.code.outstanding -= code_units
                metrics.INFLIGHT.set(self.inflight)
            self._learn(ticket, measured)

    def _refuse_if_late(self, items: int, deadline: float, math_units: int, code_units: int) -> dict[str, float]:
        """Raise Overloaded when the items would pass max_queue, or a busy lane would finish them too late; else
        the plain estimate of its finish in each lane it needs."""
        if self.inflight + items > self.max_queue:
            metrics.REJECTED.labels("overloaded").inc()
            raise Overloaded(
                f"server busy: {self.inflight} items in flight, limit {self.max_queue}; retry later",
                self.retry_after_s,
            )
        budget, plain = ADMIT_SHARE * (deadline - time.monotonic()), {}
        for lane, units in ((self.math, math_units), (self.code, code_units)):
            if units == 0:
                continue
            plain[lane.name] = lane.plain_finish_s(units)
            finish = lane.finish_s(units)
            if lane.outstanding == 0:
                continue
            if finish > budget:
                metrics.REJECTED.labels("overloaded").inc()
                # Come back once the work ahead that does not fit has drained.
                retry = min(MAX_RETRY_AFTER_S, max(self.retry_after_s, math.ceil(finish - budget)))
                raise Overloaded(
                    f"server busy: {lane.outstanding} {lane.name} units ahead for {lane.workers} workers "
                    f"(~{lane.unit_s:.2f}s each, x{lane.correction:.2f}): this request would finish in "
                    f"~{finish:.1f}s, past {ADMIT_SHARE:g} of the {max(0.0, budget / ADMIT_SHARE):.1f}s left to "
                    f"its deadline; retry in {retry}s",
                    retry,
                )
        return plain

    def _learn(self, ticket: Ticket, measured: bool) -> None:
        """What a request that ended teaches the lanes: the code lane its sandbox time per test (its build counted
        in; per unit admitted when every test ran, else per run that came back), and a lane that served a
        request alone how long it took against its plain estimate, unless its client left first (the math lane
        learns each item's time from the pool)."""
        took = time.monotonic() - ticket.admitted
        log.debug("admitted %d math and %d code units, plain estimate %s: took %.2fs (%s)", ticket.math_units,
                  ticket.code_units, ticket.plain_s, took, "measured" if measured else "cut short")  # fmt: skip
        if measured and len(ticket.plain_s) == 1:
            name, plain = next(iter(ticket.plain_s.items()))
            (self.math if name == "math" else self.code).calibrate(took, plain)
        if ticket.busy_s <= 0 or ticket.runs == 0:
            return
        units = ticket.runs if ticket.skipped else max(ticket.code_units, 1)
        self.code.observe(ticket.busy_s / units, units)


def current_ticket() -> Ticket | None:
    return CURRENT.get()
