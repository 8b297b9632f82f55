"""DeepSpeed ZeRO-2/3 on CPU (gloo) with 2 real processes under torchrun: GRPO steps, checkpoint, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.common.net import free_port
from tests.support.trainer_proc import port_taken

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


def torchrun(worker: Path, *args: str, ranks: int = 2) -> None:
    """`worker` on `ranks` processes under torchrun (CPU, gloo), which must exit 0. A master port taken between
    free_port() and torchrun's bind (a parallel test) is a race of the test's, not a failure: it runs again on
    another port."""
    launcher = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    for _ in range(3):
        cmd = [str(launcher), f"--nproc-per-node={ranks}", f"--master-port={free_port()}", str(worker), *args]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
        if proc.returncode == 0 or not port_taken(proc.stderr):
            break
    assert proc.returncode == 0, proc.stderr[-4000:]


def assert_one_process_update(results: list[dict], where: str) -> None:
    """Each case of a rank-equivalence worker's results (param_diff, missing, metric_diff against one plain
    process) within float reordering: relative to the largest parameter change, measured ≤ 1.2e-4."""
    for r in results:
        label = f"{r['kind']} {r['case']}"
        assert r["param_diff"] < 1e-3, f"{label}: parameters differ by {r['param_diff']:.2e} of the update"
        assert not r["missing"], f"{label}: metrics missing {where}: {r['missing']}"
        worst = max(r["metric_diff"], key=r["metric_diff"].get)
        assert r["metric_diff"][worst] < 1e-3, f"{label}: {worst} differs by {r['metric_diff'][worst]:.2e}"


def run_source(source: str, tmp_path: Path) -> dict:
    """A worker script (its source) on 2 ranks; the JSON result rank 0 writes to the path it is given."""
    script, out = tmp_path / "worker.py", tmp_path / "r.json"
    script.write_text(source)
    torchrun(script, str(out))
    return dict(json.loads(out.read_text()))


WORKER = r"""
import gc, json, sys
from pathlib import Path

import torch
torch.set_num_threads(1)

from grpo.trainer.checkpoint import load_checkpoint, save_checkpoint
from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample
from grpo.trainer.ranks import leave_process_group

stage, offload, out = int(sys.argv[1]), sys.argv[2] == "1", Path(sys.argv[3])
cfg = LearnerConfig(backend="deepspeed", zero_stage=stage, offload_optimizer=offload, lr=1e-3, micro_batch_size=2,
                    beta=0.01, ref_refresh_steps=1)
