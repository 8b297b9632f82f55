"""The tools an episode may call: the built-in `python` (the reward service's sandbox) and user plug-ins.

A tool takes the call's arguments and the episode's limits and returns a ToolResult: the text the model will see
and how the call went. A program's own failure (an exception, its timeout) is a result; a failure of our
infrastructure (the reward service unreachable after its client's retries, its sandbox broken) raises
ToolInfrastructureError, so the batch fails instead of showing the model an error it did not cause.

With `python_session` an episode's python calls share their state, as a notebook's cells do: each call runs after
the episode's earlier calls, replayed with their output hidden (`session_program`). A plug-in with a `state`
parameter keeps a dict per episode (`PluginTool`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from grpo.common.plugins import import_function
from grpo.common.reward_client import RewardServiceError
from grpo.common.tool_formats import error_text, result_text
from grpo.v1 import reward_pb2

log = logging.getLogger(__name__)

PYTHON = "python"


@dataclass(frozen=True)
class Limits:
    """One call's limits, from the task's EpisodeSpec."""

    timeout_s: float
    memory_mb: int = 0  # 0: the reward service's default
    output_chars: int = 0  # 0: no cut


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model sees, before the cut to Limits.output_chars
    error: bool = False  # the call failed (an exception, a non-zero exit, a limit, malformed arguments)
    timeout: bool = False  # of those, it ran past Limits.timeout_s
    malformed: bool = False  # the arguments were not what the tool takes: it did not run


class ToolInfrastructureError(RuntimeError):
    """The tool could not run for a reason that is not the model's: the batch fails (and is retried)."""


class Tool(Protocol):
    def __call__(self, arguments: Mapping[str, Any], limits: Limits) -> ToolResult: ...


Execute = Callable[..., reward_pb2.ExecuteResponse]  # RewardClient.execute

# A call whose program ended so is replayed by the calls after it: it ran to its end or to its exception (whose
# state up to it stays, as in a notebook). A call past a limit is not: replayed, it would fail every later call.
_REPLAYED = frozenset({"ok", "runtime_error"})
# Written by a session program when its new call has returned to it (normally, by an exception or sys.exit) and read
# back: a call that left by os._exit or a signal never did, and replayed it would end every later call silently.
ENDED_FILE = ".grpo-call-ended"

# The program of a call in a session. Earlier calls run first, in the program's own namespace (`__main__`), with
# stdout and stderr sent to /dev/null at the descriptor level (a subprocess's output too); an exception of theirs
# was shown when they ran, and is passed over, and their atexit handlers are dropped. The call then runs as it would
# alone: its exception ends the program with a traceback whose last line is the exception, as a plain run's. The
# wrapper holds its own builtins and modules from before any call runs: the calls write to the namespace it runs in
# (`open = sum(xs)`, `len = 3` must not break it), and a call that broke sys.stdout breaks only its own output.
SESSION_PROGRAM = """\
def __grpo_session(earlier, code, seed, ended):
    import atexit, os, random, sys
    space, run, build, numbered, failure = globals(), exec, compile, enumerate, BaseException
    ended, count, create = os.path.abspath(ended), len(earlier) + 1, open
    del space["__grpo_session"]

    def flush():
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except failure:
                pass

    random.seed(seed)
    saved, null = (os.dup(1), os.dup(2)), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        for number, source in numbered(earlier, 1):
            try:
                run(build(source, f"<call {{number}}>", "exec"), space)
            except failure:
                pass
    finally:
        flush()
        atexit._clear()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)
    try:
        run(build(code, f"<call {{count}}>", "exec"), space)
    finally:
        create(ended, "w").close()


__grpo_session({earlier!r}, {code!r}, {seed!r}, {ended!r})
"""


def session_program(earlier: list[str], code: str, seed: int) -> str:
    """The program that runs `code` after the `earlier` calls of its session, whose output is hidden; python's
    `random` seeded with `seed` first, so that a replayed call draws what it drew the first time."""
    return SESSION_PROGRAM.format(earlier=earlier, code=code, seed=seed, ended=ENDED_FILE)


