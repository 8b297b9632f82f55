"""`grpo up` config parsing and the process supervisor on real (tiny) child processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from grpo.local.launcher import LaunchError, TrainerFailed, read_stack_config, spec_from_config, supervise
from grpo.local.procs import ChildFailed, Supervisor, stop_pid


def test_config_sections_become_a_spec(tmp_path: Path) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text("run_id: r1\nreplicas: 2\nrollout: {model: tiny}\ntrainer: {train_data: t.jsonl}\n")
    spec = spec_from_config(read_stack_config(path), tmp_path / "runs")
    assert (spec.run_id, spec.replicas, spec.rollout, spec.redis_url) == ("r1", 2, {"model": "tiny"}, None)
    assert spec.trainer == {"train_data": "t.jsonl", "output_dir": str((tmp_path / "runs" / "r1").resolve())}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rolout: {}\n", "unknown key(s) ['rolout'] (did you mean rolout → rollout?)"),
        ("reward: 3\n", "'reward' must be a mapping"),
        ("- 1\n", "must hold a mapping"),  # the services' own config reader says it
        ("replicas: two\n", "replicas: Input should be a valid integer"),
        ("replicas: yes\n", "replicas: Input should be a valid integer"),  # YAML true is not 1 replica
        ("replicas: 1.5\n", "replicas: Input should be a valid integer"),
        ("replicas: -1\n", "replicas: must be >= 0 (got -1)"),
        (
            "replicas: -1\ntrainer: {train_data: t.jsonl}\n",
            "replicas: must be >= 1 with a trainer section, unless colocate: true (got -1)",
        ),
        (
            "replicas: 0\ntrainer: {train_data: t.jsonl}\n",
            "replicas: must be >= 1 with a trainer section, unless colocate: true (got 0)",
        ),
        ("colocate: true\n", "colocate: true needs a trainer section"),
        ("colocate: 1\ntrainer: {train_data: t.jsonl}\n", "colocate: Input should be a valid boolean"),
        ("start_timeout_s: soon\n", "start_timeout_s: Input should be a valid number"),
        ("start_timeout_s: 0\n", "start_timeout_s: Input should be greater than 0"),
        ("start_timeout_s: .inf\n", "start_timeout_s: Input should be a finite number"),
        ("run_id: ../elsewhere\n", "run_id: '../elsewhere' must not start with a dot"),
        ("redis_url: [1]\n", "redis_url: Input should be a valid string"),
    ],
)
def test_bad_config_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(text)
    with pytest.raises(LaunchError, match=re.escape(message)):
        read_stack_config(path)


def test_every_bad_top_level_key_is_named_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text("replicas: two\nstart_timeout_s: soon\n")
    with pytest.raises(LaunchError) as caught:
        read_stack_config(path)
    assert "\n" not in str(caught.value)
    assert "replicas: Input should be a valid integer" in str(caught.value)
    assert "start_timeout_s: Input should be a valid number" in str(caught.value)


def test_a_colocated_stack_plans_no_rollout_process(tmp_path: Path) -> None:
    """`colocate: true`: no replica process unless asked for; the trainer gets the rollout section as its replica's
    settings, with the reward's address and without what is the trainer's own (model, run, Redis)."""
    from grpo.local.stack import plan_services

    path = tmp_path / "stack.yaml"
    path.write_text("run_id: c\ncolocate: true\nrollout: {model: tiny, max_new_tokens_cap: 64}\n"
                    "trainer: {train_data: t.jsonl}\n")  # fmt: skip
    spec = spec_from_config(read_stack_config(path), tmp_path / "runs")
    assert (spec.colocate, spec.replicas) == (True, 0)
    planned = plan_services(spec, "redis://127.0.0.1:1/0")
    assert [p.name for p in planned] == ["reward", "trainer"]
    colocate = planned[1].values["colocate"]
    assert colocate["reward_addr"] == f"127.0.0.1:{planned[0].values['grpc_port']}"
    assert colocate["max_new_tokens_cap"] == 64 and "model" not in colocate and "run" not in colocate
    path.write_text("colocate: true\nreplicas: 1\ntrainer: {train_data: t.jsonl}\n")  # and one replica more
    spec = spec_from_config(read_stack_config(path), tmp_path / "runs")
    assert [p.name for p in plan_services(spec, "redis://127.0.0.1:1/0")] == ["reward", "rollout-0", "trainer"]


def test_top_level_defaults_and_a_stack_without_a_trainer_needs_no_replica(tmp_path: Path) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text("run_id: 7\nreplicas: 0\nreward: {workers: 2}\nstart_timeout_s: 30\n")
    spec = spec_from_config(read_stack_config(path), tmp_path / "runs")
    assert (spec.run_id, spec.replicas, spec.start_timeout_s, spec.trainer) == ("7", 0, 30.0, None)
    path.write_text("run_id: ''\n")
    spec = spec_from_config(read_stack_config(path), tmp_path / "runs")
    assert (spec.run_id, spec.replicas, spec.start_timeout_s) == ("default", 1, 180.0)
    assert spec.run_dir == (tmp_path / "runs" / "default").resolve()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("replicas: two\n", "replicas: Input should be a valid integer"),
        ("start_timeout_s: soon\n", "start_timeout_s: Input should be a valid number"),
        (
            "replicas: -1\nrollout: {model: tiny}\ntrainer: {train_data: t.jsonl}\n",
            "replicas: must be >= 1 with a trainer",
        ),
    ],
)
def test_cli_up_refuses_a_bad_top_level_key_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    """No traceback, no silent start without a replica: one line naming the key, exit 2, nothing started."""
    from grpo.cli.main import main

    config = tmp_path / "stack.yaml"
    config.write_text(text)
    assert main(["--runs-dir", str(tmp_path / "runs"), "up", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}: {message}" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="not found"):
        read_stack_config(tmp_path / "nope.yaml")


def test_supervisor_stops_children_and_their_children(tmp_path: Path) -> None:
    # The child spawns a grandchild in its process group; both must be gone after stop_all.
    script = "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(300)']); time.sleep(300)"
    with Supervisor(tmp_path) as sup:
        child = sup.start("sleeper", [sys.executable, "-c", script])
        deadline = time.monotonic() + 20
        while len(psutil.Process(child.pid).children()) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        grandchild = psutil.Process(child.pid).children()[0].pid
    assert not psutil.pid_exists(child.pid) or psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_sigterm_ignoring_child_is_killed(tmp_path: Path) -> None:
    script = (
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"
    )
    sup = Supervisor(tmp_path)
    child = sup.start("stubborn", [sys.executable, "-c", script])
    sup.wait_ready(child, lambda: "ready" in child.log_path.read_text(), 20)
    started = time.monotonic()
    assert stop_pid(child.pid, grace_s=1.0)
    assert time.monotonic() - started < 10
    assert child.proc.poll() is not None


def test_stop_all_shares_one_grace_period_after_the_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C with a trainer and N stubborn services: two grace periods, not N + 1."""
    import grpo.local.procs as procs

    script = (
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"
    )
    sup = Supervisor(tmp_path)
    children = [sup.start(f"svc{i}", [sys.executable, "-c", script]) for i in range(4)]
    for child in children:
        sup.wait_ready(child, lambda c=child: "ready" in c.log_path.read_text(), 20)
    batches: list[list[int]] = []
    real = procs.stop_pids
    monkeypatch.setattr(
        procs, "stop_pids", lambda pids, grace_s, reap=None: batches.append(list(pids)) or real(pids, grace_s, reap)
    )
    sup.stop_all(grace_s=1.0)
    assert batches == [[children[3].pid], [c.pid for c in reversed(children[:3])]]  # the newest, then the rest at once
    assert all(c.proc.poll() is not None for c in children)


