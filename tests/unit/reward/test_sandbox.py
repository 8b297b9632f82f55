"""The namespace sandbox with real processes: statuses, limits, deadlines, and recovery of its own machinery."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from grpo.reward.sandbox import Limits, Sandbox, SandboxUnavailable, make_sandbox
from grpo.reward.sandbox.languages import Launch, build, run_launch
from grpo.reward.sandbox.namespace import NamespaceSandbox
from grpo.reward.sandbox.verdicts import classify
from tests.unit.reward.helpers import mount_namespaces_held

FAST = Limits(timeout_s=2.0)


def test_ok_run_prints_and_proves_completion(sandbox: Sandbox) -> None:
    result = sandbox.run("print('hello', 6 * 7)")
    assert (result.status, result.exit_code, result.stdout, result.proof) == ("ok", 0, "hello 42\n", True)


def test_stdin_is_delivered(sandbox: Sandbox) -> None:
    result = sandbox.run("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="1 2\n3\n")
    assert result.stdout == "6\n"


def test_large_stdin_is_delivered(sandbox: Sandbox) -> None:
    data = "x" * 300_000
    result = sandbox.run("import sys\nprint(len(sys.stdin.read()))", stdin=data)
    assert result.stdout == "300000\n"


def test_runtime_error_keeps_the_traceback(sandbox: Sandbox) -> None:
    result = sandbox.run("raise KeyError('boom')")
    assert (result.status, result.exit_code, result.proof) == ("runtime_error", 1, False)
    assert "KeyError: 'boom'" in result.stderr


def test_syntax_error_is_a_runtime_error(sandbox: Sandbox) -> None:
    assert sandbox.run("def f(:\n  pass").status == "runtime_error"


@pytest.mark.parametrize(
    "program",
    [
        "import sys; sys.exit(0)",
        "import os; os._exit(0)",
        "raise SystemExit",
        "exit()",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    ],
)
def test_early_exit_gives_no_proof(sandbox: Sandbox, program: str) -> None:
    result = sandbox.run(program + "\nassert False, 'never reached'\n")
    assert not result.proof


def test_nonce_in_stdout_is_not_proof(sandbox: Sandbox) -> None:
    """A program cannot prove completion by printing anything it sees: the nonce is not in its text."""
    program = "import sys\nsrc = open(sys.argv[0]).read()\nprint(src)\nsys.exit(0)\n"
    result = sandbox.run(program)
    assert result.status == "ok" and not result.proof


def test_infinite_loop_times_out_near_the_deadline(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.run("while True:\n    pass", limits=Limits(timeout_s=1.0))
    elapsed = time.monotonic() - started
    assert result.status == "timeout"
    assert 1.0 <= elapsed < 3.0  # slack for a loaded machine


def test_long_sleep_times_out(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.run("import time\nprint('before', flush=True)\ntime.sleep(60)", limits=Limits(timeout_s=1.0))
    assert result.status == "timeout" and result.stdout == "before\n"
    assert time.monotonic() - started < sandbox.idle_factor * 1.0 + 1.0  # its wall-clock limit, and slack


def test_closing_every_pipe_does_not_escape_the_deadline(sandbox: Sandbox) -> None:
    program = "import os, time\nfor fd in range(5):\n    os.close(fd)\ntime.sleep(60)"
    started = time.monotonic()
    assert sandbox.run(program, limits=Limits(timeout_s=1.0)).status == "timeout"
    assert time.monotonic() - started < sandbox.idle_factor * 1.0 + 1.0  # its wall-clock limit, and slack


def test_cpu_limit_below_the_deadline_is_a_timeout(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.run("while True:\n    pass", limits=Limits(timeout_s=30.0, cpu_s=1))
    assert (result.status, result.exit_code) == ("timeout", -signal.SIGKILL), result  # the deadline: None
    assert time.monotonic() - started < 30.0


def test_a_runs_cpu_time_is_its_own_not_its_set_up(sandbox: Sandbox) -> None:
    """A single run's PID 1 is forked and set up (mounts, uid, seccomp) before its request, by an interpreter: a
    millisecond or two of CPU that is not the program's. Counted, a program that does nothing reported more
    CPU than wall time (2.5 against 1.9 ms, every run); a single-threaded program can never do that."""
    failed, built = build(sandbox, "c", "int main(){ return 0; }")
    assert failed is None, failed
    launch = run_launch("c", "", sandbox.languages["c"], 64, built)
    runs = []
    for i in range(30):
        runs.append(sandbox.execute(launch, "", Limits(timeout_s=5.0, memory_mb=64)))
        time.sleep(0.005 * (i % 2))  # a moment between requests, or back to back (the set-up still under way)
    assert all(r.status == "ok" and 0 < r.cpu_s <= r.wall_s for r in runs), [(r.cpu_s, r.wall_s) for r in runs]


def test_memory_bomb_is_memory_limit(sandbox: Sandbox) -> None:
    result = sandbox.run("x = bytearray(2 << 30)", limits=Limits(timeout_s=5.0, memory_mb=256))
    assert result.status == "memory_limit"


def test_growing_memory_bomb_is_memory_limit(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "x = []\nwhile True:\n    x.append(' ' * 10_000_000)", limits=Limits(timeout_s=5.0, memory_mb=256)
    )
    assert result.status == "memory_limit"


def test_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = sandbox.run(program, limits=Limits(timeout_s=1.5, max_processes=16))
    assert result.status == "timeout"
    after = sandbox.run("print('alive')")  # the same workers are usable at once
    assert after.status == "ok" and after.stdout == "alive\n"


def test_thread_limit_counts_processes(sandbox: Sandbox) -> None:
    program = "import os\nn = 0\ntry:\n    while True:\n        os.fork() or os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint('ok')"
    assert sandbox.run(program, limits=FAST).status == "ok"  # children exit at once: the limit counts live ones


def test_huge_output_is_output_limit(sandbox: Sandbox) -> None:
    result = sandbox.run("while True:\n    print('x' * 1000)", limits=Limits(timeout_s=5.0, max_output_bytes=100_000))
    assert result.status == "output_limit"
    assert len(result.stdout) <= 100_000


def test_huge_stderr_is_output_limit(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "import sys\nwhile True:\n    sys.stderr.write('y' * 1000)",
        limits=Limits(timeout_s=5.0, max_output_bytes=50_000),
    )
    assert result.status == "output_limit"


def test_file_size_limit(sandbox: Sandbox) -> None:
    program = "with open('big', 'wb') as f:\n    f.write(b'0' * (2 << 20))\nprint('wrote')"
    result = sandbox.run(program, limits=Limits(timeout_s=2.0, max_file_bytes=1 << 20))
    assert result.status == "runtime_error" and "wrote" not in result.stdout


def test_scratch_is_writable_and_size_capped(sandbox: Sandbox) -> None:
    program = (
        "import os\nopen('a.txt', 'w').write('hi')\nprint(open('/tmp/a.txt').read())\n"
        "try:\n    open('fill', 'wb').write(b'0' * (8 << 20))\nexcept OSError as e:\n    print('full', e.errno)\n"
    )
    # Each run's init is prepared before its request, on a scratch of the last run's size: each gets its own cap.
    for scratch_mb, expected in ((4, "hi\nfull 28\n"), (16, "hi\n"), (4, "hi\nfull 28\n"), (64, "hi\n")):  # ENOSPC
        result = sandbox.run(program, limits=Limits(timeout_s=2.0, scratch_mb=scratch_mb))
        assert result.stdout == expected, (scratch_mb, result)


def test_a_prepared_run_killed_while_it_waits_is_replaced_not_judged() -> None:
    """Each zygote forks the next run's init before its request arrives. Killed while it waits (the OOM
    killer, an operator), it must not become the next program's crash: the zygote prepares another."""
    sandbox = NamespaceSandbox(workers=1)
    try:
        assert sandbox.run("print(1)", limits=Limits(timeout_s=5.0)).stdout == "1\n"
        zygote = sandbox._all[0]  # type: ignore[attr-defined]
        pid = zygote.proc.pid
        deadline = time.monotonic() + 5
        while not (waiting := Path(f"/proc/{pid}/task/{pid}/children").read_text().split()):
            assert time.monotonic() < deadline, "no prepared run"
            time.sleep(0.01)
        os.kill(int(waiting[0]), signal.SIGKILL)
        stat = Path(f"/proc/{waiting[0]}/stat")
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # dead, not yet reaped by its zygote
            assert time.monotonic() < deadline, stat.read_text()
            time.sleep(0.01)
        result = sandbox.run("print(6 * 7)", limits=Limits(timeout_s=5.0))
        assert (result.status, result.stdout) == ("ok", "42\n"), result
        assert sandbox.run("print(2)", limits=Limits(timeout_s=5.0)).stdout == "2\n"
    finally:
        sandbox.close()


