"""A single run's PID 1 (zygote.prepare): the C init (sandbox/init.c), built once and found the way the service
finds it, and the forked Python init it replaces where there is no C compiler. Both must confine a run alike."""

from __future__ import annotations

import ast
import logging
import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo.reward.sandbox import Limits, SandboxUnavailable, protocol, zygote_client
from grpo.reward.sandbox.init_program import init_program
from grpo.reward.sandbox.languages import Launch
from grpo.reward.sandbox.namespace import NamespaceSandbox
from tests.unit.reward.conftest import sandbox_with
from tests.unit.reward.helpers import mount_namespaces_held

FAST = Limits(timeout_s=10.0, memory_mb=256)
STATUS = "import re\nprint(dict(re.findall(r'(\\w+):\\s+(\\S+)', open('/proc/self/status').read())))"


@pytest.fixture(scope="module", params=["c", "python"])
def box(request: pytest.FixtureRequest) -> Iterator[NamespaceSandbox]:
    with sandbox_with(request.param, workers=1) as sandbox:
        assert isinstance(sandbox, NamespaceSandbox)
        assert (sandbox.init is not None) == (request.param == "c")
        yield sandbox


def _held(fd: int | None) -> Path:
    """The file an fd from init_program holds (and the fd closed)."""
    assert fd is not None
    try:
        return Path(f"/proc/self/fd/{fd}").readlink()
    finally:
        os.close(fd)


def test_init_c_is_built_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GRPO_SANDBOX_INIT", raising=False)
    path = _held(init_program())
    assert path.parent == tmp_path / "sandbox" and path.stat().st_mode & 0o777 == 0o755
    assert path.parent.stat().st_mode & 0o777 == 0o700
    built = path.stat().st_mtime_ns
    assert _held(init_program()) == path and path.stat().st_mtime_ns == built  # found, not built again
    assert path.read_bytes()[:4] == b"\x7fELF"


def test_a_cache_others_may_write_to_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The init runs as root until it drops to the run's uid: a binary someone else could swap is never used."""
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GRPO_SANDBOX_INIT", raising=False)
    _held(init_program())
    for shared in (tmp_path / "sandbox", tmp_path):  # the folder, or one above it: either lets others swap the file
        shared.chmod(shared.stat().st_mode | stat.S_IWGRP | stat.S_IWOTH)
        elsewhere = _held(init_program())
        assert tmp_path not in elsewhere.parents
        assert elsewhere.parent.stat().st_mode & 0o077 == 0  # a private folder of its own
        shared.chmod(0o700)


