"""Check 5, weight_push: the trainer's weights pushed into a rollout replica on the device through the real path
(push_to_replicas -> gRPC UpdateWeights, stream and data port): parameters equal, greedy generation equals the
trainer model's, push time."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from gpu_check.shared import Ctx, encode_prompts, make_learner, prompt_texts, synthetic_batch, timed

if TYPE_CHECKING:
    import torch

# A greedy step whose top-2 logits are closer than this may flip with float reordering (sdpa vs eager, KV cache).
NEAR_TIE = 1e-3


def greedy_reference(
    model: torch.nn.Module, prompt: list[int], max_new: int, eos_ids: set[int], device: torch.device
) -> tuple[list[int], list[float]]:
    """Greedy tokens of `model` (full forward each step, no cache, no padding) and each step's top-2 logit margin."""
    import torch

    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    tokens: list[int] = []
    margins: list[float] = []
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            top = torch.topk(logits, 2)
            token = int(top.indices[0])
            tokens.append(token)
            margins.append(float(top.values[0] - top.values[1]))
            if token in eos_ids:
                break
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
    return tokens, margins


def compare_greedy(got: list[list[int]], expected: list[tuple[list[int], list[float]]]) -> dict[str, Any]:
    """Rows that match exactly; for the others, where they first differ and the reference's top-2 margin there."""
    mismatches = []
    for row, (tokens, (ref, margins)) in enumerate(zip(got, expected, strict=True)):
        if tokens == ref:
            continue
        at = next((i for i, (a, b) in enumerate(zip(tokens, ref, strict=False)) if a != b), min(len(tokens), len(ref)))
        margin = margins[at] if at < len(margins) else float("nan")
        mismatches.append(
            {"row": row, "first_diff_at": at, "ref_top2_margin": margin, "len_got": len(tokens), "len_ref": len(ref)}
        )
    return {"rows": len(got), "rows_equal": len(got) - len(mismatches), "mismatches": mismatches}


def replica_max_diff(engine_weights: dict[str, torch.Tensor], pushed: dict[str, torch.Tensor]) -> dict[str, float]:
    """Largest |replica − pushed| over every tensor: as pushed (cast to the replica's dtype) and against fp32."""
    worst_cast, worst_fp32 = 0.0, 0.0
    missing = sorted(set(engine_weights) ^ set(pushed))
    if missing:
        raise AssertionError(f"replica and pushed tensors differ in names: {missing[:5]}")
    for name, live in engine_weights.items():
        sent = pushed[name].to(live.device)
        worst_cast = max(worst_cast, float((live - sent.to(live.dtype)).abs().max()))
        worst_fp32 = max(worst_fp32, float((live.float() - sent.float()).abs().max()))
    return {"max_abs_diff_vs_cast": worst_cast, "max_abs_diff_vs_fp32": worst_fp32}


