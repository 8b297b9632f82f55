"""How each language is launched inside the sandbox, and the proof-of-completion driver.

Threat model of the proof. The test verdict for an assert-style test needs more than exit code 0: the program
must reach its end. The zygote hands the program a pipe on fd 4 holding a random 128-bit nonce, fresh per run,
and an empty pipe on fd 3; the driver below runs the user program (candidate + tests) through `exec` and, only
if that returns normally, copies fd 4 to fd 3. The zygote compares what arrives on fd 3 with the nonce.

What it stops: every premature exit — `sys.exit(0)`, `exit()`, `raise SystemExit`, `os._exit(0)`, `os.kill`
of itself, `atexit`/`__del__` tricks, closing stdout — because none of them lets the driver reach its last line.
The nonce is never in the program text, never in memory while the user program runs, and differs per run, so
printing or replaying a nonce seen in an earlier run does not help.

What it does not stop: code that knows this protocol and deliberately forges it from inside the same
interpreter (copying fd 4 to fd 3 itself, rewriting frames with `sys.settrace`), or that tampers with state the
tests share with it (e.g. replacing `builtins.abs` that an assert relies on; an object that equals anything is
caught apart, by grpo/reward/verifiers/assert_guard.py) — HumanEval's contract runs
candidate and tests in one namespace. Nothing in-process can stop that; the defences there are that the
candidate never sees the tests, and that the sandbox still confines whatever it does. Treat a pass as "the tests ran to completion in an interpreter the candidate shared", not as a proof
against a program written to attack this harness.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from grpo.reward.sandbox.base import ExecResult, Limits

if TYPE_CHECKING:
    from grpo.reward.sandbox.base import Sandbox

# `posix` is built in and already loaded; `import os` would cost about a millisecond under -S.
# -S also skips `site`, which is what defines `exit` and `quit`: contest solutions and checkers call them, so they
# are sys.exit here (a SystemExit that leaves `exec` early, before the proof is written, as `exit()` does in python3).
# The program runs in a module of its own registered as `__main__`, as `python main.py` runs it: pickle (and
# multiprocessing, dataclasses) look its classes up there, and would not find them in the driver's `__main__`.
PYTHON_DRIVER = (
    "import posix, sys\n"
    "__builtins__.exit = __builtins__.quit = sys.exit\n"
    "sys.argv = ['main.py', *sys.argv[1:]]\n"
    "with open('main.py', 'rb') as f:\n"
    "    code = compile(f.read(), 'main.py', 'exec')\n"
    "del f\n"
    "main = type(sys)('__main__')\n"
    "main.__file__, main.__builtins__ = 'main.py', __builtins__\n"
    "sys.modules['__main__'] = main\n"
    "exec(code, main.__dict__)\n"
    "posix.write(3, posix.read(4, 64))\n"
)


@dataclass(frozen=True)
class Launch:
    """One sandboxed process: the files to write into scratch, the argv that runs them, what to read back."""

    files: dict[str, str]
    argv: list[str]
    binary_files: dict[str, bytes] = field(default_factory=dict)
    held: frozenset[str] = frozenset()  # binary files a worker may keep for later requests (a built program)
    collect: tuple[str, ...] = ()  # fnmatch patterns of scratch files returned after the run (build outputs)
    memory_kind: str = "as"  # "as": RLIMIT_AS; "data": RLIMIT_DATA, for runtimes that reserve address space
    stack_mb: int | None = None
    extra_memory_mb: int = 0  # the runtime's own needs, on top of the program's limit
    collect_max_bytes: int | None = None  # what `collect` may bring back in all; None: the run's scratch size
    # The resident peak a run may reach is its limit plus this (None: plus extra_memory_mb): Go's allowance is
    # address space it maps and never touches, not memory it may use.
    resident_extra_mb: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # on top of the sandbox's own environment


@dataclass(frozen=True)
class Toolchain:
    """How a language is built (once per request) and run (once per test). Paths are resolved at start-up."""

    source: str  # the file the program is written to
    run: tuple[str, ...]  # argv of a run; "{memory_mb}" is replaced by the run's memory limit
    compile: tuple[str, ...] = ()  # argv of the build step, none for interpreted languages
    artifacts: tuple[str, ...] = ()  # what the build leaves for the runs (fnmatch patterns)
    needs: tuple[str, ...] = ()  # node modules the build requires, under /usr/share/nodejs (Debian's packages)
    memory_kind: str = "data"
    # Native code gets a 64 MB stack for deep recursion; not runtimes with threads (glibc sizes every thread's
    # stack by RLIMIT_STACK, and under RLIMIT_DATA V8's helper threads then cannot start).
    stack_mb: int | None = None
    extra_memory_mb: int = 0  # what the runtime itself needs on top of the program's limit (JVM metaspace, V8)
    headers: tuple[str, ...] = ()  # files from include/ written beside the source for the build
    resident_extra_mb: int | None = None  # Launch.resident_extra_mb
    env: tuple[tuple[str, str], ...] = ()  # a run's environment on top of the sandbox's; "{memory_mb}" as in `run`


INCLUDE = Path(__file__).parent / "include"
# V8 must meet its own stack limit before the kernel's: past RLIMIT_STACK a deep recursion is a SIGSEGV with an
# empty stderr, not a RangeError the program can catch. So node runs with an 8 MiB stack (set, not inherited) and
# V8 uses 7000 KiB of it, leaving room for the C++ frames that build the RangeError. (Not a larger stack: glibc
# and libuv size threads' stacks by RLIMIT_STACK, and under RLIMIT_DATA V8's helper threads would not start.)
NODE_STACK_MB = 8
NODE = ("node", "--max-old-space-size={memory_mb}", "--stack-size=7000", "main.js")
# TypeScript is transpiled without type checking (as ts-node --transpile-only, esbuild and bun do): programs use
# `require` and `process` without @types/node; syntax errors still fail the build with tsc's messages.
TS_TRANSPILE = (
    'const ts = require("/usr/share/nodejs/typescript"), fs = require("fs");'
    'const out = ts.transpileModule(fs.readFileSync("main.ts", "utf8"), {reportDiagnostics: true, fileName: "main.ts",'
    " compilerOptions: {target: ts.ScriptTarget.ES2020, module: ts.ModuleKind.CommonJS}});"
    "const errors = (out.diagnostics || []).filter(d => d.category === ts.DiagnosticCategory.Error);"
    "for (const d of errors) {"
    "  const at = d.file ? d.file.getLineAndCharacterOfPosition(d.start) : {line: 0, character: 0};"
    "  console.error(`main.ts(${at.line + 1},${at.character + 1}): error TS${d.code}: ` +"
    '    ts.flattenDiagnosticMessageText(d.messageText, "\\n"));'
    "}"
    'if (errors.length) process.exit(1); fs.writeFileSync("main.js", out.outputText);'
)
# No hsperfdata: it is a file in /tmp (the scratch) per JVM, which a batch would have to clear after every run.
JVM = (
    "-Xmx{memory_mb}m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:ActiveProcessorCount=1",
    "-XX:-UsePerfData",
)
JAVA_ENTRY, JAVA_STACK_MB = "GrpoSandboxMain", 64
TOOLCHAINS: dict[str, Toolchain] = {
    "c": Toolchain("main.c", ("./main",), ("gcc", "-std=c17", "-O2", "-pipe", "-o", "main", "main.c", "-lm"), ("main",),
                   stack_mb=64),
    # testlib.h beside the source: Codeforces-style checkers, validators and generators `#include "testlib.h"`.
    "cpp": Toolchain("main.cpp", ("./main",), ("g++", "-std=c++17", "-O2", "-pipe", "-o", "main", "main.cpp"),
                     ("main",), stack_mb=64, headers=("testlib.h",)),
    # Main runs on a thread with a 64 MiB stack (include/GrpoSandboxMain.java): recursion 200,000 deep, as C's and
    # Rust's stacks allow, where the JVM's default 1 MiB overflowed at ~30,000 frames. Its reservation is counted
    # by RLIMIT_DATA, hence 64 MiB more for the runtime; only the pages touched are resident.
    "java": Toolchain(
        "Main.java", ("java", *JVM, "-cp", ".", JAVA_ENTRY),
        ("javac", "-J-Xmx512m", "-encoding", "UTF-8", "Main.java", f"{JAVA_ENTRY}.java"), ("*.class",),
        extra_memory_mb=256 + JAVA_STACK_MB, resident_extra_mb=256, headers=(f"{JAVA_ENTRY}.java",),
    ),
    "javascript": Toolchain("main.js", NODE, extra_memory_mb=128, stack_mb=NODE_STACK_MB),
    "typescript": Toolchain("main.ts", NODE, ("node", "-e", TS_TRANSPILE), ("main.js",), needs=("typescript",),
                            extra_memory_mb=128, stack_mb=NODE_STACK_MB),
    # Go maps writable memory it never touches (a 32 MiB arena index, heap arenas ahead of use), which RLIMIT_DATA
    # counts: hello world needs ~48 MiB of it, a program touching 60 MiB ~128. So the rlimit gets 128 MiB on
    # top, GOMEMLIMIT keeps the heap under the program's limit, and what it really uses is bounded by its resident
    # peak at the limit itself (resident_extra_mb=0): past it, memory_limit.
    "go": Toolchain("main.go", ("./main",), ("go", "build", "-ldflags=-s -w", "-o", "main", "main.go"), ("main",),
                    extra_memory_mb=128, resident_extra_mb=0, env=(("GOMEMLIMIT", "{memory_mb}MiB"),)),
    "rust": Toolchain("main.rs", ("./main",), ("rustc", "-O", "--edition", "2021", "-C", "strip=symbols",
                                               "-C", "linker={gcc}", "-o", "main", "main.rs"), ("main",), stack_mb=64),
    "bash": Toolchain("main.sh", ("bash", "main.sh"), memory_kind="as"),
}  # fmt: skip


def program_files(language: str) -> set[str]:
    """The scratch file names a language's own run uses (user files may not replace them)."""
    if language == "python":
        return {"main.py"}
    chain = TOOLCHAINS.get(language)
    return {chain.source, *(a for a in chain.artifacts if "*" not in a)} if chain else set()


