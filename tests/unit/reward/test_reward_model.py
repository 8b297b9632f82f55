"""The optional reward model: a tiny randomly initialised Qwen2 sequence classifier saved locally, scored in batches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.reward.helpers import save_tiny_reward_model


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"))


def test_scores_are_batched_deterministic_and_distinct(tiny_rm: Path) -> None:
    from grpo.reward.verifiers.reward_model import RewardModel

    model = RewardModel(str(tiny_rm), batch_size=2, max_length=64)
    prompts = ["What is 2+2?", "What is 3*3?", "Name a colour.", "2+2?", "Add 1 and 1."]
    completions = ["<answer>4</answer>", "9", "blue, clearly a colour", "four", "<think>1+1</think><answer>2</answer>"]
    scores = model.score(prompts, completions)
    assert len(scores) == 5 and all(isinstance(s, float) for s in scores)
    assert len({round(s, 6) for s in scores}) > 1, "a random model still tells inputs apart"
    one_by_one = [model.score([p], [c])[0] for p, c in zip(prompts, completions, strict=True)]
    assert scores == pytest.approx(one_by_one, abs=1e-4), "padding in a batch must not change a score"


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    from grpo.reward.verifiers.reward_model import RewardModel

    with pytest.raises(OSError):
        RewardModel(str(tmp_path / "nope"))


def test_service_core_does_not_import_torch() -> None:
    code = (
        "import sys; import grpo.reward.core, grpo.reward.http_api, grpo.reward.grpc_api; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]