def test_the_init_a_sandbox_checked_is_the_one_its_zygotes_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service holds the file it checked open: a file put at the same path later is never what runs."""
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GRPO_SANDBOX_INIT", raising=False)
    box = NamespaceSandbox(workers=1)
    try:
        path = Path(f"/proc/self/fd/{box.init}").readlink()
        path.unlink()
        path.write_text("#!/bin/sh\nexit 0\n")  # not an init: every run would fail
        path.chmod(0o755)
        os.kill(box._all[0].proc.pid, signal.SIGKILL)
        assert box.run("print(1)", limits=FAST).status == "sandbox_error"  # the run the kill took
        assert box.run("print(6 * 7)", limits=FAST).stdout == "42\n"  # a new zygote, the checked init
    finally:
        box.close()


def test_a_named_init_that_is_not_there_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_SANDBOX_INIT", "/nonexistent/grpo-sandbox-init")
    with pytest.raises(SandboxUnavailable, match="GRPO_SANDBOX_INIT=/nonexistent/grpo-sandbox-init"):
        init_program()


def test_without_a_compiler_runs_set_up_in_python_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GRPO_SANDBOX_INIT", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with caplog.at_level(logging.WARNING):
        sandbox = NamespaceSandbox(workers=1)
    try:
        assert sandbox.init is None
        assert "install gcc" in caplog.text and "forked Python init" in sandbox.isolation
        assert sandbox.run("print(6 * 7)", limits=FAST).stdout == "42\n"
    finally:
        sandbox.close()


def test_requests_round_trip_and_refuse_a_nul() -> None:
    limits = [(7, 256), (9, (1 << 64) - 1)]
    data = protocol.encode_request(protocol.STDIN_OWN, limits, ["/bin/x", "", "a b"], {"A": "1=2", "B": ""})
    assert protocol.decode_request(data) == (protocol.STDIN_OWN, limits, ["/bin/x", "", "a b"], {"A": "1=2", "B": ""})
    with pytest.raises(ValueError, match="NUL"):
        protocol.encode_request(protocol.STDIN_NULL, [], ["/bin/x", "a\0b"], {})


def test_a_run_has_no_capabilities_and_no_way_to_gain_any(box: NamespaceSandbox) -> None:
    fields = ast.literal_eval(box.run(STATUS, limits=FAST).stdout)
    assert int(fields["CapBnd"], 16) == 0 and int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"
    assert fields["Uid"] == fields["Gid"] == str(box._all[0].uid)
    assert fields["Pid"] == "2"  # the init's child, not the init (test_sandbox_signals.py)


def test_stdin_reaches_the_program_every_way(box: NamespaceSandbox) -> None:
    """None (/dev/null), a small one (written into the prepared memfd) and a large one (passed as a memfd)."""
    count = "import sys\nd = sys.stdin.read()\nprint(len(d), d[:3])"
    assert box.run(count, limits=FAST).stdout == "0 \n"
    assert box.run(count, stdin="abc", limits=FAST).stdout == "3 abc\n"
    big = "xyz" * zygote_client.PASSED_MIN_BYTES
    assert box.run(count, stdin=big, limits=FAST).stdout == f"{len(big)} xyz\n"


def test_a_program_that_cannot_be_exec_d_is_a_sandbox_error_naming_it(box: NamespaceSandbox) -> None:
    result = box.execute(Launch(files={}, argv=["/nonexistent/program"]), "", FAST)
    assert result.status == "sandbox_error" and "/nonexistent/program" in result.stderr, result
    assert box.run("print(1)", limits=FAST).stdout == "1\n"  # and the worker goes on


def test_limits_and_the_deadline_still_act(box: NamespaceSandbox) -> None:
    assert box.run("while True: pass", limits=Limits(timeout_s=5.0, cpu_s=1.0)).status == "timeout"
    assert box.run("import time\ntime.sleep(30)", limits=Limits(timeout_s=1.0)).status == "timeout"
    assert box.run("x = bytearray(400 << 20)", limits=FAST).status == "memory_limit"
    assert box.run("raise SystemExit(3)", limits=FAST).exit_code == 3


def test_sigpipe_and_sigxfsz_reach_a_program_at_their_default(box: NamespaceSandbox) -> None:
    """CPython ignores both at start-up and an ignored signal stays ignored across exec: a program would get
    EPIPE and EFBIG where a shell's child dies of the signal (`yes | head` printed "Broken pipe")."""
    pipe = box.run("yes | head -1; echo ${PIPESTATUS[0]}", language="bash", limits=FAST)
    assert (pipe.stdout, pipe.stderr) == ("y\n141\n", ""), pipe
    limits = Limits(timeout_s=10.0, max_file_bytes=1 << 20)
    big = box.run("head -c 2000000 /dev/zero > big; echo $?", language="bash", limits=limits)
    assert big.stdout == f"{128 + signal.SIGXFSZ}\n" and "File size limit exceeded" in big.stderr, big


def _at_rest(pid: int) -> int:
    """The zygote's mount count once it is at rest: one run's mount namespace held open and one /scratch, both
    the next run's, prepared after the last reply."""
    deadline = time.monotonic() + 10
    while True:
        mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        held, scratches = mount_namespaces_held(pid), sum(" /scratch " in m for m in mounts)
        if held == 1 and scratches == 1:
            return len(mounts)
        assert time.monotonic() < deadline, (held, scratches)
        time.sleep(0.05)  # the reply is read before the zygote lets that run's namespace go and prepares the next


def test_finished_runs_leave_no_mount_or_namespace_behind(box: NamespaceSandbox) -> None:
    """A run's mount namespace is held from its set-up until its reply is written (zygote.release), then let go."""
    pid = box._all[0].pid
    box.run("print(1)", limits=FAST)
    before = _at_rest(pid)
    for _ in range(20):
        assert box.run("open('left.txt', 'w').write('x')", limits=FAST).status == "ok"
    assert _at_rest(pid) == before
