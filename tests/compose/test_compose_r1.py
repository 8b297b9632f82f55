"""R1's whole recipe through `docker compose -f docker-compose.yml -f docker-compose.r1.yml up`, as a user runs it:
the three images, Redis, the shipped override on its quick recipe (GRPO_R1_RECIPE=r1-quick: deploy/compose/r1-quick
.yaml, the five stages cut short). Needs a Docker engine with the images built (`make test-compose` builds them).

The trainer runs cold-start SFT, GRPO, rejection sampling, SFT of the base model and GRPO to the end and exits 0;
the run folder, copied out of the checkpoints volume, has each stage's outcome and final checkpoint, the
rejection-sampling data is what its filters promise (and as many rows as its summary says it kept), the stages that
publish tasks kept balanced books, the last GRPO stage logged every step, and `down -v` leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo.common.net import free_port
from tests.support.compose_project import REPO, ComposeProject
from tests.support.r1_recipe import MODES, check_books, check_rs_data, read_jsonl, rows_by_id, stage_dir, stage_values

# `up` to the trainer's exit took ~95 s on 2 busy cores (logged at INFO); the deadlines leave room for a slower machine.
pytestmark = [pytest.mark.compose, pytest.mark.timeout(1200)]
log = logging.getLogger(__name__)
RECIPE = "r1-quick"
RUN = f"/checkpoints/{RECIPE}"  # where docker-compose.r1.yml has the trainer write this recipe's run
DATA = REPO / "services" / "trainer" / "configs" / "data"  # mounted at /r1-data


@pytest.fixture(scope="module")
def project() -> Iterator[ComposeProject]:
    env = {**os.environ, "GRPO_API_TOKEN": "compose-r1-s3cret", "GRPO_REWARD_HTTP_PORT": str(free_port()),
           "GRPO_TRAINER_HTTP_PORT": str(free_port()), "COMPOSE_PROFILES": "cpu", "GRPO_R1_RECIPE": RECIPE}  # fmt: skip
    p = ComposeProject("grpocomposer1", [REPO / "docker-compose.yml", REPO / "docker-compose.r1.yml"], env)
    p.compose("down", "-v", "--remove-orphans", check=False)  # a previous run's leftovers
    try:
        yield p
    finally:
        p.compose("down", "-v", "--remove-orphans", check=False)


def compose_trainer() -> dict[str, Any]:
    """The trainer's settings file as its container reads it (/etc/grpo is deploy/compose)."""
    return dict(yaml.safe_load((REPO / "deploy" / "compose" / f"{RECIPE}.yaml").read_text()))


def test_compose_runs_r1s_whole_recipe(project: ComposeProject, tmp_path: Path) -> None:
    started = time.monotonic()
    project.compose("up", "-d")
    code = project.wait_exit("trainer", timeout=900)
    log.info("R1 quick recipe through compose: up to the trainer's exit in %.0f s", time.monotonic() - started)
    assert code == 0, project.logs("trainer", tail=200) + project.logs("rollout")
    run = project.copy_out("trainer", RUN, tmp_path / "run")
    trainer = compose_trainer()

    # Every stage finished, in order, with its final checkpoint; the summary lists the five outcomes.
    summary = json.loads((run / "summary.json").read_text())
    assert [s["mode"] for s in summary["stages"]] == MODES, summary["stages"]
    for i in range(1, 6):
        outcome = json.loads((stage_dir(run, i) / "stage.json").read_text())
        assert (outcome["index"], outcome["mode"]) == (i, MODES[i - 1]) and outcome == summary["stages"][i - 1]
        if MODES[i - 1] != "rejection_sampling":
            assert (stage_dir(run, i) / "final" / "config.json").is_file(), sorted(stage_dir(run, i).iterdir())

    # R1's re-SFT (stage 4) trained the base model, and the last GRPO stage the re-SFT's: as the trainer logged it.
    logged = project.logs("trainer", tail=100_000)
    assert re.search(rf"stage 4/5 \(sft\) → {RUN}/stage-4-sft, model tiny\b", logged), logged[-3000:]
    assert re.search(rf"stage 5/5 \(grpo\) → {RUN}/stage-5-grpo, model {RUN}/stage-4-sft/final\b", logged)

    # Stage 3 kept rows, as many as its summary says, each passing the filters it promises.
    rows = check_rs_data(stage_dir(run, 3), stage_values(trainer, 3), rows_by_id(DATA / "r1-train.jsonl"))
    assert rows, "rejection sampling kept nothing: the re-SFT had no data"
    assert {r["provenance"]["model"] for r in rows} == {f"{RUN}/stage-2-grpo/final"}
    assert json.loads((stage_dir(run, 3) / "rs_summary.json").read_text())["kept"] == len(rows)

    # The stages that publish tasks kept their books; the last GRPO stage logged every one of its steps.
    for i in (2, 3, 5):
        assert check_books(stage_dir(run, i))["tasks/published"] > 0
    steps = [r["step"] for r in read_jsonl(stage_dir(run, 5) / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(1, trainer["steps"] + 1)), steps
    assert summary["grpo_steps"] == trainer["steps"], summary


def test_down_leaves_nothing_behind(project: ComposeProject) -> None:
    assert any(project.resources().values())
    project.compose("down", "-v", "--remove-orphans")
    left = project.resources()
    assert left == {"containers": [], "networks": [], "volumes": []}, left
