"""The sandbox interface: limits in, an ExecResult out; one implementation per file."""

from __future__ import annotations

import base64
import math
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Generator

    from grpo.reward.sandbox.build_cache import BuildCaches
    from grpo.reward.sandbox.languages import Launch

# A run's stdout cap unless its limits or the sandbox set one (the service: settings.max_output_bytes). As large as
# the expected output a test may hold (settings.max_test_chars): a correct program must be able to print it.
DEFAULT_MAX_OUTPUT_BYTES = 16 << 20
# A run's wall-clock limit unless its limits set one, as a multiple of its CPU-time limit (the service:
# settings.code_idle_factor): room for a host so loaded that the run gets a third of a CPU, while a program that
# sleeps or blocks is still stopped.
DEFAULT_IDLE_FACTOR = 3.0

STATUSES = ("ok", "runtime_error", "timeout", "memory_limit", "process_limit", "output_limit", "sandbox_error")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be set up on this machine (missing privileges or kernel features)."""


class RunCancelled(Exception):
    """The run's `cancel` event was set (its request ended): the run was killed and has no result."""


@dataclass
class ExecResult:
    """What one sandboxed run did."""

    status: str
    """ok | runtime_error | timeout | memory_limit | process_limit | output_limit | sandbox_error"""
    exit_code: int | None
    """The program's exit code; -N when it was killed by signal N; None when it never ran or was killed by us."""
    stdout: str
    stderr: str
    wall_s: float
    proof: bool = False
    """The harness saw the program run to its end (see languages.py for what that proves)."""
    files: dict[str, bytes] = field(default_factory=dict)
    """The scratch files the launch asked to collect (a build's outputs)."""
    cpu_s: float = 0.0
    """CPU time of the run (user + system, the program and the children it waited for)."""
    peak_memory_mb: float = 0.0
    """Peak resident memory of the program (ru_maxrss)."""
    stdout_raw: bytes | None = None
    """stdout's exact bytes when they are not UTF-8 (`stdout` then reads them with U+FFFD); None when `stdout` is
    exact. The zygote's reply carries such a stdout as {"base64": ...} in its place (run_output.wire_text)."""

    def __post_init__(self) -> None:
        wire: Any = self.stdout
        if isinstance(wire, dict):  # the reply's form of output that is not UTF-8 (JSON text cannot hold it)
            self.stdout_raw = base64.b64decode(wire["base64"])
            self.stdout = self.stdout_raw.decode("utf-8", "replace")


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits."""

    timeout_s: float = 10.0
    """CPU-time limit (user + system, the program and the children it waited for), as contest judges count it:
    when it is reached the whole process tree is killed (timeout). CPU time, not wall time, so that a correct
    program on a loaded host, waiting for a CPU, is not judged too slow."""
    wall_s: float | None = None
    """Wall-clock limit (idleness): past it the run is killed as a timeout too, however little CPU it used (it
    sleeps, blocks, or could not get a CPU). None: the sandbox's idle_factor x timeout_s."""
    memory_mb: int = 512
    """Address-space limit per process (RLIMIT_AS)."""
    max_output_bytes: int | None = None
    """stdout; past it the run is killed with status output_limit. None: the sandbox's cap (DEFAULT_MAX_OUTPUT_BYTES
    unless it was given another). stderr does not count: only its first and last 32 KiB are kept (run_output.py), and
    only a flood of it (STDERR_FLOOD_BYTES) stops the run."""
    max_processes: int = 64
    """Processes and threads of the run (RLIMIT_NPROC on a uid no one else uses); a run refused one past it ends as
    process_limit."""
    max_file_bytes: int = 16 << 20
    """Largest file the program may write (RLIMIT_FSIZE)."""
    scratch_mb: int = 64
    """Size of the private writable tmpfs (cwd, /tmp)."""
    cpu_s: float | None = None
    """RLIMIT_CPU per process, a backstop under the sandbox's own watch of timeout_s; None derives it from it."""

    def wall_limit_s(self, idle_factor: float) -> float:
        """The wall-clock limit: wall_s, or `idle_factor` x timeout_s where it is None."""
        return self.wall_s if self.wall_s is not None else idle_factor * self.timeout_s

    def effective_cpu_s(self) -> int:
        """RLIMIT_CPU seconds per process: timeout_s (rounded up) plus one, unless set explicitly."""
        return max(1, math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s + 1))

    def validate(self) -> None:
        """Raise ValueError naming the first limit that is out of range."""
        checks = {
            "timeout_s": 0 < self.timeout_s <= 3600,
            "wall_s": self.wall_s is None or 0 < self.wall_s <= 36000,
            "memory_mb": 16 <= self.memory_mb <= 1 << 20,
            "max_output_bytes": self.max_output_bytes is None or 0 < self.max_output_bytes <= 1 << 30,
            "max_processes": 1 <= self.max_processes <= 4096,
            "max_file_bytes": 0 <= self.max_file_bytes <= 1 << 40,
            "scratch_mb": 1 <= self.scratch_mb <= 1 << 16,
        }
        for name, ok in checks.items():
            if not ok:
                value = getattr(self, name)
                why = "not a number" if isinstance(value, float) and math.isnan(value) else "out of range"
                raise ValueError(f"limit {name}={value!r} is {why}")


