"""Worker for test_packing_ranks: under torchrun, DeepSpeed with packing on every rank against one plain process
that pads (rank 0), on rank_equivalence's batch and cases; rank 0 writes the largest differences to argv[2]."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # torchrun puts only this folder on the path

import torch

from grpo.trainer.learner import Learner
from tests.support.rank_equivalence import BATCH, compare, config, train

torch.set_num_threads(1)

CASES: list[tuple[str, dict[str, Any]]] = [
    ("grpo", {"agg": "token_mean", "micro_batch_size": 2}),
    ("grpo", {"agg": "seq_mean_token_mean", "micro_batch_size": 1}),
    ("grpo", {"agg": "seq_mean_token_sum", "micro_batch_size": 3, "per_token": True}),
    ("grpo", {"agg": "token_mean", "micro_batch_size": 2, "beta": 0.05, "ppo_epochs": 2}),
    (
        "grpo",
        {
            "agg": "seq_mean_token_mean",
            "micro_batch_size": 3,
            "episodes": True,
            "tis_cap": 2.0,
            "ratio_level": "sequence",
        },
    ),
    ("sft", {"micro_batch_size": 2, "episodes": True}),
]


def main() -> None:
    stage, out = int(sys.argv[1]), Path(sys.argv[2])
    results = []
    for kind, case in CASES:
        learner = Learner(config("deepspeed", stage, {**case, "packing": True}))
        rank = learner.backend.rank
        tokens, episodes = case.get("per_token", False), case.get("episodes", False)
        packed = train(learner, kind, len(BATCH), tokens, episodes)
        if rank == 0:
            padded = train(Learner(config("torch", stage, case)), kind, len(BATCH), tokens, episodes)
            results.append({"kind": kind, "case": case, **compare(packed, padded)})
        learner.backend.barrier()
        del learner  # engines left alive past destroy_process_group can abort the interpreter at exit
        gc.collect()
    if torch.distributed.get_rank() == 0:
        out.write_text(json.dumps({"world_size": torch.distributed.get_world_size(), "results": results}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