@dataclass
class PythonSession:
    """One episode's python state: the calls to replay, the episode's `random` seed (its own: the episodes of a
    group draw differently, as without a session), and the seconds the last replayed program took (the larger of
    its CPU and wall time), which the next call's time limit adds to the episode's tool_timeout_s (twice over:
    replaying is not free of noise), so that replaying the earlier calls does not count against the new one."""

    seed: int = 0
    calls: list[str] = field(default_factory=list)
    replay_s: float = 0.0

    def after(self, code: str, response: reward_pb2.ExecuteResponse) -> None:
        """Keep `code` for the calls after it, if it ended so that replaying it is safe."""
        if response.status in _REPLAYED and ENDED_FILE in response.files:
            self.calls.append(code)
            self.replay_s = max(response.cpu_s, response.wall_s)


class PythonTool:
    """Runs `arguments["code"]` in the reward service's sandbox through its Execute rpc (RewardClient.execute);
    with a `session`, after that session's earlier calls (see PythonSession)."""

    def __init__(self, execute: Execute) -> None:
        self.execute = execute

    def __call__(
        self, arguments: Mapping[str, Any], limits: Limits, session: PythonSession | None = None
    ) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult(error_text('python takes {"code": "<python source>"}'), error=True, malformed=True)
        # Enough bytes for the head and tail the cut keeps (a character is at most 4 bytes), with a margin.
        output_bytes = max(4 * limits.output_chars + 1024, 4096) if limits.output_chars > 0 else None
        program, timeout_s = code, limits.timeout_s
        read_back: tuple[str, ...] = ()
        if session is not None:
            program, read_back = session_program(session.calls, code, session.seed), (ENDED_FILE,)
            timeout_s += 2 * session.replay_s
        try:
            response = self.execute(program, timeout_s=timeout_s, memory_mb=limits.memory_mb or None,
                                    return_output_bytes=output_bytes, read_back=read_back)  # fmt: skip
        except RewardServiceError as exc:
            if exc.code == grpc.StatusCode.INVALID_ARGUMENT and "max_code_chars" in str(exc):  # the model's code
                what = "this call and the session's earlier calls are" if session is not None else "the program is"
                return ToolResult(error_text(f"{what} too long to run ({len(program)} characters)"), error=True)
            raise ToolInfrastructureError(f"python tool: reward service: {exc}") from exc
        if response.status == "sandbox_error":  # the sandbox broke, not the program
            raise ToolInfrastructureError(f"python tool: sandbox error: {response.stderr.strip()[-500:]}")
        if session is not None:
            session.after(code, response)
        return ToolResult(
            result_text(response, limits.timeout_s), error=response.status != "ok", timeout=response.status == "timeout"
        )


class PluginTool:
    """A user function `fn(arguments: dict) -> str`, or `fn(arguments: dict, state: dict) -> str` to keep state
    across an episode's calls: `state` is one dict per episode (empty at its first call), the same object at every
    call of that episode, and no other episode's. Whatever it raises becomes an `Error: ...` result."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name, self.fn = name, fn
        self.stateful = takes_state(fn)

    def __call__(self, arguments: Mapping[str, Any], limits: Limits, state: dict[str, Any] | None = None) -> ToolResult:
        try:
            if self.stateful:  # by keyword: `fn(arguments, verbose=False, state=None)` gets it where it asks
                value = self.fn(dict(arguments), state={} if state is None else state)
            else:
                value = self.fn(dict(arguments))
        except Exception as exc:  # the plug-in's own failure: the model sees it, as a program's exception
            log.debug("tool %s raised", self.name, exc_info=True)
            return ToolResult(error_text(f"{type(exc).__name__}: {exc}"), error=True)
        return ToolResult(value if isinstance(value, str) else str(value))


def takes_state(fn: Callable[..., Any]) -> bool:
    """Whether a plug-in keeps state: its signature has a parameter named `state` (builtins without a signature
    do not)."""
    try:
        return "state" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def load_tools(plugins: Mapping[str, str], execute: Execute | None) -> dict[str, Tool]:
    """The built-in `python` (when `execute` is given) and every plug-in, by name."""
    if PYTHON in plugins:
        raise ValueError(f"tool_plugins: {PYTHON!r} is the built-in sandbox tool; give the plug-in another name")
    tools: dict[str, Tool] = {
        name: PluginTool(name, import_function(path, "tool_plugins")) for name, path in plugins.items()
    }
    if execute is not None:
        tools[PYTHON] = PythonTool(execute)
    return tools