def test_a_runs_peak_memory_is_its_own_not_raised_by_what_an_earlier_run_read_back() -> None:
    """A run's peak (ru_maxrss) starts at the high-water mark of the zygote it was spawned from: one 16 MB file
    read back made every later run of that zygote report ~100 MB, and a small program's crash a memory_limit."""
    sandbox = NamespaceSandbox(workers=1)
    try:
        small, limits = Launch(files={}, argv=["/bin/true"]), Limits(timeout_s=5.0)
        before = sandbox.execute(small, "", limits).peak_memory_mb
        write = Launch(files={}, argv=["/bin/sh", "-c", "head -c 16000000 /dev/zero > big"], collect=("big",))
        big = sandbox.execute(write, "", limits)
        assert big.status == "ok" and len(big.files["big"]) == 16_000_000, big
        after = [sandbox.execute(small, "", limits).peak_memory_mb for _ in range(2)]
        assert max(after) < before + 4, (before, after)
    finally:
        sandbox.close()


def test_scratch_is_fresh_each_run(sandbox: Sandbox) -> None:
    sandbox.run("open('left.txt', 'w').write('x')")
    result = sandbox.run("import os\nprint(sorted(os.listdir('.')))")
    assert result.stdout == "['main.py']\n"


def test_bad_limits_and_language_are_value_errors(sandbox: Sandbox) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        sandbox.run("pass", limits=Limits(timeout_s=-1))
    with pytest.raises(ValueError, match="language 'cobol' is not available here"):
        sandbox.run("pass", language="cobol")


