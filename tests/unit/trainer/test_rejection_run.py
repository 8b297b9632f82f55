"""The rejection-sampling loop's own parts (grpo.trainer.rejection_run) against a real Redis and the tiny model, with
groups written into the run's stream as a replica writes them: failed and unscored groups counted as prompts with
none kept, the last step publishing only what is left, and the data file cut back to the checkpoint on resume."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.errors import RunError
from grpo.trainer.rejection_run import DataBook, RejectionRun
from grpo.v1 import queue_pb2


def settings(tmp_path: Path, redis_url: str, **extra: object) -> TrainerSettings:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i} + 1?", "gold": str(i + 1)}) + "\n"
                            for i in range(5)))  # fmt: skip
    values = {"mode": "rejection_sampling", "run_id": "rsloop", "redis_url": redis_url,
              "model": str(ensure_tiny_model()), "train_data": data, "output_dir": tmp_path / "out", "rs_samples": 2,
              "prompts_per_step": 2, "rs_keep_per_prompt": 2, "min_replicas": 0, **extra}  # fmt: skip
    return TrainerSettings.model_validate(values)


@pytest.fixture
def make_run(tmp_path: Path, redis_url: str) -> Iterator[Callable[..., RejectionRun]]:
    torch.set_num_threads(1)
    made: list[RejectionRun] = []

    def make(**extra: object) -> RejectionRun:
        s = settings(tmp_path, redis_url, **extra)
        made.append(RejectionRun(s, RunControl(s.run_id, s.steps)))
        return made[-1]

    yield make
    for run in made:
        run.close()


def write_group(run: RejectionRun, tid: str, answers: list[str | None], status: str = "ok") -> None:
    """A group as a replica writes it: each answer scored against its row's gold (None: the check could not judge)."""
    gold = run.publisher.row(tid).checks["math"]["gold"]
    record = queue_pb2.GroupRecord(group_id=tid, task_id=tid, status=status, weight_version=run.version,
                                   policy_version=run.version, replica_id="r1")  # fmt: skip
    if status != "ok":
        record.error = "the reward service refused the task"
    for text in answers:
        sample = record.samples.add()
        sample.completion.text = text or "?"
        sample.completion.token_ids.extend([5, 6])
        sample.components["math"].status = "ok"
        if text is not None:
            sample.components["math"].score = float(text == gold)
            sample.reward = float(text == gold)
    run.queue.client.xadd(run.queue.groups_key, {"data": record.SerializeToString()})


def step(run: RejectionRun, answers: Callable[[str], tuple[list[str | None], str]]) -> dict[str, float]:
    """One step as run() takes it: publish, the replica answers each task, collect, select, (checkpoint)."""
    published = set(run.acct.in_flight)
    run._admit()
    for tid in sorted(set(run.acct.in_flight) - published):
        texts, status = answers(tid)
        write_group(run, tid, texts, status)
    kept, _ = run._collect()
    assert kept is not None
    metrics = run._train(kept)
    run.step += 1
    run.acct.check()
    return metrics


def test_failed_and_unscored_groups_keep_no_rows_and_are_counted(make_run: Callable[..., RejectionRun]) -> None:
    run = make_run()
    assert (run.s.steps, run.prompts, run.s.group_size, run.eval_rows) == (3, 5, 2, [])

    def answers(tid: str) -> tuple[list[str | None], str]:
        gold = run.publisher.row(tid).checks["math"]["gold"]
        index = int(tid.rsplit("-", 1)[1])
        if index == 1:
            return [gold, None], "ok"  # unscored: a sample the verifier could not judge
        if index == 2:
            return [], "failed"
        return [gold, gold], "ok"  # two equal right answers: one kept, one duplicate

    metrics = step(run, answers)
    assert metrics["rs/prompts"] == 2 and metrics["rs/kept"] == 1  # the unscored prompt counts, keeps nothing
    step(run, answers)
    assert run.acct.published == 4
    step(run, answers)  # the last step publishes the one prompt left, not prompts_per_step
    assert run.acct.published == 5 and run.acct.n_in_flight == 0
    assert run.acct.dropped == {"unscored": 1, "failed": 1} and run.acct.trained == 3
    tally = run.book.tally
    assert (tally.prompts, tally.sampled, tally.kept, tally.none_kept) == (5, 10, 3, 2)
    assert tally.rejected == {"duplicate": 3, "group unscored": 2, "group failed": 2}
    names = {run.publisher.row(f"rsloop-e0-{i}").row_id for i in (1, 2)}
    assert set(tally.none_ids) == names
    run._checkpoint()
    run._save_final()
    summary = json.loads((run.s.output_dir / "rs_summary.json").read_text())
    written = [json.loads(line) for line in (run.s.output_dir / "data.jsonl").read_text().splitlines()]
    assert summary["kept"] == len(written) == 3 and summary["prompts_with_none"] == 2
    assert {r["provenance"]["prompt_id"] for r in written}.isdisjoint(names)


