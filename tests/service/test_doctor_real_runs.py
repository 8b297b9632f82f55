"""`grpo doctor` on real short runs made to go wrong: the real trainer, Redis, reward service and hf replicas of
the tiny model, a dozen steps each, then the doctor on the run folder. Each run must show its rule and not the
rules of the other runs' symptoms; one of them is also watched live, its findings read from /v1/status,
GetRunStatus and `grpo status` while it trains.

The runs share the session's Redis and one reward service that knows the plug-ins of tests/support/doctor_runs.py
(module scope); each gets its own replicas (a replica serves one run). A run folder here has no
config/trainer.yaml, so the doctor knows β and the reference refresh only from what the trainer logged
(train/beta, train/steps_since_ref_refresh).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from grpo.cli.main import main
from grpo.cli.views import status_view
from grpo.common.net import free_port
from grpo.common.tiny_model import cache_root
from grpo.local.procs import Child, ChildFailed, spawn
from grpo.local.stack import StackState
from grpo.local.status import status
from grpo.v1 import trainer_pb2, trainer_pb2_grpc
from tests.support.answer_model import PROBLEMS, answer_model_path, prompt
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service
from tests.support.rollout_proc import start_rollout_service
from tests.support.trainer_proc import (
    ROLLOUT_ENV,
    read_metrics,
    run_failing_trainer,
    run_trainer,
    trainer_config,
    write_rows,
)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = 12  # the trend rules need ten steps; the live doctor checks at step 10
# Every rule a run here could show by mistake. rollout_wait is left out: a synchronous run of an hf replica on a
# CPU waits for rollouts a good part of each step (a fifth to a half here), all of it when it trains nothing.
SYMPTOMS = {"zero_variance", "unbalanced_groups", "reward_hacking", "truncation", "kl_spike", "clip_ratio",
            "logprob_mismatch", "stale_drops"}  # fmt: skip


@pytest.fixture(scope="module")
def reward() -> Iterator[RewardService]:
    """One reward service for the module's runs, with the length-paying and the rank-paying plug-ins."""
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "GRPO_REWARD_PLUGINS": json.dumps({"length": "tests.support.doctor_runs:paid_length",
                                              "rank": "tests.support.doctor_runs:paid_by_rank"})}  # fmt: skip
    try:
        service = start_reward_service(workers=1, env=env)
    except ChildFailed as exc:
        pytest.fail(f"could not start the reward service: {exc}")
    yield service
    stop_reward_service(service)


