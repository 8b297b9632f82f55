"""Attacks on the namespace sandbox with real processes: network, secrets, files, orphans, neighbours, the parent.

Each against both kinds of single-run init (test_sandbox_init.py): init.c, and the forked Python init it replaces
where there is no C compiler; and in both sandbox modes, root and rootless (tests/support/sandbox_mode.py)."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo.reward.sandbox import Limits, Sandbox
from grpo.reward.sandbox.languages import Launch
from tests.support import sandbox_mode
from tests.unit.reward.conftest import sandbox_with
from tests.unit.reward.helpers import host_processes_with

FAST = Limits(timeout_s=3.0)
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", params=[(i, m) for m in sandbox_mode.modes() for i in ("c", "python")], ids="-".join)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    init, mode = request.param
    with sandbox_with(init, mode=mode) as box:
        yield box


def _probe(sandbox: Sandbox, body: str) -> str:
    result = sandbox.run(body, limits=FAST)
    assert result.status == "ok", result.stderr
    return result.stdout.strip()


def test_loopback_connect_to_host_port_fails(sandbox: Sandbox, listener: int) -> None:
    program = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {listener}), timeout=1)\n    print('connected')\nexcept OSError as e:\n    print('blocked', e.errno)"
    assert _probe(sandbox, program).startswith("blocked")


@pytest.mark.parametrize("address", ["1.1.1.1", "8.8.8.8"])
def test_external_connect_fails(sandbox: Sandbox, address: str) -> None:
    program = f"import socket\ntry:\n    socket.create_connection(('{address}', 53), timeout=1)\n    print('connected')\nexcept OSError as e:\n    print('blocked', e.errno)"
    assert _probe(sandbox, program).startswith("blocked")


def test_no_network_interface_is_up(sandbox: Sandbox) -> None:
    program = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n    s.sendto(b'x', ('127.0.0.1', 9))\n    print('sent')\nexcept OSError:\n    print('blocked')"
    assert _probe(sandbox, program) == "['lo']\nblocked"


def test_service_environment_is_invisible(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("GRPO_TEST_SECRET", secret)
    program = (
        "import os\nprint(sorted(os.environ))\n"
        "for p in ('/proc/1/environ', '/proc/self/environ'):\n"
        "    try:\n        print(open(p, 'rb').read())\n    except OSError as e:\n        print('denied', p)\n"
    )
    result = sandbox.run(program, limits=FAST)
    assert secret not in result.stdout and "GRPO_TEST_SECRET" not in result.stdout
    assert result.stdout.startswith("['HOME', 'LANG', 'PATH', 'TMPDIR']\n")  # /proc/1 is the program itself


def test_service_process_is_invisible_in_proc(sandbox: Sandbox) -> None:
    me = os.getpid()
    program = (
        f"import os\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\nprint(pids)\n"
        f"print(os.path.exists('/proc/{me}/environ') and {me} not in pids)\n"
    )
    out = _probe(sandbox, program).splitlines()
    assert max(eval(out[0])) < 10  # its own tiny PID namespace: init, the program, maybe a helper
    assert out[1] == "False"


@pytest.mark.parametrize("path", ["/etc/grpo-attack", "/tmp/../grpo-attack", "/usr/grpo-attack", "/grpo-attack"])
def test_writing_outside_scratch_fails(sandbox: Sandbox, path: str) -> None:
    program = f"try:\n    open('{path}', 'w').write('x')\n    print('wrote')\nexcept OSError as e:\n    print('denied', e.errno)"
    assert _probe(sandbox, program).startswith("denied")
    assert not Path(path).exists()


def test_host_tmp_and_repo_are_invisible_and_untouched(sandbox: Sandbox, tmp_path: Path) -> None:
    marker = tmp_path / "visible.txt"
    marker.write_text("host secret")
    program = (
        "import os\n"
        f"for p in ({str(marker)!r}, {str(REPO)!r}, '/root', '/home', '/work', '/run', '/var', '/sys/kernel'):\n"
        "    print(p, os.path.exists(p))\n"
        f"try:\n    open({str(REPO / 'grpo-attack.txt')!r}, 'w')\n    print('wrote repo')\nexcept OSError:\n    print('repo denied')\n"
        "print(sorted(os.listdir('/tmp')))\n"
    )
    out = _probe(sandbox, program)
    assert "True" not in out and "repo denied" in out
    assert not (REPO / "grpo-attack.txt").exists()


def test_cannot_remount_or_mount(sandbox: Sandbox) -> None:
    program = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.mount(b'none', b'/usr', None, 32 | 1 << 12, None), ctypes.get_errno())\n"  # MS_REMOUNT|MS_BIND
        "print(libc.mount(b'tmpfs', b'/scratch', b'tmpfs', 0, None), ctypes.get_errno())\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
    )
    assert _probe(sandbox, program).splitlines() == ["-1 1", "-1 1", "0000000000000000"]


def test_held_programs_are_read_only_and_cannot_be_listed(sandbox: Sandbox) -> None:
    """A built program the zygote holds is linked into the run's scratch from /held (confine.mount_held): the run
    can execute and read its own, but not change it, add to /held, or list /held to find another request's."""
    bash = sandbox.languages["bash"]["bash"]  # type: ignore[attr-defined]
    script = (
        f"#!{bash}\n"
        'target=$(readlink main); echo "link $target"\n'
        "ls /held >/dev/null 2>&1 && echo listed || echo 'list denied'\n"
        "(echo x > /held/new) 2>/dev/null && echo created || echo 'create denied'\n"
        "(echo x >> \"$target\") 2>/dev/null && echo wrote || echo 'write denied'\n"
        "chmod 777 \"$target\" 2>/dev/null && echo chmodded || echo 'chmod denied'\n"
        "md5sum < main | cut -d' ' -f1\n"
        "#" + "x" * 10_000 + "\n"  # past HELD_MIN_BYTES: held, as a built program is
    ).encode()
    launch = Launch(
        files={}, argv=["./main"], binary_files={"main": script}, memory_kind="as", held=frozenset({"main"})
    )
    single = [sandbox.execute(launch, "", FAST) for _ in range(2)]
    batch = list(sandbox.execute_many(launch, ["", ""], FAST))
    for result in [*single, *batch]:
        lines = result.stdout.splitlines()
        assert result.status == "ok" and len(lines) == 6, result
        assert re.fullmatch(r"link /held/[0-9a-f]{32}", lines[0]), lines
        assert lines[1:] == [
            "list denied",
            "create denied",
            "write denied",
            "chmod denied",
            hashlib.md5(script).hexdigest(),
        ]


