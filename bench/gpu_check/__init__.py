"""GPU checks of our trainer and rollout code on one CUDA device (runs on CPU too: cuda-only parts are skipped).

Five independent checks (one failing does not stop the others), each reporting numbers:
  1. learner_precision  one GRPO update of the Learner in bf16 (autocast) and in fp32: losses, gradient norms and
                        directions, parameter updates, step time.
  2. sampler_logprobs   the hf engine samples in bf16; the trainer recomputes the same tokens' log-probs (bf16 and
                        fp32): |diff| and importance ratio − 1.
  3. deepspeed_zero     the DeepSpeed backend, ZeRO-2 and ZeRO-3 on one device (world size 1, one subprocess per
                        stage), against the plain torch backend: loss, grad norm, updated parameters, step times.
  4. engine_throughput  hf engine generation tokens/s on the device (bf16 and fp32) and on the CPU.
  5. weight_push        the trainer's weights pushed into a rollout replica on the device through the real path
                        (push_to_replicas -> gRPC UpdateWeights, stream and data port): parameters equal, greedy
                        generation equals the trainer model's, push time.
Writes <out>/gpu_check.json (every number), <out>/gpu_check.log, and <out>/deepspeed_stage{2,3}.log.

Usage, from the repo root: scripts/gpu_carry.sh builds .gpu-carry/ (the packages and model the GPU image lacks),
carried to the GPU machine, where
  export PYTHONPATH=common/src:services/trainer/src:services/rollout/src:.gpu-carry/site
  python3 bench/gpu_check --out "$OUT"
(results of 2026-12-04 on an H200: bench/results/gpu_check.json, docs/gpu-check.md).
Here:  .venv/bin/python bench/gpu_check --device cpu --out /tmp/gpucheck

One module per check (learner_precision.py, ... weight_push.py, each with the helpers only it uses), what they
share in shared.py, the run's environment in environment.py, and the driver (flags, JSON, summary) in runner.py.
"""
