"""The python tool's session (python_session) through the real reward service's sandbox: an episode's calls share
their state as a notebook's cells do, earlier calls' output never shows again, a call past a limit is not replayed,
and replaying never counts against the new call's time limit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grpo.common.reward_client import RewardClient
from grpo.rollout.episodes.tools import Limits, PythonSession, PythonTool, ToolResult
from tests.support.reward_proc import RewardService

LIMITS = Limits(timeout_s=2.0, output_chars=500)


@pytest.fixture(scope="module")
def tool(reward_service: RewardService) -> Iterator[PythonTool]:
    with RewardClient(reward_service.grpc_addr, timeout_s=30) as client:
        yield PythonTool(client.execute)


def run(tool: PythonTool, session: PythonSession | None, *calls: str, limits: Limits = LIMITS) -> list[ToolResult]:
    return [tool({"code": code}, limits, session) for code in calls]


def texts(results: list[ToolResult]) -> list[str]:
    return [r.text for r in results]


def test_calls_share_names_functions_and_imports(tool: PythonTool) -> None:
    calls = ("x = 6 * 7\nprint('set')", "import math\ndef f(n):\n    return math.isqrt(n) + x", "print(f(16), x)")
    assert texts(run(tool, PythonSession(), *calls)) == ["set", "", "46 42"]
    # the same calls without a session: each is a fresh program
    fresh = run(tool, None, *calls)
    assert fresh[0].text == "set" and fresh[2].error and fresh[2].text == "Error: NameError: name 'f' is not defined"


def test_an_earlier_calls_output_and_errors_never_show_again(tool: PythonTool) -> None:
    session = PythonSession()
    results = run(
        tool,
        session,
        "import os, sys\nprint('out', flush=True)\nprint('err', file=sys.stderr)\nos.write(1, b'fd\\n')\ny = 1",
        "z = 2\nraise ValueError('late')",  # its state up to the exception stays, as in a notebook
        "print(y + z)",
    )
    assert texts(results) == ["out\nfd", "Error: ValueError: late", "3"]
    assert [r.error for r in results] == [False, True, False]
    assert len(session.calls) == 3


def test_a_call_past_a_limit_is_not_replayed(tool: PythonTool) -> None:
    session = PythonSession()
    limits = Limits(timeout_s=0.5, output_chars=500)
    looped, after = run(tool, session, "w = 1\nwhile True:\n    pass", "print('after')", limits=limits)
    assert looped.timeout and looped.text == "Error: timed out after 0.5s"
    assert after.text == "after" and not after.error  # the loop did not run again
    assert session.calls == ["print('after')"]


def test_a_call_that_left_without_returning_is_not_replayed(tool: PythonTool) -> None:
    """os._exit and a signal skip the end of the program: replayed, such a call would end every later one silently
    (os._exit(0) reads `ok`); sys.exit returns through it and is replayed as it ran."""
    session = PythonSession()
    calls = ("a = 1\nimport os\nos._exit(0)", "b = 2\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
             "c = 3\nimport sys\nsys.exit(0)", "print(c, 'a' in dir(), 'b' in dir())")  # fmt: skip
    results = run(tool, session, *calls)
    assert [r.error for r in results] == [False, True, False, False]
    assert results[3].text == "3 False False"
    assert len(session.calls) == 2


def test_replaying_does_not_count_against_the_new_calls_limit(tool: PythonTool) -> None:
    """Three earlier calls each spend 0.3 s of CPU under a 0.5 s limit: replayed, they take ~0.9 s, which the
    fourth call's limit adds (from the last program's CPU time) instead of timing it out."""
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\nn = n + 1 if 'n' in dir() else 1"
    limits = Limits(timeout_s=0.5, output_chars=500)
    session = PythonSession()
    results = run(tool, session, spin, spin, spin, "print(n)", limits=limits)
    assert texts(results) == ["", "", "", "3"], texts(results)
    assert session.replay_s > 0.9  # the third call's program: three spins


def test_a_replayed_call_draws_the_same_random_numbers(tool: PythonTool) -> None:
    session = PythonSession()
    first, second = run(
        tool, session, "import random\nxs = [random.random() for _ in range(3)]\nprint(xs)", "print(xs)"
    )
    assert first.text == second.text and first.text.startswith("[0.")


def test_a_session_program_runs_as_main_and_keeps_its_errors_plain(tool: PythonTool) -> None:
    session = PythonSession()
    results = run(tool, session, "if __name__ == '__main__':\n    print('main')", "print(1/0)", "print(1 +)")
    assert texts(results) == ["main", "Error: ZeroDivisionError: division by zero", results[2].text]
    assert results[2].error and "SyntaxError" in results[2].text
    assert "__grpo_session" not in texts(run(tool, session, "print(sorted(k for k in globals() if 'grpo' in k))"))[0]


def test_a_call_that_rebinds_builtins_or_breaks_stdout_breaks_only_itself(tool: PythonTool) -> None:
    """The calls share the namespace the wrapper runs in: `open = sum(xs)` or `len = 3` must not break the wrapper's
    own open or len, and a call that broke sys.stdout loses only its own output, as in a notebook."""
    results = run(tool, PythonSession(), "xs = [1, 2, 3]\nopen = sum(xs)\nprint(open)", "len = 3\nprint(len)",
                  "print(open + len)", "import sys\nsys.stdout = None", "print('after')")  # fmt: skip
    assert texts(results)[:3] == ["6", "3", "9"], texts(results)
    assert not any(r.error for r in results), texts(results)


def test_an_earlier_calls_atexit_handler_does_not_print_again(tool: PythonTool) -> None:
    session = PythonSession()
    first, second = run(tool, session, "import atexit\natexit.register(print, 'bye')", "print('hi')")
    assert (first.text, second.text) == ("bye", "hi")


def test_a_session_too_long_to_run_is_an_error_the_model_sees(tool: PythonTool) -> None:
    """Each call resends the earlier ones: past the reward service's max_code_chars (200,000) the model is told,
    instead of the batch failing as if the service were broken."""
    session = PythonSession()
    chunk = "x = 1  # " + "#" * 60_000
    results = run(tool, session, chunk, chunk, chunk, chunk)
    assert [r.error for r in results] == [False, False, False, True]
    assert results[3].text.startswith("Error: this call and the session's earlier calls are too long to run (")
    assert len(session.calls) == 3  # not kept: the next call starts from the three before it


def test_the_episodes_of_a_group_draw_their_own_random_numbers(tool: PythonTool) -> None:
    draws = [run(tool, PythonSession(seed), "import random\nprint(random.random())")[0].text for seed in (1, 2, 1)]
    assert draws[0] != draws[1] and draws[0] == draws[2]