def python_launch(program: str, interpreter: str) -> Launch:
    """Isolated mode (-I) ignores PYTHON* variables and user site; -S skips site-packages entirely."""
    return Launch(files={"main.py": program}, argv=[interpreter, "-I", "-S", "-c", PYTHON_DRIVER])


def resolve(argv0: str) -> str | None:
    """The real path of a tool (the sandbox has no /etc/alternatives to follow), or None when not installed."""
    found = shutil.which(argv0, path="/usr/local/bin:/usr/bin:/bin")
    return os.path.realpath(found) if found else None


def available(interpreter: str) -> dict[str, dict[str, str]]:
    """Language -> {tool name: real path} for every language whose tools are all installed."""
    out: dict[str, dict[str, str]] = {"python": {"python3": interpreter}}
    for language, chain in TOOLCHAINS.items():
        tools = {argv[0] for argv in (chain.run, chain.compile) if argv and not argv[0].startswith("./")}
        tools |= {m for argv in (chain.run, chain.compile) for a in argv for m in _TOOL.findall(a)}
        paths = {tool: resolve(tool) for tool in tools}
        modules = all(Path("/usr/share/nodejs", module).is_dir() for module in chain.needs)
        if all(paths.values()) and modules:
            out[language] = {tool: str(path) for tool, path in paths.items()}
    return out


