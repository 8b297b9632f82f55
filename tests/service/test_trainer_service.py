"""The trainer as a real process over a real Redis, reward service and rollout replica, with the tiny model.

Rewards come from DAPO's soft overlong penalty on completions cut by common stop strings: an untrained
tiny model never solves a problem, but its completion lengths (hence rewards) vary inside a group, so
every step has a learning signal.

One file past 500 lines on purpose: its tests share module fixtures (a reward service, Redis, the tiny model)
that cost a start-up each, and pytest-xdist keeps a file on one worker.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from grpo.common.queue import GROUPS_GROUP, stream_keys
from grpo.common.registry import ReplicaRegistry
from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.weights.codec import weights_checksum
from grpo.trainer.accounting import DROP_REASONS
from grpo.trainer.ledger import read_ledger
from grpo.trainer.order import DataCursor, take
from grpo.v1 import queue_pb2, trainer_pb2, trainer_pb2_grpc
from tests.support.rollout_proc import start_rollout_service, update_bytes
from tests.support.trainer_proc import (
    ROLLOUT_ENV,
    colocated,
    read_metrics,
    run_failing_trainer,
    run_trainer,
    start_trainer,
    trainer_config,
    wait_for,
    write_data,
    write_rows,
)

pytestmark = pytest.mark.slow


def load_weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_grpo_steps_update_push_and_log(tmp_path: Path, redis_url: str, rollout_for: Any) -> None:
    rollout = rollout_for("svc")
    eval_data = write_data(tmp_path / "eval.jsonl", 2, offset=100)
    config = trainer_config(
        tmp_path, "svc", redis_url, steps=3, checkpoint_every=2, eval_data=str(eval_data), eval_every=2
    )
    log = tmp_path / "trainer.log"
    run_trainer(config, log)
    out = tmp_path / "out"
    # parameters changed
    before, after = load_weights(ensure_tiny_model()), load_weights(out / "final")
    changed = [name for name in before if not before[name].equal(after[name])]
    assert len(changed) == len(before), f"unchanged tensors: {sorted(set(before) - set(changed))[:5]}"
    # the replica reports the trained weights
    from grpo.trainer.pusher import replica_status

    status = replica_status(rollout.address)
    rows = read_metrics(out)
    # step 0 is the baseline eval before the first update (eval_before_train), then one row per step
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "train/loss" not in rows[0]
    updates = sum("train/loss" in r for r in rows)
    assert updates >= 2, rows
    assert status.weight_version == rows[-1]["policy_version"] == 1 + updates  # the initial push, then one per update
    assert status.weight_checksum == weights_checksum(after)
    # The trainer found the replica's weights data port in the registry and sent every update's bytes there.
    assert update_bytes(rollout, "data_port") > 0 and update_bytes(rollout, "stream") == 0
    # metrics
    trained_row = next(r for r in reversed(rows) if "train/loss" in r)
    for key in ("rollout/reward_mean", "rollout/reward_std", "rollout/reward/overlong_mean", "rollout/response_len_mean",
                "rollout/response_len_max", "rollout/truncation_rate", "groups/zero_variance_fraction",
                "staleness/mean", "train/tokens_per_s", "time/wait_rollouts_s", "train/train_s", "time/push_s",
                "tasks/balanced", "train/clip_frac"):  # fmt: skip
        assert key in trained_row, f"{key} missing from {sorted(trained_row)}"
    assert all(r["tasks/balanced"] == 1.0 for r in rows[1:])
    assert rows[-1]["tasks/published"] == rows[-1]["tasks/trained"] + sum(
        rows[-1][f"tasks/dropped/{k}"] for k in ("zero_variance", "stale", "failed", "unscored", "timeout")
    )
    assert rows[-1]["staleness/max"] == 0  # max_staleness 0: strictly on-policy
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    # evaluation through the queue: before training, at step 2 (eval_every) and at the end
    evals = [r for r in rows if "eval/completed" in r]
    assert [r["step"] for r in evals] == [0, 2, 3] and all(r["eval/completed"] == 2 for r in evals)
    assert all(0.0 <= r["eval/accuracy"] <= 1.0 for r in evals)
    assert (out / "checkpoints" / "step-00000003" / "trainer_state.json").is_file()
    assert_run_report(out, "svc", rows)


def assert_run_report(out: Path, run_id: str, rows: list[dict[str, Any]]) -> None:
    """A run without stages ends with the report a staged run writes (issue 34: it wrote none): summary.json in the
    same format (the run as its one stage), report.md and the plots it names."""
    from grpo.trainer.report import summarize

    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {*summarize([], eval_before=None, wall_seconds=0), "run_id", "stages"}, sorted(summary)
    assert summary["run_id"] == run_id and summary["grpo_steps"] == rows[-1]["step"]
    first, last = (r for r in rows if "eval/accuracy" in r and r["step"] in (0, rows[-1]["step"]))
    assert summary["eval_accuracy_before"] == first["eval/accuracy"] and summary["eval_before_judged"] is not None
    assert summary["eval_history"][-1]["accuracy"] == last["eval/accuracy"]
    (stage,) = summary["stages"]
    assert (stage["mode"], stage["steps"], stage["folder"]) == ("grpo", rows[-1]["step"], str(out))
    report = (out / "report.md").read_text()
    assert report.startswith(f"# GRPO report — {run_id}\n"), report[:200]
    plots = re.findall(r"!\[\w+\]\((\w+\.png)\)", report)
    assert {"reward.png", "accuracy.png"} <= set(plots) and all((out / p).is_file() for p in plots), plots


def test_a_run_whose_every_group_fails_exits_1_naming_why_and_writes_no_final_model(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """Checks the reward service refuses (a math extraction target it does not know): every task comes back failed.
    The run used to log only "every group was dropped; no update", exit 0 and write final/ holding the starting
    model."""
    rollout_for("refused")
    rows = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "checks": {"math": {"gold": str(2 * i),
             "extraction": ["words"]}}} for i in range(8)]  # fmt: skip
    data = write_rows(tmp_path / "refused.jsonl", rows)
    config = trainer_config(tmp_path, "refused", redis_url, steps=20, max_failed_steps=2, train_data=str(data),
                            reward_weights={"math": 1.0}, overlong_soft_penalty=False)  # fmt: skip
    text = run_failing_trainer(config, tmp_path / "trainer.log")
    step0 = next(line for line in text.splitlines() if "step 0: " in line and "failed" in line)  # each step says why
    assert "step 0: 3 of 3 group(s) failed: 3× " in step0 and "extraction" in step0, step0
    assert "the run failed: every group failed for 2 steps in a row, so nothing was trained; the rollout " \
           "reported: 6× " in text  # fmt: skip
    assert not (tmp_path / "out" / "final").exists()


def test_a_prompt_too_long_for_the_context_is_refused_or_left_out(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """A prompt whose tokens and max_new_tokens overflow the model's context fails on every epoch (and an evaluation
    counts it as failed, not wrong): refused at start-up naming its line (exit 2), or left out with
    `overlong_prompts: drop`."""
    rollout_for("long")
    rows = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "gold": str(2 * i)} for i in range(6)]
    rows.insert(3, {"id": "long", "prompt": "What is " + " + ".join(["1"] * 300) + "?", "gold": "300"})
    data = write_rows(tmp_path / "long.jsonl", rows)
    config = trainer_config(tmp_path, "long", redis_url, steps=1, train_data=str(data), eval_before_train=False)
    assert start_trainer(config, tmp_path / "trainer.log").wait(timeout=120) == 2  # refused at start-up, as a setting
    text = (tmp_path / "trainer.log").read_text()
    assert "grpo-trainer: invalid data: " in text and "Traceback" not in text, text[-3000:]
    assert re.search(rf"1 of 7 prompts \(the first: {re.escape(str(data))} line 4, \d+ tokens\) leave no room for "
                     r"max_new_tokens 16 in the model's context of 512 tokens", text), text[-3000:]  # fmt: skip
    assert "overlong_prompts: drop" in text
    config = trainer_config(tmp_path, "long", redis_url, steps=1, train_data=str(data), eval_before_train=False,
                            overlong_prompts="drop")  # fmt: skip
    proc = start_trainer(config, tmp_path / "trainer2.log")
    code = proc.wait(timeout=120)
    text = (tmp_path / "trainer2.log").read_text()
    assert "1 of 7 prompts" in text and "left out (overlong_prompts: drop)" in text
    assert "step 0:" in text or "step=1" in text or (tmp_path / "out" / "final").is_dir(), text[-3000:]  # it ran
    assert "invalid task" not in text  # the rollout never saw it
    # One step of the random tiny model may train nothing (every group one reward): that is the only failure.
    assert code == 0 or (code == 1 and "trained on no group" in text), text[-3000:]


def test_a_run_that_trained_on_no_group_fails_naming_why(tmp_path: Path, redis_url: str, rollout_for: Any) -> None:
    """Every group the same reward (the random tiny model never writes the format): each step is "no update". The
    run used to exit 0 and write final/ holding the starting weights, a "finished" run that learned nothing."""
    rollout_for("flat")
    rows = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "checks": {"format": {}}} for i in range(8)]
    data = write_rows(tmp_path / "flat.jsonl", rows)
    config = trainer_config(tmp_path, "flat", redis_url, steps=2, train_data=str(data), reward_weights={"format": 1.0},
                            overlong_soft_penalty=False)  # fmt: skip
    text = run_failing_trainer(config, tmp_path / "trainer.log")
    assert "step 0: every group was dropped (zero_variance 3); no update" in text, text[-4000:]
    assert "2 steps trained on no group (tasks dropped: zero_variance 6): every sample of a group got the same " \
           "reward" in text  # fmt: skip
    assert not (tmp_path / "out" / "final").exists()


def test_groups_the_reward_service_cannot_judge_are_dropped_naming_its_reason(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """A data set whose golds are malformed (`\\frac{1}{2`): no sample gets a reward, so every group is dropped as
    unscored, never trained on a guess. Each step's log, and the run's failure at the end, say why in the reward
    service's words; they used to say only "unscored 6"."""
    rollout_for("unjudged")
    rows = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "gold": f"\\frac{{{i}}}{{2"} for i in range(8)]
    data = write_rows(tmp_path / "unjudged.jsonl", rows)
    config = trainer_config(tmp_path, "unjudged", redis_url, steps=2, train_data=str(data),
                            reward_weights={"math": 1.0}, overlong_soft_penalty=False)  # fmt: skip
    text = run_failing_trainer(config, tmp_path / "trainer.log")
    step0 = next(line for line in text.splitlines() if "step 0: " in line and "unscored" in line)
    assert "step 0: 3 of 3 group(s) unscored, a sample had no reward" in step0, step0
    assert "math: unparseable_gold" in step0 and "is malformed: 1 unclosed '{'" in step0, step0
    assert "2 steps trained on no group (tasks dropped: unscored 6): the reward service could not judge the " \
           "samples (1× \"cannot judge: math: unparseable_gold (gold '\\\\frac{" in text, text[-4000:]  # fmt: skip
    assert not (tmp_path / "out" / "final").exists()