def length_data(path: Path, n: int = 16, plugin: str = "length") -> Path:
    """Sums whose reward is a plug-in's (the length one unless told); their math check (weight 0 in the runs) measures the accuracy,
    against a gold no completion reaches (the sum + 5000): the tiny model wrote a right sum by chance once in a
    while, and one right answer in the last steps reads as a rising accuracy that silences reward_hacking."""
    rows = [{"id": f"q{i}", "prompt": f"What is {i} + {i + 1}?",
             "checks": {"math": {"gold": str(2 * i + 5001)}, "plugins": {plugin: {}}}} for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train(tmp_path: Path, run: str, redis_url: str, reward: RewardService, *, fails: bool = False,
          steps: int = STEPS, replica_envs: Sequence[dict[str, str]] = ({},),
          started: Callable[[Child], None] | None = None, **settings: Any) -> tuple[set[str], dict[str, Any]]:  # fmt: skip
    """Run the trainer for `steps` steps with `settings` over the config of tests/support/trainer_proc.py, with
    replicas of its own (one per entry of `replica_envs`, its environment over ROLLOUT_ENV); then `grpo doctor --json`
    on its folder: (the rules that fired, the doctor's JSON). `started` is handed the trainer's process as it starts."""
    args = ("--redis-url", redis_url, "--reward-addr", reward.grpc_addr, "--advertise-host", "127.0.0.1")
    env = {**ROLLOUT_ENV, "GRPO_ROLLOUT_RUN": run}
    replicas = []
    try:
        for i, own in enumerate(replica_envs, 1):
            replica_id = ("--replica-id", f"{run}-r{i}")
            replicas.append(start_rollout_service(*args, *replica_id, log_dir=tmp_path, env={**env, **own}))
        config = trainer_config(tmp_path, run, redis_url, steps=steps, checkpoint_every=steps, **settings)
        if started is not None:
            run_watched_trainer(config, tmp_path / "trainer.log", started)
        elif fails:
            run_failing_trainer(config, tmp_path / "trainer.log", timeout=240)
        else:
            run_trainer(config, tmp_path / "trainer.log", timeout=240)
    finally:
        for replica in replicas:
            replica.stop()
    return diagnosed(tmp_path / "out", steps)


def run_watched_trainer(config: Path, log: Path, started: Callable[[Child], None]) -> None:
    """run_trainer's run (it must exit 0), its process handed to `started` first."""
    env = {"OMP_NUM_THREADS": "1", "GRPO_TRAINER_CONFIG": str(config)}
    trainer = spawn("trainer", [sys.executable, "-m", "grpo.trainer"], log, env=env)
    try:
        started(trainer)
        assert trainer.proc.wait(timeout=240) == 0, log.read_text()[-4000:]
    finally:
        if trainer.proc.poll() is None:
            trainer.proc.kill()


def diagnosed(run_dir: Path, steps: int = STEPS) -> tuple[set[str], dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["doctor", "--json", str(run_dir)])
    shown = json.loads(out.getvalue())
    fired = {f["rule"] for f in shown["findings"]}
    assert code == (1 if fired else 0) and shown["steps"][1] == steps
    return fired, shown


def finding(shown: dict[str, Any], rule: str) -> dict[str, Any]:
    return next(f for f in shown["findings"] if f["rule"] == rule)


def status_findings(http_port: int, grpc_port: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The trainer's doctor findings as /v1/status and GetRunStatus report them now."""
    http = httpx.get(f"http://127.0.0.1:{http_port}/v1/status", timeout=2).json()["doctor"]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        rpc = trainer_pb2_grpc.TrainerServiceStub(channel).GetRunStatus(trainer_pb2.GetRunStatusRequest(), timeout=2)
    return http, [
        {"rule": f.rule, "symptom": f.symptom, "evidence": f.evidence, "remedy": f.remedy} for f in rpc.doctor
    ]


def stack_file(runs_dir: Path, run: str, redis_url: str, reward: RewardService, trainer: Child, http_port: int) -> Path:
    """The stack file `grpo up` would have written for this run, which `grpo status` reads: the module's reward
    service and this run's trainer (its replica is left out: the replicas show from the registry)."""
    run_dir = runs_dir / run
    run_dir.mkdir(parents=True)
    processes = [{"name": name, "pid": c.pid, "create_time": c.create_time, "cmd": c.cmd, "ports": c.ports,
                  "log": str(c.log_path)} for name, c in (("reward", reward.child), ("trainer", trainer))]  # fmt: skip
    state = StackState(run_id=run, run_dir=str(run_dir), redis_url=redis_url, reward_addr=reward.grpc_addr,
                       reward_http=reward.http_port, trainer_http=http_port, processes=processes,
                       trainer_output_dir=str(runs_dir.parent / "out"))  # fmt: skip
    return state.save()


def grpo_status(runs_dir: Path, *flags: str) -> tuple[int, str]:
    """`grpo status --runs-dir runs_dir *flags`: its exit code and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["status", "--runs-dir", str(runs_dir), *flags])
    return code, out.getvalue()


def test_a_tiny_length_budget_shows_truncation(tmp_path: Path, redis_url: str, reward: RewardService) -> None:
    """No stop string and a budget of 3 tokens: nearly every completion is cut. Watched live: the trainer's check at
    step 10 puts the finding in its status, over HTTP and gRPC alike, and `grpo status` (what it reads of a stack
    whose trainer answers) shows it; once the trainer has exited, `grpo status` shows what it last reported."""
    ports = {"http_port": free_port(), "grpc_port": free_port()}
    runs = tmp_path / "runs"
    stack: list[Path] = []
    seen: list[tuple[list[dict[str, str]], list[dict[str, str]]]] = []
    in_status: list[dict[str, Any]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and not (seen and in_status):
            try:
                http, rpc = status_findings(ports["http_port"], ports["grpc_port"])
            except (httpx.HTTPError, grpc.RpcError):  # not serving yet, or gone
                http, rpc = [], []
            # Both, or neither: the check can land between the two reads, and then only gRPC has it.
            if http and rpc and not seen:
                seen.append((http, rpc))
            shown = status(stack[0]) if stack else {}
            if shown.get("doctor") and not in_status:
                in_status.append(shown)
            time.sleep(0.2)

    def started(trainer: Child) -> None:
        stack.append(stack_file(runs, "trunc", redis_url, reward, trainer, ports["http_port"]))
        watcher.start()

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        fired, shown = train(tmp_path, "trunc", redis_url, reward, max_new_tokens=3, stop=[],
                             overlong_soft_penalty=False, reward_weights={"length": 1.0, "math": 0.0},
                             train_data=str(length_data(tmp_path / "length.jsonl")), started=started,
                             http_port=ports["http_port"], grpc_port=ports["grpc_port"])  # fmt: skip
    finally:
        done.set()
        if watcher.is_alive():
            watcher.join(timeout=10)
    assert "truncation" in fired and not (fired & SYMPTOMS) - {"truncation"}, shown
    evidence = finding(shown, "truncation")["evidence"]  # "rollout/truncation_rate 0.98 (mean, steps 8–12)"
    assert evidence.startswith("rollout/truncation_rate ") and float(evidence.split()[1]) > 0.9, evidence
    assert seen, "the trainer's status never showed a doctor finding over both APIs"
    http, rpc = seen[0]
    assert http == rpc, (http, rpc)  # one document, two APIs
    live = {f["rule"]: f for f in http}
    assert set(live) - {"rollout_wait"} == {"truncation"} and "max_new_tokens" in live["truncation"]["remedy"]
    # `grpo status` while the trainer answered: the same findings, and a line each for a person.
    assert in_status, "grpo status never showed the trainer's doctor findings"
    assert in_status[0]["trainer"]["alive"] and in_status[0]["doctor"] == http, in_status[0]
    cut = live["truncation"]
    line = f"truncation: {cut['symptom']}; remedy: {cut['remedy']}"
    rows = [row.split(None, 1) for row in status_view(in_status[0]).splitlines()]
    assert ["doctor", line] in rows, rows
    # ... and after it exited (the stack lives on in its reward service): what it last reported, and said so.
    code, text = grpo_status(runs)
    rows = [row.split(None, 1) for row in text.splitlines()]
    assert code == 0 and ["doctor", f"(last reported) {line}"] in rows, text
    code, raw = grpo_status(runs, "--json")
    assert code == 0 and json.loads(raw)["doctor"] == http, raw


def test_a_task_no_answer_solves_shows_zero_variance(tmp_path: Path, redis_url: str, reward: RewardService) -> None:
    """Math only, on answers the untrained tiny model never gets: every group all wrong, all dropped, and the run
    fails having trained on nothing; its metrics still say why."""
    # Stops at common letters keep completions short: few are cut by the budget (truncation is another run's).
    fired, shown = train(tmp_path, "zero", redis_url, reward, fails=True, overlong_soft_penalty=False,
                         reward_weights={"math": 1.0}, skip_zero_variance=True, stop=["e", " ", "a", "o"])  # fmt: skip
    assert "zero_variance" in fired and not (fired & SYMPTOMS) - {"zero_variance"}, shown
    # A step that trains on nothing is all waiting for rollouts: rollout_wait's 90 % of the step time, rightly.
    assert "rollout_wait" in fired and "time/wait_rollouts_s" in finding(shown, "rollout_wait")["evidence"], shown
    f = finding(shown, "zero_variance")
    assert "groups/zero_variance_fraction 1" in f["evidence"] and "refill_zero_variance" in f["settings"]
    # The split unbalanced_groups reads: every group all wrong, none all right (one side only: not unbalanced).
    rows = read_metrics(tmp_path / "out")
    assert {(r["groups/all_solved_fraction"], r["groups/none_solved_fraction"]) for r in rows} == {(0.0, 1.0)}


def test_a_large_step_without_a_reference_refresh_shows_kl(
    tmp_path: Path, redis_url: str, reward: RewardService
) -> None:
    """β small, the reference never refreshed, and a learning rate 5000 times the tests' usual: the policy
    runs from the reference. The doctor reads β and the refresh from the rows (this folder holds no config)."""
    # Every group trained (none dropped as zero-variance): an update, and a KL, every step.
    fired, shown = train(tmp_path, "kl", redis_url, reward, beta=0.001, ref_refresh_steps=0, lr=5e-2,
                         skip_zero_variance=False)  # fmt: skip
    assert "kl_spike" in fired and not (fired & SYMPTOMS) - {"kl_spike", "clip_ratio"}, shown
    f = finding(shown, "kl_spike")
    assert "beta 0.001 (train/beta)" in f["evidence"] and "no reference refresh" in f["evidence"], f
    assert f["settings"] == ["beta", "ref_refresh_steps"]
    trained = [r for r in read_metrics(tmp_path / "out") if "train/kl" in r]
    assert trained and all(r["train/beta"] == 0.001 and r["train/steps_since_ref_refresh"] == -1 for r in trained)


def test_a_reward_that_pays_length_shows_reward_hacking(tmp_path: Path, redis_url: str, reward: RewardService) -> None:
    """The only reward is the length plug-in's, and a completion stops at its first "e": the policy learns to write
    longer without an "e" while nothing it should learn improves.

    Room to grow, and time: the untrained completions run ~8 tokens to their first "e". With a budget of 32 and 12
    steps the lengths grew only 1.7–3.3× first to last window (once, in CI, under 1.5×: lr 1e-2 sometimes lengthens
    them within the first window, and the cap held the last); a budget of 64 over 16 steps grew them 5.5–9.2× (six runs)."""
    fired, shown = train(tmp_path, "hack", redis_url, reward, steps=16, overlong_soft_penalty=False,
                         max_new_tokens=64, reward_weights={"length": 1.0, "math": 0.0}, lr=1e-2,
                         train_data=str(length_data(tmp_path / "length.jsonl")))  # fmt: skip
    assert "reward_hacking" in fired and not (fired & SYMPTOMS) - {"reward_hacking", "truncation"}, shown
    assert "rollout/response_len_mean" in finding(shown, "reward_hacking")["evidence"]
    length = [r["rollout/response_len_mean"] for r in read_metrics(tmp_path / "out")]
    # The rule asks 1.5×; the run must show it with room to spare, or it is one unlucky start from silence.
    assert sum(length[-5:]) >= 2.5 * sum(length[:5]), length


def test_prompts_solved_always_or_never_show_unbalanced_groups(
    tmp_path: Path, redis_url: str, reward: RewardService
) -> None:
    """The answer model (right 3 times in 4 at temperature 1, nearly always at 0.1) on four of its problems, and the
    same four with a gold it never writes (a + b + 50), all eight each step: half the groups all right, half all
    wrong. lr 1e-9 and β 0 keep the split to the end (at temperature 0.5 a solvable group was all right only half
    the time: too few all-right groups for the rule). Every group is trained (skip_zero_variance: false), so the zero-variance filter drops
    none and zero_variance stays silent (docs/doctor.md): the split is unbalanced_groups' own evidence."""
    half = PROBLEMS[:4]
    rows = [{"id": f"p{a}{b}", "prompt": prompt(a, b), "gold": str(a + b)} for a, b in half] + [
        {"id": f"n{a}{b}", "prompt": prompt(a, b), "gold": str(a + b + 50)} for a, b in half
    ]
    fired, shown = train(tmp_path, "split", redis_url, reward, model=str(answer_model_path(cache_root() / "test-models")),
                         train_data=str(write_rows(tmp_path / "split.jsonl", rows)), prompts_per_step=8,
                         temperature=0.1, max_new_tokens=24, stop=[], overlong_soft_penalty=False,
                         reward_weights={"math": 1.0}, lr=1e-9, skip_zero_variance=False)  # fmt: skip
    assert "unbalanced_groups" in fired and not (fired & SYMPTOMS) - {"unbalanced_groups"}, shown
    assert "groups/all_solved_fraction" in finding(shown, "unbalanced_groups")["evidence"]
    # Every group trained, none dropped: a flat reward with nothing dropped is not zero_variance's symptom.
    metrics = read_metrics(tmp_path / "out")
    assert {r["groups/zero_variance_fraction"] for r in metrics} == {0.0}
    assert all(r["groups/train"] == 8 for r in metrics)


def test_large_steps_over_several_epochs_show_clip_ratio(tmp_path: Path, redis_url: str, reward: RewardService) -> None:
    """lr 3e-3 (300× the tests' usual) and four PPO epochs over each batch: every epoch after the first starts from
    a policy the one before moved far, so a third or more of its tokens leave the clip range. (At lr 1e-2 the policy
    collapses within a few steps to completions of one reward: no advantage left, nothing clipped after.)"""
    fired, shown = train(tmp_path, "clip", redis_url, reward, lr=3e-3, ppo_epochs=4, skip_zero_variance=False)
    assert "clip_ratio" in fired and not (fired & SYMPTOMS) - {"clip_ratio"}, shown
    f = finding(shown, "clip_ratio")
    assert f["evidence"].startswith(("train/clip_frac ", "train/ratio_max ")) and "ppo_epochs" in f["settings"], f


# A replica the trainer's weight pushes never reach that generates anyway: its weights token is not the trainer's
# (every UpdateWeights is refused), and it takes tasks published under weights it lacks (wait_for_task_weights off;
# on, it would wait for a push that never comes). It serves the starting model the whole run.
PUSHES_MISS = {"GRPO_ROLLOUT_WEIGHTS_TOKEN": "not-the-trainers", "GRPO_ROLLOUT_WAIT_FOR_TASK_WEIGHTS": "false"}


def test_a_replica_the_weight_pushes_miss_shows_stale_drops(
    tmp_path: Path, redis_url: str, reward: RewardService
) -> None:
    """Two replicas, one of them missed by every weight push: its groups come from the starting model, older than
    max_staleness 0 allows, and are dropped as stale; the other's train. (An ordinary async run drops none: the
    trainer publishes at most max_staleness + 1 batches ahead, and a replica takes no task published under weights
    it lacks; 2 replicas, max_staleness 1, 6 prompts a step dropped 0 of 72 groups.) A budget of 48 tokens keeps
    completions uncut (16 cut a tenth of them: truncation's symptom); every group is trained (none zero-variance)."""
    fired, shown = train(tmp_path, "stale", redis_url, reward, replica_envs=({}, PUSHES_MISS), max_new_tokens=48,
                         skip_zero_variance=False)  # fmt: skip
    assert "stale_drops" in fired and not (fired & SYMPTOMS) - {"stale_drops"}, shown
    f = finding(shown, "stale_drops")
    assert f["evidence"].startswith("groups/stale ") and "max_staleness" in f["settings"], f
    assert "push/failed" in f["evidence"] and f["remedy"].startswith("first make the weight pushes land"), f
    rows = read_metrics(tmp_path / "out")
    # The cause, in the run's own rows: pushes failed; and the replica the pushes reach kept the run training.
    assert sum(r.get("push/failed", 0) for r in rows) > 0 and sum(r["groups/train"] for r in rows) > 0, rows


def test_a_sampler_on_other_weights_shows_logprob_mismatch(
    tmp_path: Path, redis_url: str, reward: RewardService
) -> None:
    """The one replica is missed by every weight push, and max_staleness 16 lets its groups train: the trainer's
    log-probs (the policy it updated, lr 1e-2) drift from the sampler's (the starting model), and the TIS weights
    (tis_cap 2) show it: their mean 0.59–0.78 and a tenth to a sixth of the tokens at the cap by the last steps
    (the rule: 0.9, 5 %). The reward pays a
    hashed rank within each call (tests/support/doctor_runs.py): every update moves the policy, none towards a
    higher reward, so reward_hacking stays silent.

    A bf16 sampler against the fp32 trainer, the mismatch people usually meet, does not show on these tiny models:
    measured, the TIS weights stayed within 1 ± 0.002 and no token's weight reached even 1.01 (tiny model) or 1.2
    (the answer model): the rule is right to stay silent there, so this run shows it with other weights instead."""
    fired, shown = train(tmp_path, "mismatch", redis_url, reward, replica_envs=(PUSHES_MISS,), max_staleness=16,
                         tis_cap=2.0, lr=1e-2, max_new_tokens=48, overlong_soft_penalty=False, skip_zero_variance=False,
                         reward_weights={"rank": 1.0, "math": 0.0},
                         train_data=str(length_data(tmp_path / "rank.jsonl", plugin="rank")))  # fmt: skip
    assert "logprob_mismatch" in fired and not (fired & SYMPTOMS) - {"logprob_mismatch"}, shown
    f = finding(shown, "logprob_mismatch")
    assert f["evidence"].startswith(("train/tis_weight_mean ", "train/tis_truncated_frac ")), f
    assert "push/failed" in f["remedy"] and "rollout.dtype" in f["settings"], f
    # The groups lag the policy (the trainer knows their version): said, as the cause beside a precision mismatch.
    assert "staleness/mean" in f["evidence"] and "older weights" in f["symptom"], f
    rows = read_metrics(tmp_path / "out")
    assert all(r["groups/stale"] == 0 for r in rows)  # every group trained: the drift is not dropped as stale