_TOOL = re.compile(r"\{(?!memory_mb\})(\w+)\}")  # "{gcc}" in an argument: that tool's real path


def argv_for(template: tuple[str, ...], tools: dict[str, str], memory_mb: int) -> list[str]:
    argv = [_TOOL.sub(lambda m: tools[m.group(1)], a.replace("{memory_mb}", str(memory_mb))) for a in template]
    return [tools.get(argv[0], argv[0]), *argv[1:]]


def build_launch(language: str, program: str, tools: dict[str, str]) -> Launch | None:
    """The compile step of `language` (None for interpreted languages)."""
    chain = TOOLCHAINS.get(language)
    if chain is None or not chain.compile:
        return None
    return Launch(
        files={chain.source: program}, argv=argv_for(chain.compile, tools, 0), collect=chain.artifacts,
        memory_kind="data", binary_files={name: header(name) for name in chain.headers}, held=frozenset(chain.headers),
        collect_max_bytes=MAX_BUILD_OUTPUT_BYTES,
    )  # fmt: skip


@functools.cache
def header(name: str) -> bytes:
    return (INCLUDE / name).read_bytes()


def run_launch(
    language: str, program: str, tools: dict[str, str], memory_mb: int, built: dict[str, bytes] | None = None
) -> Launch:
    """A run of `language`: the built artifacts when there is a build step, else the source itself."""
    if language == "python":
        return python_launch(program, tools["python3"])
    chain = TOOLCHAINS[language]
    files = {} if chain.compile else {chain.source: program}
    return Launch(
        files=files, argv=argv_for(chain.run, tools, memory_mb), binary_files=dict(built or {}), held=frozenset(built or {}),
        memory_kind=chain.memory_kind, stack_mb=chain.stack_mb, extra_memory_mb=chain.extra_memory_mb,
        resident_extra_mb=chain.resident_extra_mb,
        env={name: value.replace("{memory_mb}", str(memory_mb)) for name, value in chain.env},
    )  # fmt: skip


