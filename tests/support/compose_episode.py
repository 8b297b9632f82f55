"""The compose episode test's files (tests/compose/test_compose_episode.py): the tool model and a trainer config
with `tools: [python]` and `python_session: true`, mounted into the containers by a compose override. Kept here so that a unit test can check
the override and the config without Docker (tests/unit/deploy/test_deploy_tools.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from grpo.common.tiny_model import cache_root
from tests.support.tool_model import STATE_PROMPT, TOOL_PROMPT, TOOL_RESULT, tool_model_path

STEPS, PROMPTS_PER_STEP, GROUP_SIZE = 2, 2, 4
TRAINER: dict[str, object] = {  # the trainer's config inside its container (the folder below is mounted at /episode)
    "preset": "grpo",
    "model": "/models/tool",
    "train_data": "/episode/train.jsonl",
    "eval_data": "/episode/eval.jsonl",
    "steps": STEPS,
    "prompts_per_step": PROMPTS_PER_STEP,
    "group_size": GROUP_SIZE,
    "max_new_tokens": 24,
    "temperature": 1.0,
    "skip_zero_variance": False,  # the tool model answers nearly every episode right: train on equal groups too
    "reward_weights": {"math": 1.0},
    "tools": ["python"],
    "tool_format": "tagged",
    "max_turns": 3,
    "tool_timeout_s": 5.0,
    "python_session": True,  # evaluation asks for x set in one call and printed in the next
    "eval_every": STEPS,
    "eval_size": 4,
    "checkpoint_every": STEPS,
    "sampler_exact": True,
    "torch_threads": 1,
}


def readable_copy(source: Path, target: Path) -> Path:
    """`source` copied to `target`, readable by the containers' uid 10001 (pytest's folders are 0700)."""
    shutil.copytree(source, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def episode_files(root: Path) -> tuple[Path, Path]:
    """(model folder, episode folder with trainer.yaml and the data), both mounted read-only."""
    model = readable_copy(tool_model_path(cache_root() / "models"), root / "tool-model")
    folder = root / "episode"
    folder.mkdir()
    row = json.dumps({"prompt": TOOL_PROMPT, "gold": TOOL_RESULT})
    (folder / "train.jsonl").write_text((row + "\n") * 8)
    # two calls, the second printing what the first set: only a python session answers it
    (folder / "eval.jsonl").write_text((json.dumps({"prompt": STATE_PROMPT, "gold": TOOL_RESULT}) + "\n") * 2)
    (folder / "trainer.yaml").write_text(yaml.safe_dump(TRAINER, sort_keys=False))
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return model, folder


def override(model: Path, folder: Path) -> dict[str, Any]:
    """The compose override: the tool model in rollout and trainer, the trainer on the episode config, once."""
    return {
        "services": {
            "rollout": {
                "environment": {"GRPO_ROLLOUT_MODEL": "/models/tool"},
                "volumes": [f"{model}:/models/tool:ro"],
            },
            "trainer": {
                "command": ["--host", "0.0.0.0", "--config", "/episode/trainer.yaml", "--output-dir", "/checkpoints"],
                "restart": "no",
                "volumes": [f"{model}:/models/tool:ro", f"{folder}:/episode:ro"],
            },
        }
    }
