"""What the trainer refuses at start-up from what the replicas say of themselves in the registry."""

from __future__ import annotations

import pytest

from grpo.common.registry import ReplicaInfo
from grpo.trainer.errors import RunError
from grpo.trainer.replica_sync import check_replica_caps


def replica(name: str, cap: int = 0, context: int = 0) -> ReplicaInfo:
    return ReplicaInfo(name, "h:1", 0, "", 0.0, max_new_tokens_cap=cap, max_context=context)


def test_a_replica_whose_cap_is_below_max_new_tokens_is_named() -> None:
    with pytest.raises(RunError, match=r"max_new_tokens 512 is over what rollout replica\(s\) b \(cap 256\) generate"):
        check_replica_caps([replica("a", 4096), replica("b", 256)], 512)
    check_replica_caps([replica("a", 512)], 512)  # at the cap is fine


def test_a_replica_whose_context_cannot_hold_the_longest_prompt_is_named() -> None:
    """vLLM's --vllm-max-model-len below the model's own context: every long prompt would fail at run time."""
    live = [replica("a", context=4096), replica("b", context=1024)]
    with pytest.raises(RunError, match=r"the longest prompt \(900 tokens\) with max_new_tokens 256 needs a context of "
                                       r"1156 tokens, more than rollout replica\(s\) b \(1024\) hold"):  # fmt: skip
        check_replica_caps(live, 256, longest_prompt=900)
    check_replica_caps(live, 256, longest_prompt=768)  # 1024 exactly


def test_a_replica_that_says_nothing_is_not_refused() -> None:
    """0: an older replica that does not report its cap or context; its tasks fail with a reason, as before."""
    check_replica_caps([replica("old")], 100_000, longest_prompt=100_000)


def test_an_episode_needs_room_for_its_whole_budget_not_one_turn() -> None:
    """An episode's tokens after the prompt run to max_episode_tokens (every turn and tool result), not to one
    turn's max_new_tokens: a replica that holds one turn but not the episode is named at start-up."""
    live = [replica("a", cap=512, context=1024)]
    check_replica_caps(live, 256, longest_prompt=700)  # one turn fits: 956 tokens
    with pytest.raises(RunError, match=r"the longest prompt \(700 tokens\) with an episode's 512 tokens needs a "
                                       r"context of 1212 tokens, more than rollout replica\(s\) a \(1024\) hold"):  # fmt: skip
        check_replica_caps(live, 256, longest_prompt=700, sample_budget=512)
