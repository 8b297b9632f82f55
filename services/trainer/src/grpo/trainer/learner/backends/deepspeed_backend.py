"""DeepSpeed ZeRO-2/3 backend (launched with torchrun): CPU/gloo or GPU/nccl, optional optimizer offload."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpo.trainer.learner.backends.base import Backend, T
from grpo.trainer.learner.config import resolve_precision
from grpo.trainer.learner.optim import build_scheduler
from grpo.trainer.learner.policy import add_lora, load_causal_lm, prepare_model, push_state_dict

log = logging.getLogger(__name__)

CHECKPOINT_TAG = "state"


def deepspeed_config(config: Any, *, precision: str, on_gpu: bool) -> dict[str, Any]:
    """The ZeRO config for a LearnerConfig (pure).

    Gradient accumulation is ours: micro-batches vary in number and carry exact loss weights, so
    DeepSpeed must neither count nor rescale them ("managed_gradient_accumulation": false makes every
    `step()` the boundary). "torch_adam" avoids building FusedAdam/CPUAdam (53 s / 112 s on first use).
    In bf16 the micro-batches' gradients are summed in fp32 ("grad_accum_dtype"): DeepSpeed's default sums them
    in the model's dtype, which lost 0.9 % of the gradient over 64 micro-batches and 2.3 % over 512.
    """
    zero: dict[str, Any] = {"stage": config.zero_stage}
    if config.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    if config.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": config.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "data_types": {"grad_accum_dtype": "fp32"},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": config.lr,
                "betas": list(config.betas),
                "eps": config.adam_eps,
                "weight_decay": config.weight_decay,
                "torch_adam": True,
            },
        },
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def ensure_distributed_env() -> None:
    """A single process started without a launcher gets the env torch.distributed needs (else DeepSpeed looks for MPI)."""
    if "RANK" in os.environ:
        return
    from grpo.common.net import free_port

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def skip_shm_comm_build() -> None:
    """Never compile DeepSpeed's CPU shared-memory all-reduce op (35–75 s on a fresh machine).

    It only speeds up large CPU all-reduces; gloo does the same job for our sizes. DeepSpeed keeps
    its compatibility table as one module-level dict that `build_shm_op` consults.
    """
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


class DeepSpeedBackend(Backend):
    def __init__(self, config: Any) -> None:
        from grpo.common.logs import adopt_logger
        from grpo.common.tiny_model import cache_root

        # JIT-built ops (if any) land in a cache that survives fresh clones on the same machine.
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_root() / "torch_extensions"))
        import deepspeed

        adopt_logger("DeepSpeed")
        ensure_distributed_env()
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            skip_shm_comm_build()
        start = time.perf_counter()
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
        log.info("deepspeed distributed init took %.1fs", time.perf_counter() - start)
        self.rank = torch.distributed.get_rank()
        self.world_size = torch.distributed.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(f"cuda:{local_rank}") if on_gpu else torch.device("cpu")
        if on_gpu:
            torch.cuda.set_device(self.device)
        self.precision = precision = resolve_precision(
            config.precision, on_gpu=on_gpu, sampler_exact=config.sampler_exact
        )
        # DeepSpeed's bf16 mode casts the model (no autocast); the reference is then held in bf16 as well.
        self.reference_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.stage = config.zero_stage
        ds_config = deepspeed_config(config, precision=precision, on_gpu=on_gpu)
        # ZeRO-3: transformers sees this config (through a weak reference)
        # and builds the model inside deepspeed.zero.Init, loading each weight straight into its
        # partition; the full model never sits on one rank.
        if self.stage == 3:
            from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

            hf_ds_config = HfDeepSpeedConfig(ds_config)  # noqa: F841 - alive while the model loads
            model = load_causal_lm(config.model)
            unset_hf_deepspeed_config()  # later loads (the reference model) stay whole on each rank
        else:
            model = load_causal_lm(config.model)
        prepare_model(model, config)
        if config.lora:
            model = add_lora(model, config.lora)

        def scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
            return build_scheduler(
                optimizer,
                warmup_steps=config.warmup_steps,
                total_steps=config.total_steps,
                schedule=config.lr_schedule,
                min_ratio=config.min_lr_ratio,
            )

        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=ds_config,
            lr_scheduler=scheduler,
        )
        self.model = self.engine
        self._closed = False

    def backward(self, loss: Tensor, *, last_micro_batch: bool) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def optimizer_step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, directory: Path) -> None:
        # ZeRO shards (optimizer, scheduler, partitioned params) from every rank...
        self.engine.save_checkpoint(str(directory / "deepspeed"), tag=CHECKPOINT_TAG, save_latest=False)
        # ...plus a plain HF folder for people and for the rollout service.
        state = self.full_state_dict()
        if self.rank == 0:
            self.engine.module.save_pretrained(directory / "model", state_dict=state, safe_serialization=True)

    def load(self, directory: Path, saved_world_size: int | None = None) -> None:
        saved = saved_world_size or saved_ranks(directory / "deepspeed" / CHECKPOINT_TAG)
        if saved is not None and saved != self.world_size:
            self._load_weights_only(directory, saved)
            return
        path, _ = self.engine.load_checkpoint(
            str(directory / "deepspeed"), tag=CHECKPOINT_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory / 'deepspeed'}")

    def _load_weights_only(self, directory: Path, saved: int) -> None:
        """Resume on another number of ranks: the weights (model/) and the LR schedule; AdamW starts afresh.

        ZeRO's optimizer shards are cut for the world size that wrote them and DeepSpeed refuses them on any
        other (ZeRORuntimeException); its universal-checkpoint conversion is an offline step of its own. The
        full weights are in model/ (HF safetensors) and the schedule in rank 0's model-states file.
        """
        import deepspeed

        from grpo.trainer.learner.backends.torch_backend import load_model_weights

        log.warning("checkpoint %s was saved on %d rank(s) and this run has %d: ZeRO cannot re-cut its optimizer "
                    "state for another number of ranks, so the weights (%s) and the LR schedule are restored and "
                    "AdamW's moments start again from zero; resume on %d rank(s) to keep them",
                    directory, saved, self.world_size, directory / "model", saved)  # fmt: skip
        module = self.engine.module
        gather = (  # modifier_rank=0: rank 0's copy is what every rank's partition gets on exit
            deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0)
            if self.stage == 3
            else contextlib.nullcontext()
        )
        with gather, torch.no_grad():
            load_model_weights(module, directory / "model")
        # the optimizer steps its own fp32 copy of each rank's partition: refill it from the loaded weights
        self.engine.optimizer._restore_from_bit16_weights()
        states = model_states_file(directory / "deepspeed" / CHECKPOINT_TAG)
        scheduler = self.engine.lr_scheduler
        if states is None or scheduler is None:
            log.warning("no LR scheduler state in %s: the schedule starts again", directory)
            return
        scheduler.load_state_dict(torch.load(states, map_location="cpu", weights_only=False)["lr_scheduler"])
        for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
            group["lr"] = lr  # the optimizer's groups were saved with it; a fresh one holds the first step's rate

    def full_state_dict(self) -> dict[str, Tensor]:
        """Gathered on every rank (collective under ZeRO-3: all ranks must call it)."""
        import deepspeed

        module = self.engine.module
        gather = (
            deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
            if self.stage == 3
            else contextlib.nullcontext()
        )
        with gather:
            # clone: ZeRO-3 frees the gathered storage when the context exits
            return {k: v.detach().clone().cpu() for k, v in push_state_dict(module).items()}

    def gather(self, items: list[T]) -> list[T]:
        gathered: list[list[T] | None] = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, items)
        return [item for rank_items in gathered for item in rank_items or []]

    def barrier(self) -> None:
        torch.distributed.barrier()

    def close(self) -> None:
        """Release the engine (idempotent). The process group stays for the next stage's engine: every rank
        leaves it once, at the end of the process (grpo.trainer.ranks.leave_process_group)."""
        if not self._closed:
            self._closed = True
            self.engine.destroy()


def saved_ranks(folder: Path) -> int | None:
    """How many ranks wrote the ZeRO checkpoint in `folder` (one optimizer shard each); None if none is there.

    For checkpoints from before trainer_state.json recorded the world size.
    """
    return len(list(folder.glob("*optim_states.pt"))) or None


def model_states_file(folder: Path) -> Path | None:
    """Rank 0's model-states file in a ZeRO checkpoint (ZeRO-3 writes one per rank, ZeRO-1/2 one in all)."""
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if (folder / name).is_file():
            return folder / name
    return None
