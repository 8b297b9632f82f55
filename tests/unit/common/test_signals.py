"""A signal during start-up ends the process with 128 + signum, whatever the code it interrupts does with exceptions."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from grpo.common.signals import descendants, process_parents

# Start-up as it goes wrong: a child process, then code that swallows every exception (as a library's import
# or loader can: transformers' lazy imports turned SystemExit into ModuleNotFoundError) and goes on to serve.
SWALLOWING_START_UP = textwrap.dedent("""
    import subprocess, sys, time
    from grpo.common.logs import setup_logging
    from grpo.common.signals import exit_on_signals

    setup_logging("INFO", False)
    with exit_on_signals("start-up"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("child", child.pid, flush=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                time.sleep(0.01)
            except BaseException:
                pass
    print("serving", flush=True)
""")


def test_a_signal_during_start_up_exits_even_where_the_exception_would_be_swallowed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SWALLOWING_START_UP], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("child "), first
        child = int(first.split()[1])
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        rest = proc.stdout.read()
    finally:
        proc.kill()
    assert code == 128 + signal.SIGTERM, rest
    assert "signal SIGTERM during start-up: exiting" in rest and "serving" not in rest, rest
    deadline = time.monotonic() + 10  # the child got SIGTERM too; it is gone (or a zombie of its new parent)
    while time.monotonic() < deadline and psutil.pid_exists(child) and psutil.Process(child).status() != "zombie":
        time.sleep(0.05)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"


def test_descendants_walks_the_whole_tree_below_a_pid() -> None:
    parent_of = {2: 1, 3: 1, 4: 2, 5: 4, 6: 9, 7: 3}
    assert descendants(1, parent_of) == [2, 3, 4, 7, 5]
    assert descendants(4, parent_of) == [5]
    assert descendants(5, parent_of) == []


def test_process_parents_reads_this_process_and_its_children(tmp_path: Path) -> None:
    # A name with spaces and parentheses: /proc's stat line must be split after the name's last ")".
    odd = tmp_path / "x) 1 (y"
    odd.symlink_to(shutil.which("sleep") or "/bin/sleep")
    child = subprocess.Popen([str(odd), "30"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and psutil.Process(child.pid).name() != odd.name:
            time.sleep(0.01)
        assert psutil.Process(child.pid).name() == odd.name
        parents = process_parents()
        assert parents[os.getpid()] == os.getppid()
        assert parents[child.pid] == os.getpid()
        assert child.pid in descendants(os.getpid(), parents)
    finally:
        child.kill()
        child.wait()
