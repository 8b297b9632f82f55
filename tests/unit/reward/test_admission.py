"""Admission (refuse what cannot finish by its deadline) and the end of a request's sandbox work, on a real sandbox."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from grpo.reward.admission import ADMIT_SHARE, Admission, Lane, RequestEnded
from grpo.reward.cancellation import RequestSandbox, SandboxGate, request_sandbox
from grpo.reward.errors import InputError, Overloaded
from grpo.reward.sandbox import Sandbox, make_sandbox
from grpo.reward.verifiers.code import run_code_tests

SLEEPY = "import time\ntime.sleep(0.6)\nprint('ok')"


def admission(max_queue: int = 100, workers: int = 2) -> Admission:
    return Admission(max_queue, 1, workers, workers, None)


def test_a_lane_estimates_the_finish_behind_what_it_holds() -> None:
    lane = Lane("test", 2, 0.5)
    lane.observe(0.1)  # the first measurement replaces the prior
    assert lane.unit_s == pytest.approx(0.1)
    lane.outstanding = 4
    assert lane.finish_s(2) == pytest.approx(0.3)  # 6 units on 2 workers: 3 rounds
    lane.observe(1.1, units=3)  # later ones move the average by their weight
    assert 0.1 < lane.unit_s < 1.1


def test_a_busy_lane_refuses_what_would_finish_past_the_deadline() -> None:
    adm = admission()
    adm.math.observe(1.0)
    deadline = time.monotonic() + 10
    # An idle lane admits (2 s ahead after it); 3 s fits the 7.5 s of a 10 s deadline.
    with adm.admit(4, deadline, math_units=4), adm.admit(2, deadline, math_units=2):
        with pytest.raises(Overloaded) as refused:
            adm.admit(10, deadline, math_units=10).__enter__()  # 8 s: does not
        assert refused.value.retry_after_s >= 1 and "math units ahead" in str(refused.value)
        with adm.admit(10, time.monotonic() + 60, code_units=10):  # the other lane is idle: admitted
            pass
    assert (adm.inflight, adm.math.outstanding, adm.code.outstanding) == (0, 0, 0)
    with adm.admit(100, time.monotonic() + 0.1, math_units=100):  # idle again: a refusal would never end
        pass


def test_retry_after_says_when_the_work_that_does_not_fit_has_drained() -> None:
    adm = admission(workers=1)
    adm.code.observe(2.0)
    with adm.admit(1, time.monotonic() + 100, code_units=10), pytest.raises(Overloaded) as refused:
        adm.admit(1, time.monotonic() + 4, code_units=1).__enter__()  # 22 s against 3 s
    assert refused.value.retry_after_s == pytest.approx(22 - ADMIT_SHARE * 4, abs=1)


def test_max_queue_is_still_an_upper_bound() -> None:
    adm = admission(max_queue=5)
    deadline = time.monotonic() + 60
    with pytest.raises(InputError, match="split"):
        adm.admit(6, deadline).__enter__()
    with adm.admit(4, deadline), pytest.raises(Overloaded, match="4 items in flight, limit 5"):
        adm.admit(2, deadline).__enter__()


def test_a_ticket_ends_with_its_request() -> None:
    adm = admission()
    with adm.admit(1, time.monotonic() + 60, code_units=1) as ticket:
        ticket.check()
    with pytest.raises(RequestEnded):
        ticket.check()


@pytest.fixture(scope="module")
def one_worker() -> Iterator[Sandbox]:
    box = make_sandbox(workers=1)
    yield box
    box.close()


def _ended_after(seconds: float, adm: Admission, tests: list[dict[str, Any]], box: Sandbox) -> tuple[object, float]:
    """Run `tests` through a request's view of `box`; the request ends after `seconds`. (what the run gave, when)"""
    outcome: list[object] = []
    with adm.admit(len(tests), time.monotonic() + 60, code_units=len(tests)) as ticket:
        view = request_sandbox(box)
        assert isinstance(view, RequestSandbox)

        def run() -> None:
            try:
                outcome.append(run_code_tests(view, SLEEPY, tests))
            except RequestEnded as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(seconds)
    ended = time.monotonic()
    thread.join(30)
    assert ticket.runs <= 2 and ticket.skipped >= len(tests) - 2, (ticket.runs, ticket.skipped)
    return outcome[0], time.monotonic() - ended


@pytest.mark.parametrize("kind", ["batch", "single runs"])
def test_a_request_that_ended_starts_no_further_test(one_worker: Sandbox, kind: str) -> None:
    """A batch stops after the run under way and the one queued behind it; single runs after the one under way."""
    adm = Admission(100, 1, 1, 1, SandboxGate(1))
    own = {"timeout_s": 5} if kind == "single runs" else {}  # a test with its own limits is a run of its own
    tests: list[dict[str, Any]] = [{"stdin": str(i), "expected_stdout": "ok", **own} for i in range(6)]
    outcome, drained = _ended_after(0.3, adm, tests, one_worker)
    assert isinstance(outcome, RequestEnded), outcome
    assert drained < 2 * 0.6 + 1.0, f"{drained:.1f}s after the end (6 tests: 3.6 s)"
    assert run_code_tests(one_worker, "print('ok')", [{"stdin": "", "expected_stdout": "ok"}])[0].verdict == "pass"


def test_a_build_others_may_wait_for_runs_even_for_an_ended_request(one_worker: Sandbox) -> None:
    from grpo.reward.sandbox.languages import BUILD_LIMITS, build_launch

    assert "c" in one_worker.languages, "make test installs gcc (make toolchains)"  # a skip would hide this test
    adm = Admission(100, 1, 1, 1, SandboxGate(1))
    with adm.admit(1, time.monotonic() + 60, code_units=1):
        view = request_sandbox(one_worker)
    launch = build_launch("c", "int main(void) { return 0; }", one_worker.languages["c"])
    assert launch is not None
    assert view.execute(launch, "", BUILD_LIMITS).status == "ok"
    with pytest.raises(RequestEnded):
        view.execute(launch, "")