def test_child_that_dies_while_starting_is_reported_with_its_log(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    child = sup.start("broken", [sys.executable, "-c", "import sys; print('bad flag --x'); sys.exit(3)"])
    with pytest.raises(ChildFailed, match=r"(?s)broken.*code 3.*bad flag --x"):
        sup.wait_ready(child, lambda: False, 20)
    sup.stop_all()


def test_cli_status_down_and_bad_up_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from grpo.cli.main import main

    assert main(["status", "--runs-dir", str(tmp_path)]) == 1  # --runs-dir after the subcommand
    assert main(["--runs-dir", str(tmp_path), "down"]) == 1  # ... and before it
    assert f"no running stack under {tmp_path}" in capsys.readouterr().out
    bad = tmp_path / "stack.yaml"
    bad.write_text("trainer: [1]\n")
    assert main(["up", "-c", str(bad)]) == 2  # a config error, before anything starts
    assert not list(tmp_path.glob("*/stack.json"))


_STATUS_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"phase": "grpo", "step": 3, "total_steps": 10, "metrics": {}}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
print("serving", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_watch_fails_a_stalled_run_with_the_logs(tmp_path: Path) -> None:
    from grpo.common.net import free_port
    from grpo.demo.demo import watch
    from grpo.demo.live import ViewState
    from grpo.local.procs import http_ok

    port = free_port()
    with Supervisor(tmp_path) as sup:
        trainer = sup.start("trainer", [sys.executable, "-c", _STATUS_SERVER, str(port)])
        sup.wait_ready(trainer, lambda: http_ok(f"http://127.0.0.1:{port}/v1/status"), 20)
        view = ViewState()
        with pytest.raises(ChildFailed, match=r"(?s)no progress for 2s at step 3 \(grpo\).*trainer:.*serving"):
            watch(sup, port, view, lambda: None, stall_s=2.0, poll_s=0.2)
        assert view.step == 3 and view.total == 10


_SLEEPER = "import time; print('up', flush=True); time.sleep(300)"


@pytest.mark.parametrize(
    ("trainer_script", "exit_code"),
    [
        ("import sys, time; time.sleep(0.5); print('the run failed: boom', flush=True); sys.exit(3)", 3),
        ("import os, signal, time; time.sleep(0.5); print('boom', flush=True); os.kill(os.getpid(), signal.SIGKILL)",
         128 + 9),  # the shell's code for a SIGKILLed (e.g. out-of-memory) trainer
    ],
)  # fmt: skip
def test_supervise_fails_with_the_trainers_exit_code_and_log(
    tmp_path: Path, trainer_script: str, exit_code: int
) -> None:
    with Supervisor(tmp_path) as sup:
        reward = sup.start("reward", [sys.executable, "-c", _SLEEPER])
        trainer = sup.start("trainer", [sys.executable, "-c", trainer_script])
        with pytest.raises(
            TrainerFailed, match=rf"(?s)trainer \(pid {trainer.pid}\) exited with code .*trainer\.log.*boom"
        ) as caught:
            supervise(sup, poll_s=0.1)
        assert caught.value.exit_code == exit_code
        assert reward.alive()  # up() stops the rest of the stack (its finally), not supervise
    assert not reward.alive()


def test_supervise_returns_when_the_trainer_finishes(tmp_path: Path) -> None:
    with Supervisor(tmp_path) as sup:
        reward = sup.start("reward", [sys.executable, "-c", _SLEEPER])
        sup.start("trainer", [sys.executable, "-c", "import time; time.sleep(0.5)"])
        supervise(sup, poll_s=0.1)
        assert reward.alive()


def test_supervise_fails_when_another_service_exits(tmp_path: Path) -> None:
    with Supervisor(tmp_path) as sup:
        sup.start("rollout-0", [sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(0)"])
        sup.start("trainer", [sys.executable, "-c", _SLEEPER])
        with pytest.raises(ChildFailed, match=r"rollout-0 \(pid \d+\) exited with code 0") as caught:
            supervise(sup, poll_s=0.1)
        assert not isinstance(caught.value, TrainerFailed)


def test_up_reports_every_bad_setting_of_every_section_before_starting(tmp_path: Path) -> None:
    """One bad key or value in each section: all of them in one error, exit 2, and no process was started."""
    import subprocess

    config = tmp_path / "stack.yaml"
    config.write_text(
        "run_id: bad\n"
        "reward: {workers: 2, wrokers: 3}\n"
        "rollout: {model: tiny, temprature: 1.0, max_n: -1}\n"
        "trainer: {train_data: t.jsonl, stepz: 5}\n"
    )
    cmd = [sys.executable, "-m", "grpo.cli", "--runs-dir", str(tmp_path / "runs"), "up", "-c", str(config)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    for problem in (
        "reward.wrokers: unknown setting (did you mean workers?)",
        "rollout.temprature: unknown setting",
        "rollout.max_n: Input should be greater than",
        "trainer.stepz: unknown setting (did you mean steps?)",
    ):
        assert problem in done.stderr, done.stderr[-3000:]
    assert "nothing started" in done.stderr
    assert not (tmp_path / "runs" / "bad" / "logs").exists() or not list((tmp_path / "runs" / "bad" / "logs").iterdir())


def test_launch_waits_for_ready_and_stop_keeps_the_exit_code(tmp_path: Path) -> None:
    """The one launcher: ready only once the check passes, output in the log file, and stop() returns the child's
    own exit code (reaping the group must not turn it into 0)."""
    from grpo.local.procs import launch

    script = (
        "import signal,sys,time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "time.sleep(0.5); print('up', flush=True); time.sleep(300)\n"
    )
    log_path = tmp_path / "logs" / "child.log"
    child = launch(
        "child", [sys.executable, "-c", script], log_path, lambda: "up" in log_path.read_text(), timeout_s=20
    )
    assert child.alive() and log_path.read_text() == "up\n"
    assert child.stop(grace_s=5.0) == 7


def test_launch_that_never_gets_ready_stops_the_child(tmp_path: Path) -> None:
    from grpo.local.procs import launch

    log_path = tmp_path / "never.log"
    with pytest.raises(ChildFailed, match=r"(?s)never.*not ready after 1s.*waiting"):
        launch("never", [sys.executable, "-c", "print('waiting', flush=True); import time; time.sleep(300)"], log_path,
               lambda: False, timeout_s=1.0)  # fmt: skip
    assert not [p for p in psutil.process_iter(["cmdline"]) if "print('waiting'" in " ".join(p.info["cmdline"] or [])]


def test_a_sigkilled_launcher_leaves_no_child_behind(tmp_path: Path) -> None:
    """Children of an attached Supervisor get PR_SET_PDEATHSIG: SIGKILL the launcher (no stop_all runs) and
    they still stop."""
    launcher = (
        "import sys, time\nfrom pathlib import Path\nfrom grpo.local.procs import Supervisor\n"
        "sup = Supervisor(Path(sys.argv[1]))\n"
        "child = sup.start('sleeper', [sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(child.pid, flush=True)\ntime.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        # exec'd past the trampoline (the pid is known at fork: on a loaded machine the exec can come later)
        wanted, deadline = ["-c", "import time; time.sleep(300)"], time.monotonic() + 10
        while psutil.Process(child).cmdline()[-2:] != wanted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert psutil.Process(child).cmdline()[-2:] == wanted
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and psutil.pid_exists(child) and psutil.Process(child).status() != "zombie":
            time.sleep(0.05)
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:
        proc.kill()


FORKS_SEEN: list[int] = []  # at-fork handlers cannot be removed: one, for this whole test process
os.register_at_fork(before=lambda: FORKS_SEEN.append(os.getpid()))


def test_starting_a_child_runs_no_fork_handler_in_the_launcher(tmp_path: Path) -> None:
    """The launcher (the demo: gRPC health checks and status polls) must not fork() to start a child. A fork runs
    grpcio's fork handlers, which restart its poller in the child, where it aborted on the epoll fd that close_fds
    had closed: with a busy channel, 2 to 17 of 500 starts here ended in SIGABRT or SIGSEGV before exec
    (grpc/grpc#43055). A subprocess without a preexec_fn is a vfork, and no fork handler runs."""
    seen = len(FORKS_SEEN)
    with Supervisor(tmp_path) as sup:
        child = sup.start("sleeper", [sys.executable, "-c", "import time; time.sleep(300)"])
        assert child.alive()
    assert len(FORKS_SEEN) == seen, "a fork() of the launcher started the child"
