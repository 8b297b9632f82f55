"""Evaluation cost: held-out problems through the services vs a plain in-process loop → bench/results/eval.json.

The trainer evaluates by publishing one G = 1 greedy task per problem and reading the groups back (Redis, a
rollout replica, the reward service; grpo.trainer.evaluation.evaluate), so the numbers measure the same code as
training. The reference is what TRL's users get in-process: the same model's transformers generate, greedy, in
batches of --batch prompts, then math-verify on each answer. Same problems (the demo's held-out split), same
max_new_tokens; the arms alternate so machine noise hits both. Target (issue 40): services ≤ 2 × in-process.
The model is the tiny one fitted briefly to the demo's worked answers (cached), so answers end where a trained
model's do and both arms' accuracies can be compared: greedy on the same weights, they must agree.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis
import torch
from math_verify import parse, verify
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.common.queue import RunQueue
from grpo.demo.task import extract_answer, make_splits, prompt_rows, sft_rows
from grpo.local.redis_server import RedisServer
from grpo.local.services import ServiceProc, start_reward, start_rollout
from grpo.trainer.consumer import GroupReader
from grpo.trainer.data import parse_row
from grpo.trainer.evaluation import evaluate
from grpo.trainer.publisher import TaskSpec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a script's path starts at bench/: the test models' trainer is shared with tests/
from tests.support.trained_model import fit, trained_once  # noqa: E402

log = logging.getLogger("bench_eval")
RECIPE = {"problems": 512, "steps": 300, "lr": 3e-3, "seed": 0}


def _sft(source: Path, target: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    torch.manual_seed(RECIPE["seed"])
    encoded = []
    for row in sft_rows(make_splits(n_sft=RECIPE["problems"], n_grpo=0, n_eval=0, seed=1).sft):
        p = tokenizer.encode(str(row["prompt"]), add_special_tokens=False)
        r = [*tokenizer.encode(str(row["response"]), add_special_tokens=False), tokenizer.eos_token_id]
        encoded.append((p + r, [-100] * len(p) + r))
    loss = fit(model, encoded, tokenizer.pad_token_id, RECIPE["lr"], RECIPE["steps"])
    log.info("bench model fitted to the demo's worked answers: final loss %.3f", loss)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def bench_model() -> str:
    return str(trained_once(Path.home() / ".cache" / "grpo" / "bench", "eval-model", RECIPE, _sft))


def in_process(model_path: str, prompts: list[str], golds: list[str], max_new_tokens: int, batch: int) -> float:
    """Accuracy of greedy answers, generated in batches of `batch` (left-padded); math-verify on the <answer>."""
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            enc = tokenizer(prompts[i : i + batch], return_tensors="pt", padding=True)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
            answers = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for gold, answer in zip(golds[i : i + batch], answers, strict=True):
                correct += bool(verify(parse(gold), parse(extract_answer(answer) or "")))
    return correct / len(prompts)


def through_services(queue: RunQueue, run_id: str, rows: list, max_new_tokens: int, round_id: str) -> dict[str, float]:
    spec = TaskSpec(group_size=1, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
                    reward_weights=(("math", 1.0),), apply_chat_template=False)  # fmt: skip
    return evaluate(GroupReader(queue, "bench"), rows, spec, run_id=run_id, round_id=round_id, policy_version=0,
                    temperature=0.0, timeout_s=600)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--problems", type=int, default=500)
    parser.add_argument("--max-new-tokens", type=int, default=24)  # the demo's
    parser.add_argument("--batch", type=int, default=64, help="the in-process loop's generate batch")
    parser.add_argument("--worker-batch-tasks", type=int, default=4, help="the replica's (its default)")
    parser.add_argument("--worker-eval-batch-tasks", type=int, default=64, help="the replica's (its default)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "eval.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)  # the replica's torch_threads 1; the reward service runs beside it
    model = bench_model()
    problems = make_splits(n_sft=0, n_grpo=0, n_eval=args.problems).eval
    raw = prompt_rows(problems, "eval")
    rows = [parse_row({**r, "checks": {"math": {"gold": p.gold}}}, f"row {i}") for i, (r, p) in
            enumerate(zip(raw, problems, strict=True))]  # fmt: skip
    prompts, golds = [p.prompt for p in problems], [p.gold for p in problems]
    logs = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    # "services_before": a replica batching evaluation tasks as training ones (worker_batch_tasks per engine call),
    # as every replica did before worker_eval_batch_tasks; its own run id, so its own queue.
    arms = {"services": args.worker_eval_batch_tasks, "services_before": args.worker_batch_tasks}
    times: dict[str, list[float]] = {"in_process": [], **{arm: [] for arm in arms}}
    with RedisServer() as server:
        reward: ServiceProc = start_reward(workers=1, log_path=logs / "reward.log")
        replicas = {arm: start_rollout("--model", model, "--redis-url", server.url, "--run", arm, "--reward-addr",
                                       reward.address, "--worker-batch-tasks", str(args.worker_batch_tasks),
                                       "--worker-eval-batch-tasks", str(size), log_dir=logs)
                    for arm, size in arms.items()}  # fmt: skip
        queues = {arm: RunQueue(redis.Redis.from_url(server.url), arm) for arm in arms}
        for queue in queues.values():
            queue.ensure_groups()
        try:
            for rep in range(args.reps):
                started = time.perf_counter()
                accuracy_ref = in_process(model, prompts, golds, args.max_new_tokens, args.batch)
                times["in_process"].append(time.perf_counter() - started)
                for arm, queue in queues.items():
                    started = time.perf_counter()
                    metrics = through_services(queue, arm, rows, args.max_new_tokens, str(rep))
                    times[arm].append(time.perf_counter() - started)
                    assert metrics["eval/completed"] == len(rows), metrics
                    # Greedy on the same weights: only a padding-dependent near-tie may flip an answer.
                    assert abs(metrics["eval/accuracy"] - accuracy_ref) <= 0.02, (metrics, accuracy_ref)
                log.info("rep %d: %s s; accuracy %.3f", rep, {k: round(v[-1], 2) for k, v in times.items()},
                         accuracy_ref)  # fmt: skip
        finally:
            for replica in replicas.values():
                replica.stop()
            reward.stop()
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "bench": "eval",
        "problems": args.problems,
        "max_new_tokens": args.max_new_tokens,
        "in_process_batch": args.batch,
        "worker_batch_tasks": args.worker_batch_tasks,
        "worker_eval_batch_tasks": args.worker_eval_batch_tasks,
        "seconds": times,
        "median_s": median,
        "ratio_services_over_in_process": median["services"] / median["in_process"],
        "ratio_services_before_over_in_process": median["services_before"] / median["in_process"],
        "target": "≤ 2.0",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log.info(
        "services / in-process = %.2f (target ≤ 2; before worker_eval_batch_tasks %.2f): %s",
        result["ratio_services_over_in_process"],
        result["ratio_services_before_over_in_process"],
        median,
    )


if __name__ == "__main__":
    main()
