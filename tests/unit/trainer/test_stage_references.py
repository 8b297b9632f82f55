"""Stages that name their model and data by reference (issue 38): `model: base | previous`, `train_data: previous |
stage:<N>` resolved to a rejection-sampling stage's data.jsonl, every wrong reference named; a rejection-sampling
stage's outcome; stage task ids; start-up checks of data a stage is still to write."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pydantic import ValidationError

from grpo.common.queue import RunQueue
from grpo.trainer.accounting import Accounting
from grpo.trainer.config import TrainerSettings
from grpo.trainer.data import DataError, parse_row
from grpo.trainer.order import DataCursor
from grpo.trainer.preflight import check_run_data
from grpo.trainer.publisher import Publisher, TaskSpec, row_of, task_id
from grpo.trainer.sources import Source, data_sources
from grpo.trainer.stages import plan_stages, read_outcome, stage_outcome, write_run_report

ROW = {"prompt": "1+1=", "gold": "2"}


def settings(tmp_path: Path, stages: list[dict[str, object]], **extra: object) -> TrainerSettings:
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(ROW) + "\n")
    return TrainerSettings(train_data=data, output_dir=tmp_path / "run", stages=stages, **extra)  # type: ignore[arg-type]


R1 = [  # DeepSeek-R1's four stages
    {"mode": "sft", "train_data": "cold.jsonl"},
    {"mode": "grpo"},
    {"mode": "rejection_sampling", "rs_samples": 4},
    {"mode": "sft", "model": "base", "train_data": [{"data": "previous", "weight": 3}, "general.jsonl"]},
    {"mode": "grpo"},
]


def test_r1s_stages_resolve_their_models_and_data(tmp_path: Path) -> None:
    cold, grpo, rs, resft, final = plan_stages(settings(tmp_path, R1, model="tiny"))
    run = tmp_path / "run"
    assert [s.settings.stage for s in (cold, grpo, rs, resft, final)] == [1, 2, 3, 4, 5]
    assert cold.settings.model == "tiny" and grpo.settings.model == str(run / "stage-1-sft" / "final")
    assert rs.folder == run / "stage-3-rejection_sampling" and rs.settings.model == str(run / "stage-2-grpo" / "final")
    assert resft.settings.model == "tiny", "model: base is the run's model, not the GRPO stage's"
    assert data_sources(resft.settings) == [Source(rs.folder / "data.jsonl", 3.0), Source(Path("general.jsonl"), 1.0)]
    assert final.settings.model == str(run / "stage-4-sft" / "final")
    assert data_sources(final.settings) == [Source(tmp_path / "train.jsonl")]  # the run's own train_data


def test_a_stage_after_rejection_sampling_continues_from_the_model_before_it(tmp_path: Path) -> None:
    stages = [{"mode": "rejection_sampling"}, {"mode": "sft", "train_data": "stage:1"},
              {"mode": "rejection_sampling", "model": "previous"}, {"mode": "grpo", "model": "previous"}]  # fmt: skip
    rs1, sft, rs2, grpo = plan_stages(settings(tmp_path, stages, model="tiny"))
    assert rs1.settings.model == "tiny" and sft.settings.model == "tiny"  # no stage before trains a model
    assert sft.settings.train_data == rs1.folder / "data.jsonl"
    assert rs2.settings.model == grpo.settings.model == str(sft.folder / "final")


@pytest.mark.parametrize(
    ("stages", "needle"),
    [
        ([{"mode": "sft", "model": "previous"}], "stages[1]: model: previous, but stage 1 has no earlier stage"),
        ([{"mode": "sft"}, {"mode": "sft", "train_data": "previous"}],
         "stages[2]: train_data previous names the data of the latest earlier rejection_sampling stage, and no stage "
         "before it is one"),
        ([{"mode": "sft"}, {"mode": "grpo", "train_data": ["x.jsonl", {"data": "stage:1", "weight": 2}]}],
         "stages[2]: train_data 'stage:1': stage 1 is a sft stage, which writes no data"),
        ([{"mode": "rejection_sampling"}, {"mode": "sft", "train_data": "stage:2"}],
         "stages[2]: train_data 'stage:2': stage 2 is not earlier than stage 2"),
        ([{"mode": "sft", "train_data": ["stage:3"]}, {"mode": "sft"}, {"mode": "rejection_sampling"}],
         "stages[1]: train_data 'stage:3': stage 3 is not earlier than stage 1"),
        ([{"mode": "rejection_sampling"}, {"mode": "sft", "train_data": "stage:one"}],
         "stages[2]: train_data 'stage:one': write stage:<N>"),
        ([{"mode": "rejection_sampling"}, {"mode": "sft", "train_data": "stage:0"}], "write stage:<N>"),
        ([{"mode": "sft", "stage": 2}], "stages[1]: `stage` is set by the run"),
        ([{"mode": "rl"}], "stages[1]: needs mode: sft, grpo or rejection_sampling"),
        ([{"mode": "rejection_sampling", "rs_filters": ["overlong"]}],
         "stages[1] (rejection_sampling): settings: Value error, rs_filters names overlong"),
        ([{"mode": "rejection_sampling", "rs_filters": ["no-such filter"]}], "neither a built-in filter"),
    ],
)  # fmt: skip
def test_a_wrong_reference_fails_at_start_naming_the_stage(
    tmp_path: Path, stages: list[dict[str, object]], needle: str
) -> None:
    with pytest.raises(ValidationError) as err:
        settings(tmp_path, stages)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"model": "previous"}, "model: previous names a stage's model"),
        ({"model": "base"}, "model: base names a stage's model"),
        ({"train_data": ["previous"]}, "train_data 'previous' refers to an earlier stage's data"),
        ({"train_data": "stage:2"}, "train_data 'stage:2' refers to an earlier stage's data"),
    ],
)
def test_references_outside_stages_are_refused(tmp_path: Path, extra: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        TrainerSettings(**{"train_data": tmp_path / "t.jsonl", **extra})  # type: ignore[arg-type]
    assert needle in str(err.value)


def test_plugin_filters_and_rs_settings_are_accepted(tmp_path: Path) -> None:
    rs = plan_stages(settings(tmp_path, [{"mode": "rejection_sampling", "rs_filters": ["mixed_language",
                     "my_pkg.filters:no_refusals", "overlong"], "rs_max_tokens": 200, "rs_require": ["math"]}]))[0]  # fmt: skip
    assert rs.settings.rs_filters == ["mixed_language", "my_pkg.filters:no_refusals", "overlong"]
    assert (rs.settings.rs_samples, rs.settings.rs_keep_per_prompt, rs.settings.rs_pass_score) == (8, 1, 1.0)


def test_a_rejection_sampling_stage_is_finished_by_its_data_not_a_model(tmp_path: Path) -> None:
    grpo, rs = plan_stages(settings(tmp_path, [{"mode": "grpo"}, {"mode": "rejection_sampling"}]))
    rs.folder.mkdir(parents=True)
    summary = {"prompts": 4, "sampled": 32, "kept": 5, "prompts_with_none": 1, "wall_seconds": 30.0,
               "kept_per_prompt": {"0": 1, "1": 2, "2": 1}, "prompts_with_none_ids": ["p3"], "rejections": {}}  # fmt: skip
    (rs.folder / "rs_summary.json").write_text(json.dumps(summary))
    out = stage_outcome(rs, 12.0)
    assert (out["index"], out["mode"], out["kept"], out["sampled"], out["prompts_with_none"]) == (
        2, "rejection_sampling", 5, 32, 1)  # fmt: skip
    assert out["seconds"] == 30.0 and "kept 5 of 32" in out["outcome"]
    (rs.folder / "stage.json").write_text(json.dumps(out))
    assert read_outcome(rs) is None, "stage.json without data.jsonl is not a finished stage"
    (rs.folder / "data.jsonl").write_text(json.dumps({**ROW, "response": "2"}) + "\n")
    assert read_outcome(rs) == out  # no final/ needed
    # The run's report still plots the last GRPO stage, not the rejection-sampling stage after it.
    grpo.folder.mkdir(parents=True)
    rows = [{"step": s, "eval/accuracy": a, "reward/mean": a} for s, a in [(0, 0.2), (5, 0.6)]]
    (grpo.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    grpo_out = stage_outcome(grpo, 5.0)
    stages = plan_stages(settings(tmp_path, [{"mode": "grpo"}, {"mode": "rejection_sampling"}]))
    write_run_report(stages[0].settings.model_copy(update={"output_dir": tmp_path / "run"}), stages,
                     [grpo_out, out], 35.0)  # fmt: skip
    report = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert report["eval_accuracy_before"] == 0.2
    assert [s["mode"] for s in report["stages"]] == ["grpo", "rejection_sampling"]
    assert (tmp_path / "run" / "report.md").is_file()


def test_stage_task_ids_carry_the_stage_and_row_of_reads_them() -> None:
    assert task_id("r1", "e2-7", stage=3) == "r1-s3-e2-7"
    assert task_id("r1", "e2-7") == "r1-e2-7"  # a run without stages: as before
    assert row_of("r1-s3-e0-2", 5, 0) == row_of("r1-e0-2", 5, 0)
    assert row_of("run-s2-x-s4-e0-1", 5, 0) == row_of("r1-e0-1", 5, 0)  # the position is the suffix


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_two_stages_of_one_run_never_share_a_task_id(client: redis.Redis) -> None:
    spec = TaskSpec(group_size=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    rows = [parse_row({"prompt": f"{i}+1=", "gold": str(i + 1)}, f"row {i}") for i in range(4)]
    queue = RunQueue(client, "staged")
    queue.ensure_groups()
    ids = {}
    for stage in (2, 4):  # two GRPO stages of one run, each from the start of its data
        pub = Publisher(queue, rows, spec, "staged", DataCursor(seed=0), stage=stage)
        ids[stage] = pub.publish(4, 0, 0, Accounting())
        assert all(tid.startswith(f"staged-s{stage}-e0-") for tid in ids[stage])
        assert [pub.row(tid) for tid in ids[stage]] == [rows[row_of(t, 4, 0)] for t in ids[stage]]
    assert not set(ids[2]) & set(ids[4])
    published = [e.message.task_id for e in queue.read_tasks("r", 20, 100) if e.message is not None]
    assert published == ids[2] + ids[4]


def test_start_up_leaves_data_a_stage_is_still_to_write_to_that_stage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    general = tmp_path / "general.jsonl"
    general.write_text(json.dumps({**ROW, "response": "2"}) + "\n")
    stages = [{"mode": "rejection_sampling"},
              {"mode": "sft", "train_data": [{"data": "previous", "weight": 2}, str(general)], "task_weights": {}}]  # fmt: skip
    s = settings(tmp_path, stages)
    with caplog.at_level(logging.INFO, logger="grpo.trainer.preflight"):
        check_run_data(s)  # stage 2's data.jsonl does not exist yet: not an error
    rs_data = tmp_path / "run" / "stage-1-rejection_sampling" / "data.jsonl"
    assert (f"stage 2 (sft): train_data {rs_data} is written by stage 1 (rejection_sampling) of this run: it is "
            "checked when stage 2 starts") in caplog.text  # fmt: skip
    # Everything else is still checked at start-up: a bad row of the other file is refused, naming the stage.
    general.write_text(json.dumps(ROW) + "\n")  # no response: not an SFT row
    with pytest.raises(DataError, match=rf"stage 2 \(sft\): {general} line 1: SFT rows need a 'response'"):
        check_run_data(s)
    # Once stage 1 has finished, its data is checked at start-up like any file.
    general.write_text(json.dumps({**ROW, "response": "2"}) + "\n")
    rs_data.parent.mkdir(parents=True)
    rs_data.write_text(json.dumps({"prompt": "1+1=", "response": "2", "provenance": "x"}) + "\n")
    (rs_data.parent / "stage.json").write_text("{}")
    with pytest.raises(DataError, match=rf"stage 2 \(sft\): {rs_data} line 1: 'provenance' must be a mapping"):
        check_run_data(s)