def lone_surrogate(data: Any, path: str = "") -> str | None:
    """Where the first string in `data` (JSON-shaped) that cannot be UTF-8 is, as "field.0.key at character N"."""
    if isinstance(data, str):
        if data.isascii():
            return None
        try:
            data.encode()
        except UnicodeEncodeError as exc:
            return f"{path or 'the text'} at character {exc.start}"
        return None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list | tuple) else ()
    for key, value in items:
        here = f"{path}.{key}" if path else str(key)
        where = lone_surrogate(key, f"the name {here}") or lone_surrogate(value, here)
        if where is not None:
            return where
    return None


def require_text(data: Any) -> None:
    """Raise ValueError where `data` holds a string that cannot be written as UTF-8 (`lone_surrogate`): the
    caller's input to fix, not a sandbox failure (which would also cost a worker)."""
    try:
        orjson.dumps(data)  # refuses a lone surrogate; one pass in C, where the walk costs Python per field
        return
    except TypeError:  # that, or something not JSON-shaped, which `lone_surrogate` passes over
        pass
    where = lone_surrogate(data)
    if where is not None:
        raise ValueError(f"{where} holds a lone UTF-16 surrogate, which is not text: send valid Unicode")


def check_text(launch: Launch, stdins: list[str]) -> None:
    """`require_text` for a run's files, argv and stdins. They are few strings, and may be large (a program, a
    megabyte of stdin), which orjson would copy on every run: an ASCII string needs one flag test
    (`isascii`), and the usual run has nothing else."""
    if not all(map(str.isascii, (*launch.files, *launch.files.values(), *launch.argv, *stdins))):
        require_text({"files": launch.files, "argv": launch.argv, "stdin": stdins})


class Sandbox(ABC):
    """Runs untrusted programs in isolation. `run` is thread-safe and blocking."""

    isolation: str = "none"
    """Human-readable description of the isolation in force (for the README and /healthz)."""
    workers: int = 1
    """How many runs can proceed at the same time."""
    languages: dict[str, dict[str, str]] = {}  # noqa: RUF012 - set per instance
    """Language -> {tool: real path} for the toolchains this sandbox can run."""
    build_caches: BuildCaches | None = None
    """Builds kept between requests (build_cache.py); the service sets them, without them every request builds."""
    idle_factor: float = DEFAULT_IDLE_FACTOR
    """A run's wall-clock limit as a multiple of its timeout_s, where its limits set no wall_s."""

    @abstractmethod
    def execute(
        self, launch: Launch, stdin: str = "", limits: Limits | None = None, cancel: threading.Event | None = None
    ) -> ExecResult:
        """Run one prepared launch (files, argv, what to collect) under `limits`; never raises for the program.
        Once `cancel` is set the run is killed and RunCancelled raised (its request ended: nobody waits for it)."""

    def execute_many(
        self,
        launch: Launch,
        stdins: list[str],
        limits: Limits | None = None,
        stream: bool = False,
        cancel: threading.Event | None = None,
    ) -> Generator[ExecResult, None, None]:
        """Runs of one launch, one per stdin, results in order; closing the iterator early stops before the next
        run. Implementations may share set-up between the runs; each run still starts from the same state.
        `stream`: the caller may stop early, so each result should come as soon as its run ends (else results may
        be held and delivered together, which costs the runs less). `cancel`: as execute's, and closing the
        iterator once it is set kills the run under way (or started ahead) rather than letting it finish."""
        for stdin in stdins:
            yield self.execute(launch, stdin, limits, cancel)

    def run(
        self,
        program: str,
        stdin: str = "",
        limits: Limits | None = None,
        language: str = "python",
        files: dict[str, bytes] | None = None,
        read_back: tuple[str, ...] = (),
    ) -> ExecResult:
        """Run `program` once with `stdin` (building it first for a compiled language); see build_and_run."""
        from grpo.reward.sandbox.languages import build_and_run

        return build_and_run(self, language, program, stdin, limits or Limits(), files, read_back)

    def problem(self) -> str | None:
        """None while runs can start; else what keeps them from starting (the service's readiness)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Stop every helper process; runs in flight end with sandbox_error."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