def test_text_that_is_not_unicode_is_a_value_error_and_costs_no_worker() -> None:
    """A lone surrogate (JSON's "\\ud800") in a program, a stdin or an argv cannot be written for a run: the
    caller's error, raised before any worker is used, so none is replaced for it."""
    box = NamespaceSandbox(workers=1)
    try:
        pids = [z.proc.pid for z in box._all]
        for kwargs, where in (
            ({"program": "print(1)  # \ud800"}, "files.main.py at character 12"),
            ({"program": "print(input())", "stdin": "\udc80"}, "stdin.0 at character 0"),
        ):
            with pytest.raises(ValueError, match=f"{re.escape(where)} holds a lone UTF-16 surrogate"):
                box.run(**kwargs)  # type: ignore[arg-type]
        launch = Launch(files={"main.py": "print(1)"}, argv=["/usr/bin/python3", "main.py"])
        with pytest.raises(ValueError, match=re.escape("stdin.1 at character 2")):
            list(box.execute_many(launch, ["1", "ab\ud800", "3"]))
        assert [z.proc.pid for z in box._all] == pids
        assert box.run("print('\u00e9')").stdout == "\u00e9\n"
    finally:
        box.close()


def test_dead_zygote_gives_sandbox_error_then_recovers() -> None:
    box = NamespaceSandbox(workers=1)
    try:
        [zygote] = box._all
        os.kill(zygote.proc.pid, signal.SIGKILL)
        broken = box.run("print(1)", limits=FAST)
        assert broken.status == "sandbox_error" and "sandbox failure" in broken.stderr
        healed = box.run("print(1)", limits=FAST)
        assert healed.status == "ok" and healed.stdout == "1\n"
    finally:
        box.close()


def test_replacement_zygote_outlives_the_thread_that_needed_it() -> None:
    """The service runs code on short-lived executor threads; a zygote started there must not die with them."""
    box = NamespaceSandbox(workers=1)
    try:
        os.kill(box._all[0].proc.pid, signal.SIGKILL)
        worker = threading.Thread(target=box.run, args=("print(1)",), kwargs={"limits": FAST})
        worker.start()
        worker.join()  # that run saw the dead zygote and asked for a replacement; the thread is gone now
        time.sleep(0.3)
        result = box.run("print(2)", limits=FAST)
        assert (result.status, result.stdout) == ("ok", "2\n")
    finally:
        box.close()