def check_weight_push(ctx: Ctx) -> dict[str, Any]:
    """Trainer weights -> a replica on the device through push_to_replicas (gRPC stream, then the data port)."""
    from grpo.common.grpc_server import GrpcServer
    from grpo.common.weights.codec import nbytes, specs_of
    from grpo.common.weights.data_port import WeightDataPort
    from grpo.rollout.engines.base import SamplingParams
    from grpo.rollout.engines.hf import HFEngine
    from grpo.rollout.grpc_api import SERVICE_NAME, register
    from grpo.rollout.service import RolloutService
    from grpo.trainer.pusher import ReplicaTarget, push_to_replicas

    sz = ctx.sizes
    result: dict[str, Any] = {}
    problems: list[str] = []
    trainer = make_learner(ctx, "auto")  # bf16 autocast on a GPU, fp32 on a CPU: the trainer's default
    batch = synthetic_batch(sz, ctx.vocab, seed=1)
    for _ in range(2):
        trainer.step(batch)  # the weights move away from the checkpoint the replicas load
    result["trainer_precision"] = trainer.backend.precision
    servers: list[Any] = []
    services: list[Any] = []

    def replica(dtype: str) -> tuple[Any, str, int]:
        service = RolloutService(HFEngine(ctx.model, dtype=dtype, device=str(ctx.device)), ctx.model, f"gpu-{dtype}")
        server = GrpcServer(register(service), [SERVICE_NAME], "127.0.0.1", 0, workers=4)
        server.start()
        service.grpc_port = server.port
        service.data_port = WeightDataPort("127.0.0.1", 0)
        servers.append(server)
        services.append(service)
        return service, f"127.0.0.1:{server.port}", service.data_port.port

    def push(service: Any, address: str, data_port: int, version: int) -> dict[str, Any]:
        gather_s, tensors = timed(ctx.device, trainer.state_dict_for_push)
        pushed = {k: v.detach().clone() for k, v in tensors.items()}  # views of live parameters: keep a copy
        size = sum(nbytes(*spec) for spec in specs_of(tensors).values())
        seconds, results = timed(
            ctx.device,
            lambda: push_to_replicas(
                [ReplicaTarget(service.replica_id, address, data_port)], tensors, version, timeout_s=60, retries=0
            ),
        )
        r = results[0]
        entry = {
            "via": "data port" if data_port else "grpc stream",
            "ok": r.ok,
            "error": r.error,
            "version": r.version,
            "replica_version": service.version,
            "bytes": size,
            "gather_s": gather_s,
            "push_s": seconds,
            "push_result_s": r.seconds,
            "mb_per_s": size / 2**20 / seconds,
            **replica_max_diff(service.engine.weights(), pushed),
        }
        if not r.ok or service.version != version:
            problems.append(f"push of v{version} via {entry['via']} to {service.replica_id} failed: {r.error}")
        return entry

    try:
        # fp32 replica: it must hold exactly the trainer's fp32 weights and generate what the trainer's model does
        service, address, data_port = replica("float32")
        engine = service.engine
        prompts = encode_prompts(engine.tokenizer, prompt_texts(sz.greedy_prompts, seed=2))
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=sz.greedy_tokens)

        def replica_greedy() -> list[list[int]]:
            return [o.samples[0].token_ids for o in service.generate(prompts, greedy)[0]]

        before = replica_greedy()
        entry = push(service, address, 0, 1)
        if entry["max_abs_diff_vs_cast"] != 0.0:
            problems.append(f"fp32 replica differs from the pushed weights by {entry['max_abs_diff_vs_cast']:.2e}")
        after = replica_greedy()
        expected = [greedy_reference(trainer.model, p, sz.greedy_tokens, engine.eos_ids, ctx.device) for p in prompts]
        match = compare_greedy(after, expected)
        entry["greedy_vs_trainer_model"] = match
        entry["greedy_rows_changed_by_push"] = sum(a != b for a, b in zip(after, before, strict=True))
        if [m for m in match["mismatches"] if not m["ref_top2_margin"] < NEAR_TIE]:
            problems.append(
                f"fp32 replica's greedy output differs from the trainer model's in "
                f"{len(match['mismatches'])}/{match['rows']} rows: {match['mismatches'][:2]}"
            )
        result["fp32_replica_stream"] = entry
        trainer.step(batch)
        entry = push(service, address, data_port, 2)
        if entry["max_abs_diff_vs_cast"] != 0.0:
            problems.append(f"fp32 replica (data port) differs by {entry['max_abs_diff_vs_cast']:.2e}")
        result["fp32_replica_data_port"] = entry
        # the copy alone, device to device, as a floor for the push time
        tensors = trainer.state_dict_for_push()
        result["engine_load_weights_s"], _ = timed(ctx.device, lambda: engine.load_weights(tensors))

        # bf16 replica (what a GPU rollout serves): the fp32 weights cast on the way in
        service16, address16, data_port16 = replica("bfloat16")
        entry = push(service16, address16, data_port16, 1)
        if entry["max_abs_diff_vs_cast"] != 0.0:
            problems.append(f"bf16 replica differs from the cast pushed weights by {entry['max_abs_diff_vs_cast']:.2e}")
        expected = [greedy_reference(trainer.model, p, sz.greedy_tokens, engine.eos_ids, ctx.device) for p in prompts]
        got = [o.samples[0].token_ids for o in service16.generate(prompts, greedy)[0]]
        entry["greedy_vs_fp32_trainer_model_info"] = compare_greedy(got, expected)  # bf16 rounding: informational
        result["bf16_replica_data_port"] = entry
    finally:
        for server in servers:
            server.stop(0)
        for service in services:
            service.close()
        gc.collect()
    s, d = result["fp32_replica_stream"], result["fp32_replica_data_port"]
    g = s["greedy_vs_trainer_model"]
    result["problems"] = problems
    result["summary"] = (
        f"fp32 max|Δ| {s['max_abs_diff_vs_cast']:.1e}/{d['max_abs_diff_vs_cast']:.1e}, greedy "
        f"{g['rows_equal']}/{g['rows']} rows equal, push {1000 * s['push_s']:.0f} ms stream / "
        f"{1000 * d['push_s']:.0f} ms data port ({s['bytes'] / 2**20:.1f} MiB); bf16 max|Δ| "
        f"{result['bf16_replica_data_port']['max_abs_diff_vs_cast']:.1e}"
    )
    return result