def test_cannot_signal_or_ptrace_the_service_or_the_zygote(sandbox: Sandbox) -> None:
    """Neither the service nor the zygote exists in the run's PID namespace; the program's parent is its
    namespace's init, which a kill(-1) passes over."""
    zygote_pids = [z.proc.pid for z in sandbox._all]  # type: ignore[attr-defined]
    targets = [os.getpid(), *zygote_pids]
    program = (
        "import ctypes, os, signal, sys\nsys.stdout.reconfigure(line_buffering=True)\n"
        "print(os.getpid(), os.getppid())\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for pid in {targets}:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n        print('killed')\n"
        "    except OSError as e:\n        print('denied', e.errno)\n"
        "    print(libc.ptrace(16, pid, None, None), ctypes.get_errno())\n"  # PTRACE_ATTACH
        "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\nprint('survived kill -1')\n"
    )
    result = sandbox.run(program, limits=FAST)
    lines = result.stdout.splitlines()
    assert lines[0] == "2 1"
    # kill: ESRCH (not even visible); ptrace: EPERM (seccomp refuses it before the kernel looks)
    assert lines[1:] == ["denied 3", "-1 1"] * len(targets) + ["survived kill -1"]
    assert all(z.alive() for z in sandbox._all)  # type: ignore[attr-defined]
    assert sandbox.run("print('still here')", limits=FAST).stdout == "still here\n"


def test_seccomp_blocks_namespaces_ptrace_and_io_uring(sandbox: Sandbox) -> None:
    program = (
        "import ctypes, subprocess, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def show(rc):\n    print(rc, ctypes.get_errno())\n"
        "show(libc.unshare(0x10000000))\n"  # CLONE_NEWUSER: would hand the program a fresh set of capabilities
        "show(libc.unshare(0x40000000))\n"  # CLONE_NEWNET
        "show(libc.ptrace(0, 0, None, None))\n"  # PTRACE_TRACEME
        "show(libc.syscall(425, 8, ctypes.create_string_buffer(120)))\n"  # io_uring_setup
        "print(subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True).stdout.strip())\n"
    )
    assert _probe(sandbox, program).splitlines() == ["-1 1", "-1 1", "-1 1", "-1 1", "7"]