def test_max_new_tokens_over_a_replicas_cap_is_refused_before_the_first_step(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """Replicas say their max_new_tokens cap in the registry: a run asking for more fails at start-up, naming the
    replica and both numbers (it took `max_failed_steps` steps of failed groups to find out)."""
    rollout_for("cap", "--max-new-tokens-cap", "8")
    config = trainer_config(tmp_path, "cap", redis_url, steps=20, max_new_tokens=16)
    text = run_failing_trainer(config, tmp_path / "trainer.log", timeout=120)
    assert "max_new_tokens 16 is over what rollout replica(s) cap-r1 (cap 8) generate" in text, text[-4000:]
    assert "step 0:" not in text  # before any task was published
    assert not (tmp_path / "out" / "final").exists()
    (said,) = ReplicaRegistry(redis.Redis.from_url(redis_url), "cap").live_replicas()  # what the trainer read
    assert (said.max_new_tokens_cap, said.max_context) == (8, 512)  # the tiny model's context, from the engine


def test_a_final_evaluation_lost_with_the_trainer_is_redone_on_restart(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """Killed after the last step's checkpoint, in the final evaluation: the disk holds that checkpoint, no row for
    the last step and no final/. The restart evaluates the checkpoint's weights on the replicas, logs the row,
    then writes final/ (before, it wrote final/ and the run's after-accuracy was silently missing)."""
    rollout = rollout_for("lost-eval")
    eval_data = write_data(tmp_path / "eval.jsonl", 2, offset=100)
    config = trainer_config(tmp_path, "lost-eval", redis_url, steps=2, checkpoint_every=1, eval_data=str(eval_data),
                            eval_before_train=False)  # fmt: skip
    run_trainer(config, tmp_path / "trainer.log")
    out = tmp_path / "out"
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and "eval/accuracy" in rows[-1]
    last = load_weights(out / "checkpoints" / "step-00000002" / "model")
    shutil.rmtree(out / "final")  # the disk as the kill left it
    (out / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")

    run_trainer(config, tmp_path / "trainer-2.log")
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["eval/completed"] == 2 and 0.0 <= rows[-1]["eval/accuracy"] <= 1.0
    final = load_weights(out / "final")
    assert all(final[name].equal(last[name]) for name in last)  # final/ is the evaluated checkpoint
    from grpo.trainer.pusher import replica_status

    assert replica_status(rollout.address).weight_checksum == weights_checksum(final)  # evaluated on these weights
    assert "evaluating its checkpoint again" in (tmp_path / "trainer-2.log").read_text()


def test_evaluation_waits_for_the_evaluated_weights(tmp_path: Path, redis_url: str, rollout_for: Any) -> None:
    """A replica on other weights (restarted onto the model from disk, or not pushed yet) takes no eval task
    published under weights it lacks: nothing it makes is reported as policy version 1's accuracy. The waiting
    evaluation has the trainer push (sync_replicas), and the replica answers with version 1."""
    from grpo.common.queue import RunQueue
    from grpo.trainer.consumer import GroupReader
    from grpo.trainer.data import load_rows
    from grpo.trainer.evaluation import evaluate
    from grpo.trainer.publisher import TaskSpec
    from grpo.trainer.pusher import ReplicaTarget, push_to_replicas, replica_status

    rollout = rollout_for("ev")  # fresh: weight version 0
    queue = RunQueue(redis.Redis.from_url(redis_url), "ev")
    queue.ensure_groups()
    rows = load_rows(write_data(tmp_path / "eval.jsonl", 3))
    spec = TaskSpec(group_size=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8, stop=("e",),
                    reward_weights=(("math", 1.0),), apply_chat_template=False)  # fmt: skip
    pushes: list[int] = []
    calls = 0

    def push() -> None:  # what the trainer's _sync_replicas does for a replica that lacks the version
        nonlocal calls
        calls += 1
        if calls >= 3 and replica_status(rollout.address).weight_version < 1:  # after ~1 s of waiting
            tensors = load_weights(ensure_tiny_model())
            pushes.append(sum(r.ok for r in push_to_replicas([ReplicaTarget("ev-r1", rollout.address)], tensors, 1)))

    metrics = evaluate(
        GroupReader(queue, "trainer"), rows, spec, run_id="ev", round_id="0", policy_version=1, temperature=0.0,
        timeout_s=120, sync_replicas=push,
    )  # fmt: skip
    assert pushes == [1], pushes  # the waiting evaluation pushed once
    assert metrics["eval/wrong_weights"] == 0  # nothing was made with version 0's weights
    assert (metrics["eval/completed"], metrics["eval/missing"], metrics["eval/failed"]) == (3, 0, 0)
    assert replica_status(rollout.address).weight_version == 1
    assert "taking tasks again" in rollout.log_text()  # the replica said it waited, and for what


def test_a_replica_restarted_mid_run_gets_the_weights_before_a_task(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """SIGKILLed and started again under its id, one step off-policy: the new process holds the model from disk.
    It used to make a step or two of groups with it, all dropped as stale (their prompts never trained, steps with
    no update), while the trainer kept the old process's confirmation. Now it takes no task published under
    weights it lacks, and the trainer pushes to the new incarnation while it waits for groups."""
    first = rollout_for("rs")
    config = trainer_config(tmp_path, "rs", redis_url, steps=10, max_staleness=1)
    log = tmp_path / "trainer.log"
    proc = start_trainer(config, log)
    out = tmp_path / "out"
    try:
        wait_for(lambda: any(r["step"] >= 3 for r in read_metrics(out)), 120, "step 3", proc, log)
        first.proc.kill()
        first.proc.wait()
        second = rollout_for("rs")
        assert proc.wait(timeout=240) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert rows[-1]["tasks/dropped/stale"] == 0 and all(r["groups/stale"] == 0 for r in rows), [
        (r["step"], r["groups/stale"]) for r in rows]  # fmt: skip
    assert rows[-1]["tasks/balanced"] == 1.0
    from grpo.trainer.pusher import replica_status

    assert replica_status(second.address).weight_version == rows[-1]["policy_version"]  # the new one was pushed to


def test_status_api_checkpoint_and_sigterm(tmp_path: Path, redis_url: str, rollout_for: Any) -> None:
    rollout_for("api")
    config = trainer_config(tmp_path, "api", redis_url, steps=1000, checkpoint_every=1000)
    settings = json.loads(config.read_text())
    log = tmp_path / "trainer.log"
    proc = start_trainer(config, log)
    try:
        import httpx

        base = f"http://127.0.0.1:{settings['http_port']}"

        def step_done() -> bool:
            try:
                return httpx.get(f"{base}/v1/status", timeout=2).json()["step"] >= 1
            except httpx.HTTPError:
                return False

        wait_for(step_done, 120, "the first step", proc, log)
        assert httpx.get(f"{base}/healthz", timeout=2).json()["status"] == "ok"
        assert "grpo_trainer_tasks_published" in httpx.get(f"{base}/metrics", timeout=2).text
        with grpc.insecure_channel(f"127.0.0.1:{settings['grpc_port']}") as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            status = stub.GetRunStatus(trainer_pb2.GetRunStatusRequest(), timeout=5)
            assert status.run_id == "api" and status.phase in ("grpo", "eval") and status.total_steps == 1000
            assert status.replicas and status.replicas[0].replica_id == "api-r1"
            saved = stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(), timeout=60)
            assert Path(saved.path, "trainer_state.json").is_file() and saved.step >= 1
        proc.send_signal(signal.SIGTERM)  # finish the step, checkpoint, exit 0
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "the run failed" not in text and "finishing the current step" in text
    last = max((tmp_path / "out" / "checkpoints").glob("step-*"))
    last_step = json.loads((last / "trainer_state.json").read_text())["step"]
    assert last_step == read_metrics(tmp_path / "out")[-1]["step"]  # the final checkpoint is the last step


def test_the_status_keeps_the_last_evaluation_between_evaluations(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """Issue 34: `metrics` is the last step's, so held-out accuracy was there only on evaluation steps, and a monitor
    polling every 5 s never saw it. `last_eval` holds the latest finished evaluation (its step and eval/* metrics),
    over HTTP and gRPC alike."""
    import httpx

    rollout_for("lasteval")
    eval_data = write_data(tmp_path / "eval.jsonl", 4, offset=100)
    config = trainer_config(tmp_path, "lasteval", redis_url, steps=8, eval_data=str(eval_data), eval_every=3)
    settings = json.loads(config.read_text())
    log = tmp_path / "trainer.log"
    seen: list[tuple[str, int, str, int | None, dict[str, float] | None]] = []  # (api, step, phase, last_eval)
    proc = start_trainer(config, log)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{settings['grpc_port']}") as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            while proc.poll() is None:
                try:
                    http = httpx.get(f"http://127.0.0.1:{settings['http_port']}/v1/status", timeout=2).json()
                    rpc = stub.GetRunStatus(trainer_pb2.GetRunStatusRequest(), timeout=2)
                except (httpx.HTTPError, grpc.RpcError):
                    time.sleep(0.05)
                    continue
                last = http["last_eval"] or {}
                seen.append(("http", http["step"], http["phase"], last.get("step"), last.get("metrics")))
                if rpc.HasField("last_eval"):
                    seen.append(("grpc", rpc.step, rpc.phase, rpc.last_eval.step, dict(rpc.last_eval.metrics)))
                else:
                    seen.append(("grpc", rpc.step, rpc.phase, None, None))
                time.sleep(0.05)
        assert proc.wait(timeout=120) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    between = [s for s in seen if s[2] == "grpo" and s[1] % 3 and s[1] < 8]  # steps that did not evaluate
    assert {api for api, *_ in between} == {"http", "grpc"}, seen
    for api, step, _, eval_step, metrics in between:
        assert eval_step == 3 * (step // 3), (api, step, eval_step)  # step 0: the baseline before the first update
        assert metrics is not None and 0.0 <= metrics["eval/accuracy"] <= 1.0, (api, step, metrics)
        assert metrics["eval/judged"] + metrics["eval/unjudged"] + metrics["eval/failed"] + metrics["eval/missing"] == 4
        assert all(k.startswith("eval/") for k in metrics), metrics
    logged = {r["step"]: r["eval/accuracy"] for r in read_metrics(tmp_path / "out") if "eval/accuracy" in r}
    assert all(
        metrics is not None and metrics["eval/accuracy"] == logged[eval_step] for *_, eval_step, metrics in between
    )


def test_the_status_lists_the_replicas_before_the_first_step(tmp_path: Path, redis_url: str, rollout_for: Any) -> None:
    """/v1/status lists the replicas once the trainer has found them, not only from its first step on: a monitor
    reading it during the baseline evaluation (or just after a restart, which compose's test does) saw none."""
    import httpx

    rollout_for("early")
    eval_data = write_data(tmp_path / "eval.jsonl", 96, offset=100)  # a baseline long enough to be seen
    config = trainer_config(tmp_path, "early", redis_url, steps=1, eval_data=str(eval_data), eval_every=100,
                            skip_zero_variance=False)  # fmt: skip
    settings = json.loads(config.read_text())
    log = tmp_path / "trainer.log"
    baseline: list[int] = []  # replicas listed by each status read during the step-0 evaluation
    proc = start_trainer(config, log)
    try:
        while proc.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{settings['http_port']}/v1/status", timeout=2).json()
            except httpx.HTTPError:
                status = {}
            if status.get("phase") == "eval" and status.get("step") == 0:
                baseline.append(len(status["replicas"]))
            time.sleep(0.02)
        assert proc.wait(timeout=120) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert baseline and set(baseline) == {1}, baseline


def stream_group_ids(redis_url: str, run: str) -> list[str]:
    client = redis.Redis.from_url(redis_url)
    _, groups_key = stream_keys(run)
    ids = [queue_pb2.GroupRecord.FromString(f[b"data"]).group_id for _, f in client.xrange(groups_key)]
    pending = client.xpending(groups_key, GROUPS_GROUP)["pending"]
    client.close()
    assert pending == 0, f"{pending} group(s) still unacked after the run"
    return ids


def lost_lineage_group(redis_url: str, run: str, out: Path, last_step: int) -> bool:
    """True when the groups stream holds a group made by weights newer than the latest checkpoint's."""
    checkpoints = sorted((out / "checkpoints").glob("step-*/trainer_state.json"))
    if not checkpoints:
        return False
    state = json.loads(checkpoints[-1].read_text())
    if state["step"] >= last_step:
        raise AssertionError("the run ended before a group of a lineage to lose appeared in Redis")
    client = redis.Redis.from_url(redis_url)
    _, groups_key = stream_keys(run)
    versions = [queue_pb2.GroupRecord.FromString(f[b"data"]).weight_version for _, f in client.xrange(groups_key)]
    client.close()
    return any(v > state["learner"]["version"] for v in versions)


@pytest.mark.parametrize("mode", ["separate", "colocated"])
def test_resume_after_sigkill_loses_nothing(
    tmp_path: Path, redis_url: str, rollout_for: Any, live_reward: Any, mode: str
) -> None:
    """One step off-policy, so groups made by the lost lineage's weights are in Redis when the trainer returns.
    Colocated (grpo.trainer.colocated), the SIGKILL takes the replica too, with the tasks it held."""
    extra = {"colocate": colocated(live_reward.grpc_addr)} if mode == "colocated" else {}
    if mode == "separate":
        rollout_for("resume")
    steps, per_step = 12, 3
    config = trainer_config(tmp_path, "resume", redis_url, steps=steps, checkpoint_every=4, max_staleness=1, **extra)
    out = tmp_path / "out"
    log = tmp_path / "trainer.log"
    proc = start_trainer(config, log)
    try:
        # Kill once a checkpoint exists and Redis holds a group made by weights pushed after it (the lineage the
        # resume discards). Steps take ~0.1 s here, so poll fast; every checkpoint opens a new window.
        deadline = time.monotonic() + 150
        while not lost_lineage_group(redis_url, "resume", out, steps):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc = start_trainer(config, log, "--resume", "auto")
        assert proc.wait(timeout=150) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    state = json.loads((out / "checkpoints" / f"step-{steps:08d}" / "trainer_state.json").read_text())["inflight"]
    assert state["in_flight"] == []
    trained, dropped = state["trained"], sum(state["dropped"].values())
    assert state["published"] == trained + dropped
    assert trained + dropped == steps * per_step  # every step's tasks, once (no refills in this preset)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step of the surviving lineage, once
    assert rows[-1]["tasks/balanced"] == 1.0
    # The lost lineage costs no steps: its groups are superseded (their tasks regenerated), never dropped as
    # stale; only zero-variance groups are dropped, so a step without an update had only those.
    assert set(state["dropped"]) <= {"zero_variance"}, state["dropped"]
    idle = [r for r in rows if "train/loss" not in r]
    assert all(r.get("groups/zero_variance") == per_step for r in idle), idle
    assert sum(r.get("groups/superseded", 0) for r in rows) == state["superseded"] > 0
    # the ledger: each task id of the cursor exactly once, trained or dropped with a reason
    ledger = read_ledger(out / "ledger")
    ids = [e["task_id"] for e in ledger]
    expected, _ = take(DataCursor(seed=0), 16, steps * per_step)  # the cursor's first positions (wraps epochs)
    assert sorted(ids) == sorted(f"resume-{key}" for key, _ in expected), ids
    assert {e["outcome"] for e in ledger} <= {"trained", *DROP_REASONS}
    assert sum(e["outcome"] == "trained" for e in ledger) == trained
    # every group the rollout wrote is for one of those tasks, and the trainer acked them all
    assert set(stream_group_ids(redis_url, "resume")) <= set(ids)
    assert "resumed at step" in log.read_text()


def test_a_group_of_discarded_weights_gets_its_task_regenerated(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """The trainer's collection loop, driven directly against a real replica: a task that was in flight at the
    checkpoint comes back with a group made by the crashed trainer's weights; it is published again and trained
    on the group the restored weights make."""
    from grpo.trainer.config import TrainerSettings
    from grpo.trainer.control import RunControl
    from grpo.trainer.publisher import task_id
    from grpo.trainer.pusher import replica_status
    from grpo.trainer.run import GrpoRun

    rollout = rollout_for("regen")
    config = json.loads(trainer_config(tmp_path, "regen", redis_url, prompts_per_step=1).read_text())
    run = GrpoRun(TrainerSettings(**config, skip_zero_variance=False), RunControl())
    try:
        tid = task_id("regen", take(DataCursor(seed=0), 16, 1)[0][0][0])
        # The books as restored from a checkpoint at version 4, the replica holding the crashed lineage's 6.
        run.acct.publish(tid, 4, 0, time.monotonic())
        run.acct.batches_published = 1
        run.acct.version_aliases.append((4, 9))
        run.learner.set_version(9)
        late = queue_pb2.GroupRecord(group_id=tid, task_id=tid, policy_version=4, weight_version=6, status="ok")
        late.samples.add().reward = 1.0
        run.queue.client.xadd(run.queue.groups_key, {"data": late.SerializeToString()})  # as a replica writes it
        deadline = time.monotonic() + 60
        while not run._live():  # registered (its first heartbeat) before the push, or the push has no target
            assert time.monotonic() < deadline, "the replica never registered"
            time.sleep(0.2)
        run._sync_replicas()  # the replica now holds the restored weights as version 9
        assert list(run.confirmed.values()) == [9], run.confirmed
        kept, metrics = run._collect()
    finally:
        run.close()
    assert kept is not None and [r.group_id for _, r in kept] == [tid]
    assert kept[0][1].weight_version == 9 and kept[0][1].policy_version == 9  # made by the restored weights
    assert metrics["groups/regenerate"] == 1 and run.acct.superseded == 1
    assert run.acct.in_flight[tid].regenerations == 1 and run.acct.published == 1
    assert replica_status(rollout.address).weight_version == 9


def test_after_a_full_restart_the_next_version_is_above_every_version_ever_pushed(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """Trainer and replicas restarted together (a node lost, `docker compose up` after a crash): the replicas
    report 0, and numbering from them and the checkpoint alone reused the lost lineage's first version, whose
    groups then trained as on-policy. The output dir remembers the highest version pushed."""
    from grpo.trainer.config import TrainerSettings
    from grpo.trainer.control import RunControl
    from grpo.trainer.pusher import highest_pushed, record_pushed, replica_status
    from grpo.trainer.run import GrpoRun

    rollout = rollout_for("restart")
    config = json.loads(trainer_config(tmp_path, "restart", redis_url, prompts_per_step=1).read_text())
    settings = TrainerSettings(**config)
    record_pushed(settings.output_dir, 6)  # the crashed trainer pushed 6 after its checkpoint at 5
    run = GrpoRun(settings, RunControl())
    try:
        run.learner.set_version(5)  # the books as restored from that checkpoint
        run.resumed_version = 5
        assert replica_status(rollout.address).weight_version == 0  # restarted too
        run._start_replicas()
    finally:
        run.close()
    assert run.version == 7 and run.acct.version_aliases == [(5, 7)]  # 6 belongs to the lost lineage
    assert replica_status(rollout.address).weight_version == 7 and highest_pushed(settings.output_dir) == 7


def test_dapo_dynamic_sampling_one_step_off_policy(tmp_path: Path, redis_url: str, rollout_for: Any) -> None:
    rollout_for("dapo")
    # Zero variance judged on the reward (the overlong penalty varies): on accuracy, DAPO's own basis, the random
    # tiny model's groups are all wrong, every one dropped, and a run that trains on no group fails.
    config = trainer_config(tmp_path, "dapo", redis_url, steps=4, preset="dapo", max_staleness=1, max_refill_per_step=3,
                            zero_variance_on="reward")  # fmt: skip
    log = tmp_path / "trainer.log"
    run_trainer(config, log)
    rows = read_metrics(tmp_path / "out")
    last = rows[-1]
    refills = sum(r["groups/refills"] for r in rows)
    assert last["tasks/published"] == 4 * 3 + refills  # every refill is a published, accounted task
    assert last["tasks/in_flight"] == 0 and last["tasks/balanced"] == 1.0
    assert all(r.get("staleness/max", 0) <= 1 for r in rows)  # max_staleness 1 enforced
    assert "train/kl_loss" not in last or last["train/kl_loss"] == 0.0  # DAPO: no KL term


@pytest.mark.deepspeed
def test_zero2_two_ranks_rank0_drives(tmp_path: Path, redis_url: str, rollout_for: Any) -> None:
    """torchrun with 2 ranks: rank 0 runs the loop, rank 1 follows every update, gather and checkpoint."""
    rollout = rollout_for("zero")
    config = trainer_config(tmp_path, "zero", redis_url, steps=2, checkpoint_every=1, backend="deepspeed",
                            zero_stage=2, push_timeout_s=60)  # fmt: skip
    log = tmp_path / "trainer.log"
    run_trainer(config, log, 540, ranks=2)
    out_dir = tmp_path / "out"
    rows = read_metrics(out_dir)
    assert [r["step"] for r in rows] == [1, 2]  # one metrics writer: rank 0
    from grpo.trainer.pusher import replica_status

    assert replica_status(rollout.address).weight_version == rows[-1]["policy_version"]
    assert (out_dir / "checkpoints" / "step-00000002" / "trainer_state.json").is_file()
    assert (out_dir / "final" / "model.safetensors").is_file()
    assert "rank 1 following rank 0" in log.read_text()


@pytest.mark.faults
def test_redis_outage_is_ridden_out(tmp_path: Path, live_reward: Any) -> None:
    """Redis (with its append-only file) is killed mid-run and restarted: the run finishes, the books balance."""
    from grpo.local.redis_server import RedisServer

    (tmp_path / "redis").mkdir()
    server = RedisServer(appendonly=True, data_dir=tmp_path / "redis").start()
    rollout = None
    proc = None
    try:
        args = ("--redis-url", server.url, "--reward-addr", live_reward.grpc_addr, "--replica-id", "out-r1",
                "--advertise-host", "127.0.0.1")  # fmt: skip
        rollout = start_rollout_service(*args, log_dir=tmp_path, env={**ROLLOUT_ENV, "GRPO_ROLLOUT_RUN": "out"})
        # writes of the last second before the kill may be lost (appendfsync everysec): such tasks time out
        config = trainer_config(tmp_path, "out", server.url, steps=30, checkpoint_every=5, redis_outage_s=60,
                                group_timeout_s=10)  # fmt: skip
        log = tmp_path / "trainer.log"
        proc = start_trainer(config, log)
        wait_for(lambda: len(read_metrics(tmp_path / "out")) >= 2, 120, "two steps", proc, log)
        server.kill()
        time.sleep(3)
        server.start()
        assert proc.wait(timeout=150) == 0, log.read_text()[-4000:]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if rollout is not None:
            rollout.stop()
        server.close()
    rows = read_metrics(tmp_path / "out")
    assert rows[-1]["step"] == 30 and all(r["tasks/balanced"] == 1.0 for r in rows)
    assert rows[-1]["tasks/in_flight"] == 0
    assert "Redis unavailable" in log.read_text()


@pytest.mark.faults
def test_a_trainer_started_before_redis_waits_for_it(tmp_path: Path, live_reward: Any) -> None:
    """A pod starts before Redis answers (or before its name resolves): the trainer waits instead of crashing."""
    from grpo.local.redis_server import RedisServer

    server = RedisServer()  # its port is chosen; nothing listens there yet
    rollout = None
    config = trainer_config(tmp_path, "late", server.url, steps=2, redis_outage_s=60)
    log = tmp_path / "trainer.log"
    proc = start_trainer(config, log)
    try:
        wait_for(lambda: "Redis unavailable" in log.read_text(), 120, "the trainer to wait for Redis", proc, log)
        server.start()
        args = ("--redis-url", server.url, "--reward-addr", live_reward.grpc_addr, "--replica-id", "late-r1",
                "--advertise-host", "127.0.0.1")  # fmt: skip
        rollout = start_rollout_service(*args, log_dir=tmp_path, env={**ROLLOUT_ENV, "GRPO_ROLLOUT_RUN": "late"})
        assert proc.wait(timeout=150) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        if rollout is not None:
            rollout.stop()
        server.close()
    assert [r["step"] for r in read_metrics(tmp_path / "out")] == [1, 2]


def test_sigterm_while_starting_exits_at_once(tmp_path: Path) -> None:
    """Still starting (here: waiting for Redis), the trainer has nothing to keep: SIGTERM ends it at once, 143."""
    from grpo.local.redis_server import RedisServer

    server = RedisServer()  # its port is chosen; nothing listens there
    log = tmp_path / "trainer.log"
    proc = start_trainer(trainer_config(tmp_path, "early", server.url, steps=2, redis_outage_s=600), log)
    try:
        wait_for(lambda: "Redis unavailable" in log.read_text(), 120, "the trainer to wait for Redis", proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 128 + signal.SIGTERM, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "signal SIGTERM during start-up: exiting" in log.read_text()


# ---- a staged run (R1: SFT, then GRPO) ----------------------------------------------------------


def sft_data(path: Path, n: int) -> Path:
    rows = [{"prompt": f"What is {i} + {i + 1}?", "response": f"<answer>{2 * i + 1}</answer>"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("mode", ["separate", "colocated"])
def test_staged_run_resumes_within_and_between_stages(
    tmp_path: Path, redis_url: str, rollout_for: Any, live_reward: Any, mode: str
) -> None:
    extra = {"colocate": colocated(live_reward.grpc_addr)} if mode == "colocated" else {}
    if mode == "separate":  # colocated: the GRPO stage hosts its replica on the SFT stage's final model
        rollout_for("staged")
    stages = [
        {"mode": "sft", "train_data": str(sft_data(tmp_path / "sft.jsonl", 32)), "steps": 24, "prompts_per_step": 32,
         "micro_batch_size": 8, "lr": 2e-4, "checkpoint_every": 4},
        {"mode": "grpo"},
    ]  # fmt: skip
    eval_data = write_data(tmp_path / "eval.jsonl", 2, offset=100)
    config = trainer_config(tmp_path, "staged", redis_url, steps=6, checkpoint_every=2, stages=stages,
                            eval_data=str(eval_data), eval_every=3, **extra)  # fmt: skip
    out, log = tmp_path / "out", tmp_path / "trainer.log"
    sft_dir, grpo_dir = out / "stage-1-sft", out / "stage-2-grpo"

    proc = start_trainer(config, log)  # killed inside the SFT stage, after its first checkpoint
    try:
        wait_for(lambda: len(read_metrics(sft_dir)) >= 6, 120, "six SFT steps", proc, log)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert not (sft_dir / "stage.json").exists()
        proc = start_trainer(config, log)  # resumes SFT, finishes it, killed inside GRPO
        wait_for(lambda: any(r["step"] >= 3 for r in read_metrics(grpo_dir)), 180, "three GRPO steps", proc, log)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc = start_trainer(config, log)  # skips SFT, resumes GRPO to the end
        assert proc.wait(timeout=180) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()

    text = log.read_text()
    assert text.count("stage 1/2 (sft)") == 2 and "stage 1 (sft) finished earlier" in text
    assert f"model {sft_dir / 'final'}" in text  # GRPO started from the SFT model
    assert text.count("resumed at step") == 2  # once inside each stage
    sft_steps = [r["step"] for r in read_metrics(sft_dir)]
    assert sft_steps[-1] == 24 and set(sft_steps) == set(range(1, 25))
    grpo_rows = read_metrics(grpo_dir)
    assert grpo_rows[0]["step"] == 0 and "eval/accuracy" in grpo_rows[0]  # the baseline before the first update
    assert grpo_rows[-1]["step"] == 6 and grpo_rows[-1]["tasks/balanced"] == 1.0
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["index"], s["mode"]) for s in summary["stages"]] == [(1, "sft"), (2, "grpo")]
    sft, grpo = summary["stages"]
    assert sft["sft_loss_last"] < sft["sft_loss_first"]
    assert grpo["eval_accuracy_before"] is not None and summary["grpo_steps"] == 6
    assert (out / "report.md").is_file() and (out / "reward.png").is_file()
    assert (grpo_dir / "final" / "model.safetensors").is_file()