def test_waiting_for_a_worker_is_bounded() -> None:
    box = NamespaceSandbox(workers=1, acquire_timeout_s=0.5)
    try:
        slow = threading.Thread(target=box.run, args=("import time\ntime.sleep(2)",), kwargs={"limits": FAST})
        slow.start()
        time.sleep(0.2)
        result = box.run("print(1)", limits=FAST)
        assert result.status == "sandbox_error" and "no sandbox worker free" in result.stderr
        slow.join()
    finally:
        box.close()


def test_runs_after_close_are_sandbox_errors() -> None:
    box = NamespaceSandbox(workers=1)
    box.close()
    assert box.run("print(1)").status == "sandbox_error"


PROBE = (
    "from grpo.reward.sandbox import SandboxUnavailable, make_sandbox\n"
    "try:\n    make_sandbox(workers=1)\nexcept SandboxUnavailable as exc:\n    print('unavailable:', exc)\n"
)
ROOT_PROBE = PROBE.replace("make_sandbox(workers=1)", "make_sandbox(workers=1, mode='root')")


@pytest.mark.parametrize(
    ("setpriv", "reason"),
    [
        (["--reuid=65534", "--regid=65534", "--clear-groups"], "not root"),
        (["--inh-caps=-sys_admin", "--bounding-set=-sys_admin"], "Operation not permitted"),
    ],
)
def test_missing_privileges_fail_loudly_at_start(setpriv: list[str], reason: str) -> None:
    """Without the privileges it needs, root mode refuses to start and says what to grant. (Auto mode then tries
    rootless mode instead: test_sandbox_rootless.py.)"""
    cmd = ["setpriv", *setpriv, sys.executable, "-c", ROOT_PROBE]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert out.stdout.startswith("unavailable:"), out.stderr[-2000:]
    assert reason in out.stdout and "CAP_SYS_ADMIN" in out.stdout


def test_the_remedy_names_exactly_the_capabilities_the_deployments_grant_and_they_suffice() -> None:
    """The start-up error's advice is what docker-compose.yml grants the reward container, and a sandbox whose
    bounding set holds just those runs code (it once named SETPCAP and CHOWN, and SYS_ADMIN alone for k8s)."""
    from grpo.reward.sandbox.zygote_client import REMEDY

    compose = yaml.safe_load((Path(__file__).resolve().parents[3] / "docker-compose.yml").read_text())
    granted = compose["services"]["reward"]["cap_add"]
    assert sorted(re.findall(r"CAP_([A-Z_]+)", REMEDY)) == sorted(granted)
    assert f"add [{', '.join(granted)}]" in REMEDY
    bounding = ",".join(["-all", *(f"+{cap.lower()}" for cap in granted)])
    probe = PROBE + "else:\n    print('ran:', make_sandbox(workers=1).run('print(6 * 7)').stdout.strip())\n"
    cmd = ["setpriv", f"--inh-caps={bounding}", f"--bounding-set={bounding}", sys.executable, "-c", probe]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, cwd="/")
    assert out.stdout.strip() == "ran: 42", (out.stdout, out.stderr[-2000:])


CONTAINER_PROBE = (
    "import sys\n"
    "from grpo.reward.sandbox import make_sandbox\n"
    "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
    "box = make_sandbox(workers=1)\n"
    "r = box.run('import ctypes\\nprint(input(), ctypes.CDLL(None).shmget(0, 4096, 0o600))', stdin='hi\\n')\n"
    "print(r.status, r.stdout.strip(), r.proof)\n"
    "print(box.isolation.split('; ')[-1])\n"
    "from grpo.reward.sandbox.languages import Launch\n"  # a built program, held and linked into the scratch
    'main = f\'#!{box.languages["bash"]["bash"]}\\nread a b; echo $((a + b))\\n#{"x" * 9000}\\n\'.encode()\n'
    "held = Launch(files={}, argv=['./main'], binary_files={'main': main}, memory_kind='as',\n"
    "              held=frozenset({'main'}))\n"
    "print(*(f'{r.status} {r.stdout.strip()}' for r in (box.execute(held, '2 40'), box.execute(held, '1 2'))))\n"
    "print(box._all[0].proc.pid, flush=True)\n"
    "sys.stdin.readline()  # while the test looks at the zygote\n"
    "box.close()\n"
)