# A build's outputs are kept by the worker for the runs (32 MiB of held programs) or written into each run's
# scratch: past this, a program (a C file with 200 MB of initialised data, say) is a compile_error, not a
# worker that fills its scratch or times out copying it.
MAX_BUILD_OUTPUT_BYTES = 32 << 20
# A build keeps a wall-clock limit (wall_s), as it always had: its CPU time would count a parallel build's processes
# (Go's) together. 30 s of CPU time stops it too, which a build that fits 30 s of wall time rarely reaches.
BUILD_LIMITS = Limits(
    timeout_s=30.0, wall_s=30.0, memory_mb=2048, max_processes=64, max_file_bytes=256 << 20, scratch_mb=512
)


def build(sandbox: Sandbox, language: str, program: str) -> tuple[ExecResult | None, dict[str, bytes]]:
    """Compile once: (the build's result when it failed, else None; the artifacts for the runs)."""
    launch = build_launch(language, program, sandbox.languages[language])
    if launch is None:
        return None, {}
    result = sandbox.execute(launch, "", BUILD_LIMITS)
    if result.status == "ok" and result.files:
        return None, result.files
    if result.status == "sandbox_error":
        return result, {}
    too_big = f"the build's output is over {MAX_BUILD_OUTPUT_BYTES >> 20} MiB"
    why = {"ok": "the build produced nothing", "runtime_error": "", "output_limit": too_big}.get(
        result.status, f"the build hit {result.status}"
    )
    stderr = f"{result.stderr}\n{why}".strip() if why else result.stderr
    return ExecResult("compile_error", result.exit_code, result.stdout, stderr, result.wall_s), {}


def build_and_run(
    sandbox: Sandbox,
    language: str,
    program: str,
    stdin: str,
    limits: Limits,
    files: dict[str, bytes] | None = None,
    read_back: tuple[str, ...] = (),
) -> ExecResult:
    """Build (when the language has a build step) and run once; a failed build is the result.

    `files` are written into the run's scratch directory first; scratch files matching `read_back` come back in
    the result's `files`.
    """
    if language not in sandbox.languages:
        raise ValueError(f"language {language!r} is not available here; available: {sorted(sandbox.languages)}")
    failed, built = build(sandbox, language, program)
    if failed is not None:
        return failed
    launch = run_launch(language, program, sandbox.languages[language], limits.memory_mb, built)
    clash = sorted(set(files or {}) & (set(launch.files) | set(launch.binary_files)))
    if clash:
        raise ValueError(f"files {clash} would replace the program's own files")
    launch = replace(launch, binary_files={**launch.binary_files, **(files or {})}, collect=read_back)
    return sandbox.execute(launch, stdin, limits)