def test_a_resume_cuts_the_rows_written_after_the_checkpoint(make_run: Callable[..., RejectionRun]) -> None:
    run = make_run()

    def right(tid: str) -> tuple[list[str | None], str]:
        gold = run.publisher.row(tid).checks["math"]["gold"]
        return [gold, f" {gold} "], "ok"  # equal after stripping: one row per prompt

    step(run, right)
    run._checkpoint()
    at_checkpoint = (run.s.output_dir / "data.jsonl").read_bytes()
    step(run, right)  # consumed after the checkpoint: unacked in Redis, its rows past the checkpoint's length
    assert len((run.s.output_dir / "data.jsonl").read_bytes()) > len(at_checkpoint)
    # The trainer dies here (no close: a crash); a new one resumes from the checkpoint.
    again = make_run()
    assert again.step == 1 and (again.s.output_dir / "data.jsonl").read_bytes() == at_checkpoint
    assert again.book.tally.prompts == 2
    again.reader.recover_pending()  # the groups of step 2, consumed but never acked

    def never(tid: str) -> tuple[list[str | None], str]:
        raise AssertionError(f"{tid}: its group is in Redis already")

    again._admit()  # step 2's tasks again, under the same ids: their groups are the unacked ones
    kept, _ = again._collect()
    assert kept is not None and len(kept) == 2
    again._train(kept)
    lines = (again.s.output_dir / "data.jsonl").read_text().splitlines()
    assert len(lines) == 4 and len({json.loads(line)["id"] for line in lines}) == 4  # each prompt's row once


def test_a_data_file_shorter_than_its_checkpoint_says_is_an_error(tmp_path: Path) -> None:
    book = DataBook(tmp_path)
    book.start_fresh()
    book.append([{"id": "a#0"}, {"id": "b#1"}])
    state = book.state()
    (tmp_path / "data.jsonl").write_text('{"id": "a#0"}\n')  # someone edited it
    with pytest.raises(RunError, match="holds 14 bytes, but the checkpoint being resumed wrote 28"):
        DataBook(tmp_path).restore(state)


def test_a_stage_that_kept_nothing_fails_naming_why(make_run: Callable[..., RejectionRun]) -> None:
    run = make_run(rs_prompts=2)
    step(run, lambda tid: (["wrong", "also wrong"], "ok"))
    with pytest.raises(RunError, match=r"kept none of 4 samples of 2 prompts \(rejected: failed component math 4\)"):
        run._save_final()
    assert not (run.s.output_dir / "rs_summary.json").exists()


def test_rows_without_a_pass_fail_check_are_refused_at_start(
    make_run: Callable[..., RejectionRun], tmp_path: Path
) -> None:
    from grpo.trainer.data import DataError

    with pytest.raises(DataError, match="rs_require names \\['format'\\], which its checks \\['math'\\]"):
        make_run(rs_require=["format"])


def test_the_start_up_check_names_a_missing_plugin_and_a_row_with_nothing_to_pass(
    tmp_path: Path, redis_url: str
) -> None:
    """What `grpo-trainer` checks before anything loads (exit 2, one line): the plug-in imports, every row can pass."""
    from grpo.trainer.data import DataError
    from grpo.trainer.preflight import check_run_data

    check_run_data(settings(tmp_path, redis_url))  # fine as it is
    with pytest.raises(DataError, match="rs_filters: plug-in 'no_such_module_xyz:keep': cannot import"):
        check_run_data(settings(tmp_path, redis_url, rs_filters=["no_such_module_xyz:keep"]))
    rm_only = tmp_path / "chat.jsonl"
    rm_only.write_text(json.dumps({"prompt": "Say hi", "checks": {"reward_model": {}}}) + "\n")
    with pytest.raises(DataError, match=r"chat\.jsonl line 1: its checks \['reward_model'\] have no pass/fail"):
        check_run_data(settings(tmp_path, redis_url, train_data=rm_only))
