"""The demo trains what docs/demo.md says it trains: its trainer config, resolved as the trainer resolves it, against
the numbers of the doc's recipe, and the tasks it publishes carry R1's reward weights and DAPO's overlong check.

(A comment once swallowed `reward_weights` and `overlong_soft_penalty`: the demo learned, and trained on another
reward than the one documented, and no test noticed.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from grpo.demo.config import DemoConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "demo.md"
PORTS = {"model": "m", "train_data": "train.jsonl", "eval_data": "eval.jsonl", "redis_url": "redis://127.0.0.1:1/0",
         "run_id": "demo", "output_dir": "out", "grpc_port": 0, "http_port": 0}  # fmt: skip


def recipe_text() -> str:
    """The doc's recipe section, one line (the doc wraps its sentences anywhere)."""
    text = DOC.read_text()
    section = text.split("## The recipe", 1)[1].split("\n## ", 1)[0]
    return " ".join(section.split())


def documented(pattern: str) -> tuple[str, ...]:
    match = re.search(pattern, recipe_text())
    assert match, f"docs/demo.md's recipe no longer says {pattern!r}: update this test with the doc"
    return match.groups()


@pytest.fixture(scope="module")
def trainer() -> tuple[Any, Any]:
    """The demo's default trainer settings as the trainer reads them, and the algorithm they resolve to."""
    from grpo.trainer.assemble import resolve_algo
    from grpo.trainer.config import TrainerSettings

    settings = TrainerSettings.model_validate(DemoConfig().trainer_settings(**PORTS))
    return settings, resolve_algo(settings)


def test_the_grpo_recipe_is_the_documented_one(trainer: tuple[Any, Any]) -> None:
    settings, algo = trainer
    (preset,) = documented(r"preset `(\w+)` \(clip")
    clip, beta, kl = documented(r"clip ([\d.]+), β = ([\d.]+) with (k\d) KL")
    prompts, group = documented(r"(\d+) prompts × G = (\d+) per step")
    (temperature,) = documented(r"temperature (\d+(?:\.\d+)?)")
    lr, warmup = documented(r"AdamW lr ([\de.-]+) with (\d+) warm-up steps and cosine decay")
    steps, eval_size, eval_every = documented(r"(\d+) steps, greedy evaluation on the same (\d+) held-out problems "
                                              r"every (\d+) steps")  # fmt: skip
    (staleness,) = documented(r"`max_staleness = (\d+)`")
    assert settings.preset == preset
    assert algo.clip_low == algo.clip_high == float(clip)
    assert (algo.beta, algo.kl_kind) == (float(beta), kl)
    assert algo.skip_zero_variance and "skip zero-variance groups" in recipe_text()
    assert (settings.prompts_per_step, algo.group_size) == (int(prompts), int(group))
    assert settings.temperature == float(temperature)
    assert (settings.lr, settings.warmup_steps, settings.lr_schedule) == (float(lr), int(warmup), "cosine")
    assert (settings.steps, settings.eval_size, settings.eval_every) == (int(steps), int(eval_size), int(eval_every))
    assert settings.eval_temperature == 0.0 and settings.eval_before_train  # greedy; "before" is the step-0 eval
    assert settings.max_staleness == int(staleness)


def test_the_rewards_are_r1s_unweighted_sum_with_dapos_overlong_penalty(trainer: tuple[Any, Any]) -> None:
    settings, algo = trainer
    weights = dict(re.findall(r"`(\w+)` ([\d.]+) \(", documented(r"\*\*Rewards\*\* (.*?)\* `eval_accuracy_after`")[0]))
    assert set(weights) == {"math", "format", "overlong"}, weights
    buffer, budget = documented(r"soft penalty over the last (\d+) of (\d+) tokens")
    assert settings.reward_weights == {name: float(w) for name, w in weights.items()}
    assert algo.overlong_soft_penalty and algo.overlong_buffer == int(buffer)
    assert settings.max_new_tokens == int(budget)


def test_every_demo_task_carries_the_weights_and_the_overlong_check(trainer: tuple[Any, Any]) -> None:
    """What the reward service is asked for: the rows' math and format checks, the overlong check the trainer adds
    (the ramp starts above the longest complete answer, 17 tokens), and the three weights; the trainer's own
    start-up check (every weight names a check of every row) passes on the demo's rows."""
    from grpo.demo.task import make_splits, prompt_rows
    from grpo.trainer.assemble import check_reward_weights, task_spec
    from grpo.trainer.data import parse_row
    from grpo.trainer.publisher import build_task

    settings, algo = trainer
    spec = task_spec(settings, algo)
    splits = make_splits(n_sft=8, n_grpo=8, n_eval=8, seed=0)
    rows = [parse_row(raw, f"row {i}") for i, raw in enumerate(prompt_rows(splits.grpo + splits.eval, "t"))]
    check_reward_weights(spec, rows)
    task = build_task(rows[0], "t-0", 1, spec)
    assert dict(task.weights) == {"math": 1.0, "format": 1.0, "overlong": 1.0}
    assert {f.name for f, _ in task.checks.ListFields()} == {"math", "format", "overlong"}
    assert (task.checks.overlong.max_tokens, task.checks.overlong.buffer_tokens) == (24, 4)
    assert task.checks.overlong.max_tokens - task.checks.overlong.buffer_tokens > 17


@pytest.mark.parametrize("preset", ["grpo", "dapo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "prm", "vineppo"])
def test_every_preset_trains_on_the_same_reward(preset: str) -> None:
    """`--preset` changes the algorithm, not the reward: DAPO's preset buffer (4096) would swallow the whole budget."""
    from grpo.trainer.assemble import overlong_buffer, resolve_algo
    from grpo.trainer.config import TrainerSettings

    settings = TrainerSettings.model_validate(DemoConfig(preset=preset).trainer_settings(**PORTS))
    assert settings.reward_weights == {"math": 1.0, "format": 1.0, "overlong": 1.0}
    assert overlong_buffer(settings, resolve_algo(settings)) == 4
