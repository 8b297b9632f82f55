"""More sandbox attacks through the running reward service's /v1/execute; each contained, the service healthy after.

Against a service in each sandbox mode: root, and rootless (no privilege outside its user namespace:
tests/support/sandbox_mode.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import sandbox_mode
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service
from tests.support.security_procs import TIGHT
from tests.unit.reward.helpers import descendants

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=sandbox_mode.modes())
def tight_reward(request: pytest.FixtureRequest) -> Iterator[RewardService]:
    """conftest's service (2 workers, short deadlines), once per sandbox mode; it says which mode it runs."""
    service = start_reward_service(*TIGHT, workers=2, env=sandbox_mode.service_env(request.param))
    try:
        sandbox = httpx.get(f"{service.http_url}/healthz", timeout=10).json()["sandbox"]
        assert ("rootless mode" in sandbox) == (request.param == "rootless"), sandbox
        yield service
        service.assert_alive()
    finally:
        stop_reward_service(service)


@pytest.fixture
def api(tight_reward: Any) -> Iterator[httpx.Client]:
    """An HTTP client; after each attack the service still answers and still runs code."""
    with httpx.Client(base_url=tight_reward.http_url, timeout=60.0) as client:
        yield client
        tight_reward.assert_alive()
        assert client.get("/healthz").status_code == 200
        assert execute(client, "print(6 * 7)")["stdout"] == "42\n"


def execute(api: httpx.Client, code: str, **extra: Any) -> dict[str, Any]:
    response = api.post("/v1/execute", json={"language": "python", "code": code, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_cannot_read_a_concurrent_executions_scratch(api: httpx.Client) -> None:
    marker = f"grpo-neighbour-{uuid.uuid4().hex}"
    victim_code = (
        f"import os, time\nopen('secret.txt', 'w').write({marker!r})\nos.makedirs('d', exist_ok=True)\n"
        f"open('d/also.txt', 'w').write({marker!r})\ntime.sleep(2.5)\nprint(open('secret.txt').read())\n"
    )
    victim: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: victim.update(execute(api, victim_code, timeout_s=3)))
    thread.start()
    time.sleep(1.0)  # the victim has written its file and sleeps
    thief_code = (
        "import os\nfound = []\n"
        "roots = ['/', '/scratch', '/tmp', '/dev/shm', '/proc']\n"
        "for root in roots:\n"
        "    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):\n"
        "        if dirpath.startswith('/proc/') and dirpath.count('/') > 3:\n            dirnames[:] = []\n"
        "        for name in filenames:\n"
        "            path = os.path.join(dirpath, name)\n"
        "            try:\n"
        f"                if {marker!r} in open(path, errors='ignore').read(1 << 16):\n"
        "                    found.append(path)\n"
        "            except Exception:\n                pass\n"
        "print('found', found)\n"
    )
    thief = execute(api, thief_code, timeout_s=3)
    thread.join(30)
    assert victim.get("stdout") == marker + "\n", victim  # the attack is meaningful: the victim's file was there
    assert thief["stdout"] == "found []\n" or thief["status"] == "timeout", thief
    assert marker not in thief["stdout"]


def test_cannot_see_or_read_the_services_proc(api: httpx.Client, tight_reward: Any) -> None:
    pid = tight_reward.proc.pid
    code = (
        "import os\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print('pids', pids)\n"
        "seen = []\n"
        f"for p in pids + [{pid}, 1]:\n"
        "    for what in ('cmdline', 'environ', 'maps'):\n"
        "        try:\n            seen.append(open(f'/proc/{p}/{what}', 'rb').read())\n        except OSError:\n            pass\n"
        "    try:\n        seen.append(str(os.listdir(f'/proc/{p}/fd')).encode())\n    except OSError:\n        pass\n"
        "    try:\n        seen.append(str(os.listdir(f'/proc/{p}/root')).encode())\n    except OSError:\n        pass\n"
        "print(b'|'.join(seen))\n"
    )
    result = execute(api, code)
    assert result["status"] == "ok", result
    pids_line = result["stdout"].splitlines()[0]
    assert max(eval(pids_line.removeprefix("pids "))) < 50, pids_line  # its own PID namespace: a handful of pids
    for leak in ("grpo.reward", "grpo-reward", "GRPO_", str(REPO), "/work", "site-packages/grpc"):
        assert leak not in result["stdout"], leak


def test_ptrace_is_refused(api: httpx.Client, tight_reward: Any) -> None:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206\n"
        "targets = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]\n"
        f"targets += [1, os.getppid(), {tight_reward.proc.pid}]\n"
        "ok = []\n"
        "for pid in targets:\n"
        "    for req in (PTRACE_ATTACH, PTRACE_SEIZE):\n"
        "        if libc.ptrace(req, pid, 0, 0) == 0:\n            ok.append(pid)\n"
        "child = os.fork()\n"
        "if child == 0:\n    import time; time.sleep(2); os._exit(0)\n"
        "if libc.ptrace(PTRACE_ATTACH, child, 0, 0) == 0:\n    ok.append(child)\n"  # even its own sibling
        "os.kill(child, 9)\n"
        "print('attached', ok)\n"
    )
    result = execute(api, code)
    assert result["stdout"] == "attached []\n", result