batch = [TrainableSample([5 + i, 6, 7], [8 + i, 9, 10 + i], advantage=1.0 if (i // 2) % 2 else -1.0, group_id=str(i // 4))
         for i in range(8)]

def checksum(learner):
    state = learner.state_dict_for_push()
    return [float(state[k].double().sum()) for k in sorted(state)]

def all_ranks(value):
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, value)
    return gathered

learner = Learner(cfg)
initial = checksum(learner)
metrics = [learner.step(batch) for _ in range(2)]
trained = checksum(learner)
ckpt = save_checkpoint(out / "ckpt", learner, step=2, data_cursor={"row": 16}, inflight={"t1": 1})
learner.step(batch)
continued = checksum(learner)

resumed = Learner(cfg)  # a fresh engine in the same process group
info = load_checkpoint(ckpt, resumed)
restored = checksum(resumed)
resumed.step(batch)
resumed_continued = checksum(resumed)
result = {
    "world_size": torch.distributed.get_world_size(),
    "changed": initial != trained,
    "ranks_equal": all(c == trained for c in all_ranks(trained)),
    "restored_equal": restored == trained,
    "continued_equal": max(abs(a - b) for a, b in zip(continued, resumed_continued)),
    "step": info.step, "data_cursor": info.data_cursor, "inflight": info.inflight,
    "loss": [m["loss"] for m in metrics], "grad_norm": [m["grad_norm"] for m in metrics],
    "model_files": sorted(p.name for p in (ckpt / "model").iterdir()),
}
if torch.distributed.get_rank() == 0:
    (out / "result.json").write_text(json.dumps(result))
del learner  # an engine left alive past destroy_process_group can abort the interpreter at exit
gc.collect()
resumed.close()  # the engine; the process group stays until the process leaves it
leave_process_group()
"""


BF16_WORKER = r"""
import gc, json, sys
from pathlib import Path

import torch
torch.set_num_threads(1)

from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample
from grpo.trainer.learner.batch import build_micro_batches
from grpo.trainer.learner.policy import forward_logprobs, load_causal_lm
from grpo.trainer.ranks import leave_process_group

out = Path(sys.argv[1])
cfg = LearnerConfig(backend="deepspeed", zero_stage=2, precision="bf16", lr=1e-3, micro_batch_size=2, beta=0.1)
batch = [TrainableSample([5 + i, 6, 7], [8 + i, 9, 10 + i], advantage=1.0 if (i // 2) % 2 else -1.0, group_id=str(i // 4))
         for i in range(8)]
learner = Learner(cfg)
metrics = learner.step(batch)  # the reference equals the starting policy, so the step's KL must be 0
mb = build_micro_batches(batch, micro_batch_size=8, pad_id=0)[0]
with torch.no_grad():
    bf16_ref, _ = forward_logprobs(learner.ref_model, mb, 1.0)  # = the bf16 starting policy
    fp32, _ = forward_logprobs(load_causal_lm(cfg.model).eval(), mb, 1.0)  # the reference as it was held before
result = {
    "kl": metrics["kl"],
    "policy_dtype": str(next(learner.model.module.parameters()).dtype),
    "data_types": [str(t) for t in learner.backend.engine.get_data_types()],  # (model, gradient accumulation)
    "reference_dtype": str(next(learner.ref_model.parameters()).dtype),
    "fp32_reference_gap": float(((bf16_ref - fp32) * mb.completion_mask).abs().max()),
}
if torch.distributed.get_rank() == 0:
    out.write_text(json.dumps(result))
learner.close()
leave_process_group()
"""


def test_zero_bf16_holds_the_reference_at_the_policys_precision(tmp_path: Path) -> None:
    """DeepSpeed's bf16 mode casts the policy; the reference is held in bf16 too, so KL(π‖π_ref) starts at 0 (an
    fp32 reference would put bf16 rounding into the KL term). bf16 ZeRO runs on CPU/gloo too, so this runs here."""
    result = run_source(BF16_WORKER, tmp_path)
    assert result["policy_dtype"] == result["reference_dtype"] == "torch.bfloat16"
    # Micro-batch gradients summed in fp32, not bf16 (which lost 0.9 % of the gradient over 64 micro-batches).
    assert result["data_types"] == ["torch.bfloat16", "torch.float32"]
    assert result["kl"] == 0.0
    assert result["fp32_reference_gap"] > 1e-3  # what the KL term would have measured: rounding, not drift


def run_zero(stage: int, offload: bool, tmp_path: Path) -> dict:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    torchrun(script, str(stage), str(int(offload)), str(tmp_path))
    return dict(json.loads((tmp_path / "result.json").read_text()))


@pytest.mark.parametrize(("stage", "offload"), [(2, False), (3, True)], ids=["zero2", "zero3-offload"])
def test_zero_grpo_steps_checkpoint_resume(stage: int, offload: bool, tmp_path: Path) -> None:
    result = run_zero(stage, offload, tmp_path)
    assert result["world_size"] == 2
    assert result["changed"], "two GRPO steps left the parameters unchanged"
    assert result["ranks_equal"], "ranks disagree on the parameters"
    assert result["restored_equal"], "resumed parameters differ from the saved ones"
    assert result["continued_equal"] < 1e-4, "a step after resume differs from the uninterrupted run"
    assert (result["step"], result["data_cursor"], result["inflight"]) == (2, {"row": 16}, {"t1": 1})
    assert "model.safetensors" in result["model_files"]


@pytest.mark.parametrize(("world_size", "stage"), [(2, 2), (3, 2), (2, 3), (3, 3)], ids=lambda v: str(v))
def test_ranks_give_the_one_process_update(world_size: int, stage: int, tmp_path: Path) -> None:
    """The same batch on N DeepSpeed ranks and on one plain process: the same parameters and metrics.

    Uneven splits (7 rows, and 2 rows on 3 ranks), micro-batches of 1–3 rows and token-capped ones, every
    aggregation, the reference model with two PPO epochs, per-token advantages, masked multi-turn episodes (with
    GSPO's sequence ratio and TIS), and SFT, also on tool episodes (tests/support/rank_equivalence.py).
    """
    out = tmp_path / "result.json"
    torchrun(Path(__file__).parents[1] / "support" / "rank_equivalence.py", str(stage), str(out), ranks=world_size)
    result = json.loads(out.read_text())
    assert (result["world_size"], result["stage"], len(result["results"])) == (world_size, stage, 21)
    assert_one_process_update(result["results"], "on DeepSpeed")


MASKED_WORKER = r"""
import gc, json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample

cfg = LearnerConfig(backend="deepspeed", zero_stage=2, lr=1e-2, micro_batch_size=2, beta=0.01, mask_truncated=True)
batch = [TrainableSample([5 + i, 6, 7], [8 + i, 9, 10 + i][: 1 + i % 3], advantage=1.0 if i % 2 else -1.0,
                         group_id=str(i // 4)) for i in range(7)]  # 7 samples, uneven lengths, over the ranks
def checksum(l):
    s = l.state_dict_for_push(); return [float(s[k].double().sum()) for k in sorted(s)]
def all_ranks(v):
    g = [None] * torch.distributed.get_world_size(); torch.distributed.all_gather_object(g, v); return g
learner = Learner(cfg)
m1 = learner.step(batch)
after_step = checksum(learner)
cut = [TrainableSample(s.prompt_token_ids, s.completion_token_ids, s.advantage, truncated=True) for s in batch]
m2 = learner.step(cut)
after_skip = checksum(learner)
m3 = learner.step(batch)
after_next = checksum(learner)
res = {"world": torch.distributed.get_world_size(), "step1_version": m1["version"], "skip": m2.get("skipped"),
       "skip_version": m2["version"], "unchanged_by_skip": after_skip == after_step, "moved_after": after_next != after_skip,
       "ranks_equal": all(c == after_next for c in all_ranks(after_next)), "version3": m3["version"]}
if torch.distributed.get_rank() == 0:
    Path(sys.argv[1]).write_text(json.dumps(res))
del learner; gc.collect()
"""


def test_an_all_masked_batch_makes_no_update_on_any_rank(tmp_path: Path) -> None:
    """Every completion truncated and masked: no rank steps (AdamW's momentum would move the weights on zero
    gradients), none waits on a collective the others skip, and the next real step moves all alike. 7 rows of
    uneven lengths over 2 ranks."""
    r = run_source(MASKED_WORKER, tmp_path)
    assert (r["skip"], r["skip_version"], r["step1_version"], r["version3"]) == (1.0, 1.0, 1.0, 2.0), r
    assert r["unchanged_by_skip"] and r["moved_after"] and r["ranks_equal"], r


RESIZE_WORKER = r"""
import json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from grpo.trainer.checkpoint import load_checkpoint, save_checkpoint
from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample
from grpo.trainer.ranks import leave_process_group

mode, root = sys.argv[1], Path(sys.argv[2])
cfg = LearnerConfig(backend="deepspeed", zero_stage=3, offload_optimizer=True, lr=1e-2, micro_batch_size=2,
                    lr_schedule="cosine", total_steps=10, beta=0.0)
batch = [TrainableSample([5 + i, 6, 7], [8 + i, 9], advantage=(-1.0) ** i, group_id=str(i // 2)) for i in range(4)]
learner = Learner(cfg)
def weights():
    return {k: v.double() for k, v in learner.state_dict_for_push().items()}
def gap(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)
if mode == "save":
    for _ in range(3):
        learner.step(batch)
    save_checkpoint(root, learner, step=3)
    if torch.distributed.get_rank() == 0:
        torch.save(weights(), root / "trained.pt")
        (root / "lr.json").write_text(json.dumps(learner.backend.lr()))
    else:
        weights()
else:
    fresh = weights()
    load_checkpoint(root / "step-00000003", learner)
    restored, loaded_lr = weights(), learner.backend.lr()
    learner.step(batch)
    stepped = weights()
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, sorted((k, float(v.sum())) for k, v in stepped.items()))
    if torch.distributed.get_rank() == 0:
        trained = torch.load(root / "trained.pt")
        (root / "result.json").write_text(json.dumps({
            "world": torch.distributed.get_world_size(), "restored_gap": gap(restored, trained),
            "trained_from_fresh": gap(trained, fresh), "step_gap": gap(stepped, restored),
            "ranks_equal": all(g == gathered[0] for g in gathered),
            "lr": loaded_lr, "saved_lr": json.loads((root / "lr.json").read_text())}))
learner.close()
leave_process_group()
"""


def test_zero3_checkpoint_resumes_on_more_ranks(tmp_path: Path) -> None:
    """A ZeRO-3 (optimizer offload) checkpoint of 1 rank loaded on 2: ZeRO cannot re-cut its optimizer shards for
    another number of ranks (it raised ZeRORuntimeException), so the weights (partitioned from the full model/) and
    the LR schedule load and AdamW starts afresh. The next step starts from the restored weights on every rank: the
    optimizer's fp32 partitions were refilled (else it would step from the fresh model's)."""
    script = tmp_path / "worker.py"
    script.write_text(RESIZE_WORKER)
    torchrun(script, "save", str(tmp_path), ranks=1)
    torchrun(script, "load", str(tmp_path), ranks=2)
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["world"] == 2 and r["ranks_equal"], r
    assert r["restored_gap"] < 1e-6, r
    # Adam's first step moves a weight by at most about lr (≤ 1e-2); three steps from the fresh model moved them ~3e-2
    assert r["step_gap"] < 0.011 < 0.015 < r["trained_from_fresh"], r
    assert r["lr"] == pytest.approx(r["saved_lr"], rel=1e-9), r  # the schedule goes on where it was
