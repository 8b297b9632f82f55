"""Rootless sandbox mode: the sandbox with no root and no capability outside a user namespace of its own (a pod at
the baseline Pod Security level), as it starts, what it loses next to root mode and how that is made up for.

The attack suites run in both modes (test_sandbox_attacks.py, tests/security/test_sandbox_escapes.py); the last
test here runs test_sandbox_attacks.py again from a test process that is itself uid 65534 with no capability, auto
mode deciding.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo.reward.sandbox import Limits
from grpo.reward.sandbox.languages import build, run_launch
from grpo.reward.sandbox.namespace import NamespaceSandbox
from tests.support.sandbox_mode import NOBODY

REPO = Path(__file__).resolve().parents[3]
FAST = Limits(timeout_s=5.0, memory_mb=256)
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
             "--bounding-set=-all"]  # fmt: skip
PROBE = (
    "import os\n"
    "from grpo.reward.sandbox import SandboxUnavailable, make_sandbox\n"
    "print(os.getuid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
    "try:\n    box = make_sandbox(workers=1)\nexcept SandboxUnavailable as exc:\n    print('unavailable:', exc)\n"
    "else:\n    print(box.mode, box.run('import os; print(os.getuid())').stdout.strip())\n    box.close()\n"
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts its sandboxes as another user: needs root")


@pytest.fixture(scope="module")
def rootless() -> Iterator[NamespaceSandbox]:
    """Rootless, its zygotes started as uid 65534 with no capability (the sandbox's `user`)."""
    box = NamespaceSandbox(workers=2, mode="rootless", user=NOBODY)
    yield box
    box.close()


def _probe(box: NamespaceSandbox, code: str, limits: Limits = FAST) -> str:
    result = box.run(code, limits=limits)
    assert result.status == "ok", (result.status, result.stderr[-2000:])
    return result.stdout.strip()


def test_the_zygotes_start_without_root_or_capabilities(rootless: NamespaceSandbox) -> None:
    assert rootless.mode == "rootless" and "rootless mode" in str(rootless.isolation)
    for zygote in rootless._all:
        assert zygote.started == {"uid": NOBODY, "euid": NOBODY, "cap_eff": "0000000000000000"}
        assert zygote.uid == 0 and zygote.rootless


def test_auto_mode_picks_rootless_for_an_unprivileged_service() -> None:
    """A service that is not root, with no capability, gets a rootless sandbox by itself."""
    out = subprocess.run([*AS_NOBODY, sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                         check=False, cwd="/", env={**os.environ, "GRPO_CACHE_DIR": "/tmp"})  # fmt: skip
    assert out.stdout.split("\n")[:2] == [f"{NOBODY} 0000000000000000", "rootless 0"], out.stderr[-2000:]


def test_a_masked_proc_fails_loudly_naming_both_ways() -> None:
    """Where the runtime masks /proc (containerd, CRI-O) a user namespace cannot mount a fresh one: the sandbox says
    so, naming what to set for rootless mode and what root mode takes; it never runs code unconfined."""
    masked = 'mount --bind /dev/null /proc/interrupts && exec "$@"'
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", masked, "sh", *AS_NOBODY, sys.executable]
    out = subprocess.run([*cmd, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False, cwd="/",
                         env={**os.environ, "GRPO_CACHE_DIR": "/tmp"})  # fmt: skip
    said = out.stdout.split("\n")[1]
    assert said.startswith("unavailable: no sandbox: not root"), (out.stdout, out.stderr[-2000:])
    for words in ("CAP_SYS_ADMIN", "rootless mode failed", "procMount: Unmasked", "never falls back"):
        assert words in said, said


def test_root_mode_refuses_a_service_that_is_not_root() -> None:
    probe = "from grpo.reward.sandbox.namespace import NamespaceSandbox\nNamespaceSandbox(workers=1, mode='root')\n"
    out = subprocess.run([*AS_NOBODY, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         check=False, cwd="/")  # fmt: skip
    assert "SandboxUnavailable: sandbox mode root: running as uid 65534, not root" in out.stderr, out.stderr[-2000:]
    with pytest.raises(ValueError, match="unknown sandbox mode"):
        NamespaceSandbox(workers=1, mode="unconfined")


def test_runs_cannot_reach_the_sysctls_their_uid_owns(rootless: NamespaceSandbox) -> None:
    """The run's uid owns the worker's namespaced sysctls (it is their owner's root uid): /proc/sys is read-only,
    so SysV IPC stays off for later runs; and the init is hidden (hidepid=2), its /proc files out of reach."""
    code = (
        "import ctypes, os\n"
        "for name in ('kernel/shmmni', 'net/ipv4/ping_group_range'):\n"
        "    try:\n        open('/proc/sys/' + name, 'w').write('1')\n        print('wrote', name)\n"
        "    except OSError as exc:\n        print(exc.errno)\n"
        "print(ctypes.CDLL(None).shmget(0, 4096, 0o600), sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(os.path.exists('/proc/1/clear_refs'), os.getpid())\n"
    )
    assert _probe(rootless, code).split("\n") == ["30", "30", "-1 ['2']", "False 2"]


def test_each_run_counts_only_its_own_processes(rootless: NamespaceSandbox) -> None:
    """One uid for every run, yet RLIMIT_NPROC holds per run (a user namespace each): two runs that each hold 6
    processes under a limit of 8 both succeed, side by side, and a seventh... ninth is refused."""
    code = (
        "import os, time\nkids = []\n"
        "for _ in range(6):\n    pid = os.fork()\n    if pid == 0:\n        time.sleep(1.5)\n        os._exit(0)\n"
        "    kids.append(pid)\n"
        "try:\n    [os.fork() or os._exit(0) for _ in range(3)]\n    print('no limit')\n"
        "except BlockingIOError:\n    print('limited')\n"
    )
    limits = Limits(timeout_s=10.0, max_processes=8)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(_probe(rootless, code, limits))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["limited", "limited"]


def test_a_batch_run_that_rewrites_the_program_does_not_change_the_next(rootless: NamespaceSandbox) -> None:
    """Rootless, the runs' uid owns /scratch and the program's files (one uid): a run may rewrite the program in
    place; the batch's supervisor sees it changed (batch._scratch_state) and the next run starts afresh."""
    program = (
        "import os, sys\nprint('original', sys.stdin.read().strip())\n"
        "os.chmod(sys.argv[0], 0o755)\nopen(sys.argv[0], 'w').write('print(\"rewritten\")')\nprint('rewrote')\n"
    )
    launch = run_launch(
        "python", program, rootless.languages["python"], FAST.memory_mb, build(rootless, "python", program)[1]
    )
    results = list(rootless.execute_many(launch, ["1", "2", "3"], FAST))
    assert [(r.status, r.stdout) for r in results] == [("ok", f"original {i}\nrewrote\n") for i in "123"], results


def test_a_process_group_reaches_nothing_outside_the_run(rootless: NamespaceSandbox) -> None:
    """kill(0) and setpriority(PRIO_PGRP) act on a process group wherever its members are, past PID namespaces, and
    rootless every process is the same uid outside: each run's init, and a batch's supervisor, start a session of
    their own, and the zygote one apart from the service's, so they reach only the run's own processes."""
    code = "import os, signal\nos.setpriority(os.PRIO_PGRP, 0, 19)\nos.kill(0, signal.SIGKILL)\n"
    pids = [z.pid for z in rootless._all]
    assert rootless.run(code, limits=FAST).exit_code == -9
    launch = run_launch("python", code, rootless.languages["python"], FAST.memory_mb)
    assert [r.exit_code for r in rootless.execute_many(launch, ["", ""], FAST)] == [-9, -9]
    assert [z.pid for z in rootless._all] == pids and all(z.alive() for z in rootless._all)
    assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in [os.getpid(), *pids]] == [0] * (1 + len(pids))
    assert _probe(rootless, "print(6 * 7)") == "42"


@pytest.mark.slow
def test_the_attack_suites_pass_as_an_unprivileged_user() -> None:
    """The attack suite from a test process that is uid 65534 with no capability: auto mode finds rootless alone,
    and every attack is contained as it is in root mode. (tests/security/test_sandbox_escapes.py runs its rootless
    service as root with sandbox_user 65534 instead: it starts the service with sys.executable, and this venv's
    interpreter may lie where uid 65534 cannot exec it, as under /root here.)"""
    suites = ["tests/unit/reward/test_sandbox_attacks.py"]
    env = {**os.environ, "GRPO_CACHE_DIR": "/tmp", "HOME": "/tmp"}
    env.pop("GRPO_TEST_SANDBOX_MODE", None)
    cmd = [*AS_NOBODY, sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *suites]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, cwd=REPO, env=env)
    assert out.returncode == 0, out.stdout[-6000:]
    ran = re.findall(r"\[(c|python)-(root|rootless)\] PASSED", out.stdout)
    assert len(ran) > 20 and {mode for _, mode in ran} == {"rootless"}, out.stdout[-3000:]