def test_runs_with_only_the_capabilities_the_deployment_grants() -> None:
    """Like the compose file and the Helm chart: root with SYS_ADMIN, SETUID, SETGID, KILL only, no_new_privs,
    and /proc/sys read-only as container runtimes mount it."""
    caps = "sys_admin,+setuid,+setgid,+kill"
    inner = (
        "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && "
        f'exec setpriv --no-new-privs --inh-caps=-all --bounding-set=-all,+{caps} {sys.executable} -c "$0"'
    )
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner, CONTAINER_PROBE]
    probe = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/"
    )
    try:
        assert probe.stdout is not None and probe.stdin is not None
        lines = [probe.stdout.readline().strip() for _ in range(5)]
        assert lines[:4] == [
            "00000000002000e0",
            "ok hi -1 True",  # SysV shm refused
            "single runs spawned by a static C init (init.c)",
            "ok 42 ok 3",  # linked in from /held without CAP_DAC_OVERRIDE: as the run's uid, into its scratch
        ], (lines, probe.stderr.read() if probe.poll() is not None else "")
        # The next run is prepared and its mount namespace held: sent by its init, since opening /proc/PID/ns of
        # another uid would take CAP_SYS_PTRACE, which this deployment does not grant.
        deadline = time.monotonic() + 10
        while (held := mount_namespaces_held(int(lines[4]))) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held == 1
        probe.stdin.write("\n")
        probe.stdin.flush()
        assert probe.wait(timeout=60) == 0
    finally:
        probe.kill()
        probe.wait()


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown sandbox kind"):
        make_sandbox("docker")


def test_interpreter_outside_the_sandbox_root_fails_loudly_at_start() -> None:
    with pytest.raises(SandboxUnavailable, match="not visible inside the sandbox root"):
        NamespaceSandbox(workers=1, interpreter=sys.executable)  # the venv lives under /work: hidden from runs


def test_missing_interpreter_fails_loudly_at_start() -> None:
    with pytest.raises(SandboxUnavailable, match="cannot start"):
        NamespaceSandbox(workers=1, interpreter="/nonexistent/python3")


def _reply(verdict: str | None = None, exit_code: int | None = 0, **extra: object) -> dict[str, object]:
    return {"verdict": verdict, "exit_code": exit_code, "setup_error": "", "stderr": "", **extra}


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (_reply(), ("ok", 0)),
        (_reply(exit_code=3), ("runtime_error", 3)),
        (_reply(exit_code=-9), ("runtime_error", -9)),
        (_reply(exit_code=-9, cpu_s=2.0, cpu_limit_s=2), ("timeout", -9)),  # the CPU rlimit's SIGKILL
        (_reply(exit_code=-9, cpu_s=0.85, cpu_limit_s=1), ("timeout", -9)),  # wait4 counts short under load
        (_reply(exit_code=-9, cpu_s=0.749, cpu_limit_s=1), ("timeout", -9)),  # seven processes on 2 vCPUs
        (_reply(exit_code=-9, cpu_s=0.5, cpu_limit_s=1), ("runtime_error", -9)),
        (_reply(exit_code=-9, cpu_s=0.1, cpu_limit_s=2), ("runtime_error", -9)),
        (_reply(exit_code=1, stderr="Traceback\nMemoryError\n"), ("memory_limit", 1)),
        (_reply(exit_code=1, stderr="MemoryError: oops\nValueError: later\n"), ("memory_limit", 1)),
        (_reply(exit_code=1, stderr="Traceback\nValueError: MemoryError\n"), ("runtime_error", 1)),
        (_reply("timeout", -9), ("timeout", None)),
        (_reply("output_limit", -9), ("output_limit", None)),
        (_reply(exit_code=127, setup_error="OSError: mount failed"), ("sandbox_error", None)),
        ({"error": "boom"}, ("sandbox_error", None)),
    ],
)
def test_classify(reply: dict[str, object], expected: tuple[str, int | None]) -> None:
    assert classify(reply) == expected


@pytest.mark.parametrize(("limits", "said"), [(Limits(timeout_s=float("nan")), "timeout_s=nan is not a number"),
                                              (Limits(timeout_s=4000.0), "timeout_s=4000.0 is out of range")])  # fmt: skip
def test_a_limit_that_is_nan_is_named_not_a_number(limits: Limits, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        limits.validate()
