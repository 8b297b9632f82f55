"""R1's whole recipe, one config in four places: services/trainer/configs/r1.yaml (beside running services),
deploy/local/r1.yaml (`grpo up`), deploy/compose/r1.yaml with docker-compose.r1.yml (compose), and the quick
profile deploy/local/r1-quick.yaml with its compose copy deploy/compose/r1-quick.yaml (GRPO_R1_RECIPE=r1-quick).
Each is accepted by the trainer's settings with its five stages resolved, the copies say the same, the quick one
differs only where its comment says, and the compose override runs the recipe it is told on the data it mounts, in
a folder and under a run id of its own (no Docker needed; tests/compose/test_compose_r1.py runs it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo.trainer.config import parse_settings
from grpo.trainer.stages import plan_stages
from tests.support.compose_env import compose_env, interpolate, local_secret_paths, write_secrets

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "services" / "trainer" / "configs" / "r1.yaml"
DATA = "services/trainer/configs/data/"
MODES = ["sft", "grpo", "rejection_sampling", "sft", "grpo"]
# What the quick profile may change (deploy/local/r1-quick.yaml's comment): sizes, and two settings it explains.
QUICK_CHANGES = {"steps", "prompts_per_step", "group_size", "warmup_steps", "micro_batch_size", "checkpoint_every",
                 "eval_every", "eval_size", "rs_prompts", "rs_samples", "rs_require", "skip_zero_variance",
                 "group_timeout_s"}  # fmt: skip


def load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def without_addresses(config: dict[str, Any]) -> dict[str, Any]:
    """The recipe less what a stack or compose fills in (Redis, the output folder)."""
    return {k: v for k, v in config.items() if k not in ("redis_url", "output_dir")}


def settings_of(config: Path, monkeypatch: pytest.MonkeyPatch, *flags: str, env: dict[str, str] | None = None) -> Any:
    for name in list(os.environ):
        if name.startswith("GRPO_"):
            monkeypatch.delenv(name)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    return parse_settings(["--config", str(config), *flags])


def test_the_recipe_has_five_stages_whose_references_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    stages = plan_stages(settings_of(RECIPE, monkeypatch))
    assert [s.mode for s in stages] == MODES
    out = Path("runs/r1")
    assert stages[0].settings.model == "tiny" and stages[1].settings.model == str(out / "stage-1-sft" / "final")
    assert stages[2].settings.model == str(out / "stage-2-grpo" / "final")  # rejection sampling from the RL model
    assert stages[3].settings.model == "tiny"  # R1's re-SFT starts from the base model
    assert stages[4].settings.model == str(out / "stage-4-sft" / "final")
    assert stages[3].settings.train_data == [
        {"data": str(out / "stage-3-rejection_sampling" / "data.jsonl"), "weight": 3},
        {"data": DATA + "r1-general.jsonl", "weight": 1},
    ]
    assert stages[1].settings.task_weights == {"add": 2.0, "sub": 1.0}
    assert stages[4].settings.task_weights == {"add": 1.0, "sub": 1.0}
    # What docs/demo.md "R1's whole recipe" says each stage does (a misplaced comment must not change it silently).
    rs = stages[2].settings
    assert (rs.rs_prompts, rs.rs_samples, rs.rs_keep_per_prompt, rs.rs_require, rs.rs_filters, rs.temperature) == (
        1024, 8, 2, ["math", "format"], ["truncated"], 1.0)  # fmt: skip
    for i in (0, 3):
        assert (stages[i].settings.steps, stages[i].settings.prompts_per_step) == (320, 128)
    for i in (1, 4):
        s = stages[i].settings
        assert (s.steps, s.prompts_per_step, s.group_size, s.reward_weights) == (
            100, 32, 8, {"math": 1.0, "format": 1.0, "overlong": 1.0})  # fmt: skip
    for path in (DATA + "r1-train.jsonl", DATA + "r1-eval.jsonl", DATA + "r1-sft.jsonl", DATA + "r1-general.jsonl"):
        assert (ROOT / path).is_file(), path


@pytest.mark.parametrize("stack", ["r1.yaml", "r1-quick.yaml"])
def test_grpo_up_accepts_the_recipe_stacks(stack: str) -> None:
    """What `grpo up -c deploy/local/<stack>` checks before it starts anything: every section's settings and every
    model a section names (a stage's `model: base` is the run's model, not a folder to look for)."""
    from grpo.local.launcher import read_stack_config, spec_from_config
    from grpo.local.stack import plan_services, settings_problems

    spec = spec_from_config(read_stack_config(ROOT / "deploy" / "local" / stack), Path("runs"))
    assert settings_problems(plan_services(spec, "redis://127.0.0.1:6379/0")) == []


def test_grpo_up_runs_exactly_the_recipe() -> None:
    assert load(ROOT / "deploy" / "local" / "r1.yaml")["trainer"] == without_addresses(load(RECIPE))


def test_the_quick_profile_is_the_recipe_cut_short() -> None:
    full = load(ROOT / "deploy" / "local" / "r1.yaml")
    quick = load(ROOT / "deploy" / "local" / "r1-quick.yaml")
    assert {k: v for k, v in quick.items() if k not in ("trainer", "run_id")} == {
        k: v for k, v in full.items() if k not in ("trainer", "run_id")
    }

    def changed(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
        return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}

    full_t, quick_t = full["trainer"], quick["trainer"]
    assert changed(without_stages(full_t), without_stages(quick_t)) <= QUICK_CHANGES
    assert len(full_t["stages"]) == len(quick_t["stages"]) == 5
    for a, b in zip(full_t["stages"], quick_t["stages"], strict=True):
        assert a["mode"] == b["mode"] and changed(a, b) <= QUICK_CHANGES, (a, b)


def without_stages(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "stages"}


def on_local_data(compose: dict[str, Any]) -> dict[str, Any]:
    """A compose trainer config with its mounted data (/r1-data) at the repository's path for it."""
    return dict(json.loads(json.dumps(compose).replace('"/r1-data/', f'"{DATA}')))