def test_symlink_escapes_lead_nowhere(api: httpx.Client) -> None:
    shadow = Path("/etc/shadow").read_text(errors="ignore")
    root_line = next((line for line in shadow.splitlines() if line.startswith("root:")), "root:")
    settings_file = REPO / "services/reward/src/grpo/reward/settings.py"
    code = (
        "import os\nout = []\n"
        f"for i, target in enumerate(['/etc/shadow', '/proc/1/root', '/proc/1/root/etc/shadow', {str(settings_file)!r},"
        " '/proc/self/root/../../etc/shadow', '../../../../etc/shadow']):\n"
        "    link = f'link{i}'\n"
        "    os.symlink(target, link)\n"
        "    try:\n"
        "        out.append(open(link, errors='ignore').read() if not os.path.isdir(link) else str(os.listdir(link)))\n"
        "    except OSError as exc:\n        out.append(type(exc).__name__)\n"
        "try:\n    os.link('/etc/passwd', 'hard')\n    out.append('hardlinked')\nexcept OSError as exc:\n"
        "    out.append(type(exc).__name__)\n"
        "print(out)\n"
    )
    result = execute(api, code)
    assert result["status"] == "ok", result
    assert "hardlinked" not in result["stdout"]
    for leak in (root_line, "class RewardSettings", "work", "root:$", "'home'"):
        assert leak not in result["stdout"], (leak, result["stdout"])


def test_kill_every_visible_process_leaves_the_service_alive(api: httpx.Client, tight_reward: Any) -> None:
    before = descendants(tight_reward.proc.pid)
    code = (
        "import os, signal\nsent = []\n"
        f"for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()] + [1, os.getppid(), {tight_reward.proc.pid}]"
        " + list(range(2, 200)):\n"
        "    if pid == os.getpid():\n        continue\n"
        "    for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n"
        "        try:\n            os.kill(pid, sig)\n            sent.append(pid)\n        except OSError:\n            pass\n"
        "print('signalled', sorted(set(sent)), flush=True)\n"
        "os.kill(-1, signal.SIGKILL)\n"
    )
    result = execute(api, code, timeout_s=3)
    assert result["status"] in ("ok", "runtime_error", "killed", "timeout"), result
    time.sleep(0.5)
    alive = {pid for pid in before if Path(f"/proc/{pid}").exists()}
    stopped = [pid for pid in alive if "stopped" in _state(pid)]
    assert not stopped, f"service processes stopped by the sandbox: {stopped}"
    assert tight_reward.proc.poll() is None


def test_filling_the_scratch_is_contained(api: httpx.Client) -> None:
    code = (
        "import errno\nwritten, files, last = 0, 0, None\nchunk = b'x' * (1 << 20)\n"
        "while files < 5000 and last not in (errno.ENOSPC, errno.EDQUOT):\n"
        "    try:\n"
        "        with open(f'f{files}', 'wb') as f:\n"
        "            while True:\n                f.write(chunk)\n                f.flush()\n                written += 1\n"
        "    except OSError as exc:\n"
        "        files, last = files + 1, exc.errno\n"
        "print('full at MB', written, 'errno', errno.errorcode.get(last))\n"
    )
    result = execute(api, code, timeout_s=3)
    assert result["status"] == "ok", result
    _, _, _, written, _, why = result["stdout"].split()
    assert why == "ENOSPC" and 1 <= int(written) <= 1024, result["stdout"]  # size-capped, far below the host's disk
    fresh = execute(api, "import os\nprint(sorted(os.listdir('.')), open('new', 'w').write('ok'))")
    assert fresh["status"] == "ok" and "'f0'" not in fresh["stdout"], fresh  # the next run starts empty and can write


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "gone"