@pytest.mark.parametrize("style", ["setsid", "double_fork"])
def test_orphans_die_with_the_run(sandbox: Sandbox, style: str) -> None:
    marker = f"grpo-orphan-{uuid.uuid4().hex}"
    sleeper = f"import time; time.sleep(30)  # {marker}"
    if style == "setsid":
        body = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True)\nprint('spawned')"
    else:
        body = (
            "import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', {sleeper!r}])\n    os._exit(0)\nos.wait()\nprint('spawned')"
        )
    result = sandbox.run(body, limits=FAST)
    assert result.stdout == "spawned\n", result.stderr
    assert host_processes_with(marker) == []


def test_orphans_die_at_the_deadline(sandbox: Sandbox) -> None:
    marker = f"grpo-orphan-{uuid.uuid4().hex}"
    sleeper = f"import time; time.sleep(30)  # {marker}"
    body = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True)\ntime.sleep(30)"
    assert sandbox.run(body, limits=Limits(timeout_s=1.0)).status == "timeout"
    assert host_processes_with(marker) == []


def test_concurrent_runs_cannot_see_each_other(sandbox: Sandbox) -> None:
    secret = uuid.uuid4().hex
    holder = f"import time\nopen('secret.txt', 'w').write({secret!r})\nprint('written', flush=True)\ntime.sleep(2)"
    snoop = (
        "import os, time\ntime.sleep(0.5)\nhits = []\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    if root.startswith(('/usr', '/proc/sys', '/proc/sysvipc')):\n        dirs[:] = []\n"
        "    hits += [os.path.join(root, f) for f in files if f == 'secret.txt']\n"
        "print(hits, sorted(p for p in os.listdir('/proc') if p.isdigit()))"
    )
    results: dict[str, str] = {}
    threads = [
        threading.Thread(target=lambda: results.__setitem__("holder", sandbox.run(holder, limits=FAST).stdout)),
        threading.Thread(target=lambda: results.__setitem__("snoop", sandbox.run(snoop, limits=FAST).stdout)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["holder"] == "written\n"
    assert results["snoop"].startswith("[] ")  # no secret.txt anywhere it can see


def test_runs_use_different_uids_per_worker(sandbox: Sandbox) -> None:
    """Root mode: a uid per worker. Rootless mode has one uid (0 of the zygote's user namespace, the service's uid
    outside) and gives each run a user namespace of its own instead, with no capability in it."""
    program = (
        "import os, time\ntime.sleep(0.5)\nstatus = {k: v.strip() for k, _, v in (l.partition(':') for l in open('/proc/self/status'))}\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), os.stat('/proc/self/ns/user').st_ino, status['CapEff'],"
        " status['CapPrm'], status['CapBnd'], status['CapAmb'], status['NoNewPrivs'], sep='|')"
    )
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(sandbox.run(program, limits=FAST).stdout)) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fields = [line.strip().split("|") for line in results]
    assert all(len(f) == 9 for f in fields), results
    assert all(f[4:8] == ["0000000000000000"] * 4 and f[8] == "1" for f in fields), fields
    uids = {int(f[0]) for f in fields}
    if getattr(sandbox, "mode", "root") == "rootless":
        assert uids == {0} and all(f[1:3] == ["0", "[]"] for f in fields), fields
        assert len({f[3] for f in fields}) == 2  # two user namespaces: each run counts its own processes
    else:
        assert len(uids) == 2 and all(uid >= 200_000 for uid in uids)


def test_runs_are_the_oom_killers_first_choice(sandbox: Sandbox) -> None:
    assert _probe(sandbox, "print(open('/proc/self/oom_score_adj').read())") == "1000"


def test_the_host_survives_a_fork_bomb_plus_memory(sandbox: Sandbox) -> None:
    program = "import os\nwhile True:\n    try:\n        os.fork()\n        x = bytearray(64 << 20)\n    except (OSError, MemoryError):\n        pass\n"
    started = time.monotonic()
    result = sandbox.run(program, limits=Limits(timeout_s=1.5, max_processes=32, memory_mb=128))
    assert result.status in ("timeout", "memory_limit")
    assert time.monotonic() - started < 6.0
    assert sandbox.run("print(1)", limits=FAST).stdout == "1\n"