def test_the_compose_recipe_is_the_recipe_on_the_mounted_data() -> None:
    assert on_local_data(load(ROOT / "deploy" / "compose" / "r1.yaml")) == without_addresses(load(RECIPE))


def test_the_compose_quick_recipe_is_the_quick_profile_on_the_mounted_data() -> None:
    quick = on_local_data(load(ROOT / "deploy" / "compose" / "r1-quick.yaml"))
    assert quick == load(ROOT / "deploy" / "local" / "r1-quick.yaml")["trainer"]


def merged(service: str) -> dict[str, Any]:
    """docker-compose.yml's service with docker-compose.r1.yml's merged over it as compose merges: a command
    replaced, environment keys overridden, volumes added."""
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][service]
    override = yaml.safe_load((ROOT / "docker-compose.r1.yml").read_text())["services"][service]
    out = dict(base)
    for key, value in override.items():
        if key == "environment":
            out[key] = {**base.get(key, {}), **value}
        elif key == "volumes":
            out[key] = [*base.get(key, []), *value]
        else:
            out[key] = value
    return out


@pytest.mark.parametrize(("trainer", "rollout"), [("trainer", "rollout"), ("trainer-gpu", "rollout-gpu")])
@pytest.mark.parametrize("recipe", ["r1", "r1-quick"])
def test_the_compose_override_runs_the_recipe_in_its_own_folder_and_run(
    trainer: str, rollout: str, recipe: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    service = merged(trainer)
    # The command as compose interpolates it: the full recipe by default, the one GRPO_R1_RECIPE names otherwise.
    shell = {} if recipe == "r1" else {"GRPO_R1_RECIPE": recipe}
    command = [interpolate(part, shell) for part in service["command"]]
    config = command[command.index("--config") + 1]
    output = command[command.index("--output-dir") + 1]
    mounts = dict(reversed(v.split(":")[:2]) for v in service["volumes"])  # container path -> host path
    assert config == f"/etc/grpo/{recipe}.yaml" and mounts["/etc/grpo"] == "./deploy/compose"
    assert mounts["/r1-data"] == "./services/trainer/configs/data"
    # Its own folder: not the default run's (/checkpoints), nor the other recipe's.
    assert output == f"/checkpoints/{recipe}" and "checkpoints" in mounts.get("/checkpoints", "")
    # The trainer and the replicas share a run id: r1, or GRPO_RUN_ID.
    full = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for key in (trainer, rollout):
        full["services"][key] = merged(key)
    for variables, run_id in (({}, "r1"), ({"GRPO_RUN_ID": "mine"}, "mine")):
        assert compose_env(trainer, variables, full)["GRPO_TRAINER_RUN_ID"] == run_id
        assert compose_env(rollout, variables, full)["GRPO_ROLLOUT_RUN"] == run_id
    # The trainer's settings as its container gets them (environment, secrets, flags): the five stages, on files
    # that the mount provides.
    env = local_secret_paths(
        {k: v for k, v in compose_env(trainer, {}, full).items() if k.startswith("GRPO_")},
        write_secrets(tmp_path, {}),
    )
    settings = settings_of(ROOT / "deploy" / "compose" / f"{recipe}.yaml", monkeypatch, "--output-dir", output, env=env)
    stages = plan_stages(settings)
    assert [s.mode for s in stages] == MODES and settings.run_id == "r1"
    assert stages[3].settings.train_data[0]["data"] == f"{output}/stage-3-rejection_sampling/data.jsonl"
    for path in (settings.train_data, settings.eval_data, stages[0].settings.train_data,
                 stages[3].settings.train_data[1]["data"]):  # fmt: skip
        assert str(path).startswith("/r1-data/") and (ROOT / DATA / Path(path).name).is_file(), path
