"""Sequence packing under DeepSpeed on 2 real ranks (CPU, gloo): the one-process padded update and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.service.test_deepspeed import assert_one_process_update, torchrun

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


@pytest.mark.parametrize("stage", [2, 3])
def test_packed_ranks_give_the_padded_one_process_update(stage: int, tmp_path: Path) -> None:
    """Every aggregation, per-token advantages, the reference with two PPO epochs, masked tool episodes with GSPO's
    sequence ratio and TIS, and SFT: packed on 2 ZeRO-2/3 ranks = padded on one plain process
    (tests/support/packing_ranks.py)."""
    out = tmp_path / "result.json"
    torchrun(Path(__file__).parents[1] / "support" / "packing_ranks.py", str(stage), str(out), ranks=2)
    result = json.loads(out.read_text())
    assert (result["world_size"], len(result["results"])) == (2, 6)
    assert_one_process_update(result["results"], "when packed")
