"""The tools an episode may call: the built-in `python` (the reward service's sandbox) and user plug-ins.

A tool takes the call's arguments and the episode's limits and returns a ToolResult: the text the model will see
and how the call went. A program's own failure (an exception, its timeout) is a result; a failure of our
infrastructure (the reward service unreachable after its client's retries, its sandbox broken) raises
ToolInfrastructureError, so the batch fails instead of showing the model an error it did not cause.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

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


class PythonTool:
    """Runs `arguments["code"]` in the reward service's sandbox through its Execute rpc (RewardClient.execute)."""

    def __init__(self, execute: Execute) -> None:
        self.execute = execute

    def __call__(self, arguments: Mapping[str, Any], limits: Limits) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult(error_text('python takes {"code": "<python source>"}'), error=True, malformed=True)
        # Enough bytes for the head and tail the cut keeps (a character is at most 4 bytes), with a margin.
        output_bytes = max(4 * limits.output_chars + 1024, 4096) if limits.output_chars > 0 else None
        try:
            response = self.execute(
                code, timeout_s=limits.timeout_s, memory_mb=limits.memory_mb or None, return_output_bytes=output_bytes
            )
        except RewardServiceError as exc:
            raise ToolInfrastructureError(f"python tool: reward service: {exc}") from exc
        if response.status == "sandbox_error":  # the sandbox broke, not the program
            raise ToolInfrastructureError(f"python tool: sandbox error: {response.stderr.strip()[-500:]}")
        return ToolResult(
            result_text(response, limits.timeout_s), error=response.status != "ok", timeout=response.status == "timeout"
        )


class PluginTool:
    """A user function `fn(arguments: dict) -> str`; whatever it raises becomes an `Error: ...` result."""

    def __init__(self, name: str, fn: Callable[[dict[str, Any]], Any]) -> None:
        self.name, self.fn = name, fn

    def __call__(self, arguments: Mapping[str, Any], limits: Limits) -> ToolResult:
        try:
            value = self.fn(dict(arguments))
        except Exception as exc:  # the plug-in's own failure: the model sees it, as a program's exception
            log.debug("tool %s raised", self.name, exc_info=True)
            return ToolResult(error_text(f"{type(exc).__name__}: {exc}"), error=True)
        return ToolResult(value if isinstance(value, str) else str(value))


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
