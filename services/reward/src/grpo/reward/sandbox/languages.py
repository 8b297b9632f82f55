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
tests share with it (e.g. replacing `builtins.abs` that an assert relies on) — HumanEval's contract runs
candidate and tests in one namespace. Nothing in-process can stop that; the defences there are that the
candidate never sees the tests, and that the sandbox still confines whatever it does. Treat a pass as "the tests ran to completion in an interpreter the candidate shared", not as a proof
against a program written to attack this harness.
"""

from __future__ import annotations

from dataclasses import dataclass

# `posix` is built in and already loaded; `import os` would cost about a millisecond under -S.
PYTHON_DRIVER = (
    "import posix, sys\n"
    "sys.argv = ['main.py']\n"
    "with open('main.py', 'rb') as f:\n"
    "    code = compile(f.read(), 'main.py', 'exec')\n"
    "del f\n"
    "exec(code, {'__name__': '__main__', '__file__': 'main.py', '__builtins__': __builtins__})\n"
    "posix.write(3, posix.read(4, 64))\n"
)


@dataclass(frozen=True)
class Launch:
    """The files to write into scratch and the argv that runs them."""

    files: dict[str, str]
    argv: list[str]


def python_launch(program: str, interpreter: str) -> Launch:
    """Isolated mode (-I) ignores PYTHON* variables and user site; -S skips site-packages entirely."""
    return Launch(files={"main.py": program}, argv=[interpreter, "-I", "-S", "-c", PYTHON_DRIVER])


LAUNCHERS = {"python": python_launch}


def launch_for(language: str, program: str, interpreter: str) -> Launch:
    """The launch recipe for `language`; ValueError names the supported ones."""
    try:
        return LAUNCHERS[language](program, interpreter)
    except KeyError:
        raise ValueError(f"unsupported language {language!r}; supported: {sorted(LAUNCHERS)}") from None
