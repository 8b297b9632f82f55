"""`grpo demo`: build the tiny model, cold-start SFT, then GRPO through the real services, then the report."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import logging.handlers
import multiprocessing
import queue
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from grpo.demo import live, sft_cache
from grpo.demo.config import DemoConfig
from grpo.demo.sft import SftResult
from grpo.local.procs import ChildFailed, Supervisor, log_tail
from grpo.local.stack import StackSpec, start_services

log = logging.getLogger(__name__)


def new_run_id() -> str:
    return "demo-" + datetime.now().strftime("%Y%m%d-%H%M%S")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def task_parts(cfg: DemoConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Callable[..., SftResult]]:
    """The task's GRPO rows, eval rows and cold start (base dir, out dir, SFT settings → SftResult)."""
    from grpo.demo import task, tool_task
    from grpo.demo.sft import run_sft
    from grpo.demo.tool_sft import run_tool_sft

    n_eval = max(cfg.eval_size, cfg.sft_eval_size)
    if cfg.task == "tool":
        tools = tool_task.make_splits(n_sft=cfg.n_sft, n_grpo=cfg.n_grpo, n_eval=n_eval, seed=cfg.seed)

        def tool_sft(base: Path, out: Path, common: dict[str, Any]) -> SftResult:
            return run_tool_sft(base, out, tools.sft, tools.eval[: cfg.sft_eval_size], **common)

        return (tool_task.prompt_rows(tools.grpo, "train"), tool_task.prompt_rows(tools.eval[: cfg.eval_size], "eval"),
                tool_sft)  # fmt: skip
    sums = task.make_splits(n_sft=cfg.n_sft, n_grpo=cfg.n_grpo, n_eval=n_eval, seed=cfg.seed)

    def sum_sft(base: Path, out: Path, common: dict[str, Any]) -> SftResult:
        return run_sft(base, out, sums.sft, sums.eval[: cfg.sft_eval_size], max_new_tokens=cfg.max_new_tokens, **common)

    return task.prompt_rows(sums.grpo, "train"), task.prompt_rows(sums.eval[: cfg.eval_size], "eval"), sum_sft


def prepare(cfg: DemoConfig, run_dir: Path, view: live.ViewState, refresh: Any) -> tuple[Path, float, dict[str, Any]]:
    """Model folder, data files and the SFT cold start; returns (sft model dir, the cold start's own held-out
    accuracy, sft info). That accuracy steers the cold start only (in-process greedy decoding, sft_eval_size
    problems): the run's "before" is the trainer's step-0 evaluation (see demo_report)."""
    import torch

    from grpo.demo.config import TOOL_ARCH
    from grpo.demo.model import build_model_folder

    torch.set_num_threads(1)  # one thread per process beats two on 2 shared cores
    train_rows, eval_rows, train_sft = task_parts(cfg)
    write_jsonl(run_dir / "data" / "train.jsonl", train_rows)
    write_jsonl(run_dir / "data" / "eval.jsonl", eval_rows)
    base = build_model_folder(run_dir / "model" / "base", seed=cfg.seed, **(TOOL_ARCH if cfg.task == "tool" else {}))
    view.phase, view.note = "sft", "cold start: worked examples until the accuracy threshold"
    refresh()

    def on_eval(point: dict[str, float]) -> None:
        view.step, view.eval_before = int(point["step"]), point["accuracy"]
        refresh()

    sft_dir, cached = run_dir / "model" / "sft", sft_cache.entry_dir(cfg.sft_settings())
    reused = sft_cache.load(cached, sft_dir) if cfg.reuse_sft else None
    if reused is not None:
        result = reused
        log.info("cold start: reusing the SFT model of an earlier run with these settings (%d steps, held-out "
                 "accuracy %.3f) from %s; --fresh-sft trains it again", result.steps, result.accuracy, cached)  # fmt: skip
    else:
        common: dict[str, Any] = dict(lr=cfg.sft_lr, batch_size=cfg.sft_batch, threshold=cfg.sft_threshold,
                                      max_steps=cfg.sft_max_steps, eval_every=cfg.sft_eval_every, seed=cfg.seed,
                                      on_eval=on_eval)  # fmt: skip
        result = train_sft(base, sft_dir, common)
        sft_cache.store(cached, sft_dir, result)
    view.eval_before = result.accuracy
    info = {"sft_steps": result.steps, "sft_seconds": round(result.seconds, 1), "sft_history": result.history,
            "sft_reused": reused is not None, "sft_accuracy": result.accuracy}  # fmt: skip
    return sft_dir, result.accuracy, info


def prepare_in_child(
    cfg: DemoConfig, run_dir: Path, view: live.ViewState, refresh: Any
) -> tuple[Path, float, dict[str, Any]]:
    """prepare() in a process of its own, so that this one never imports torch nor holds a model: it did, and kept
    ~590 MB RSS through the whole GRPO phase, the largest process of the demo's tree. The child's log records and
    its progress (the view's cold-start fields) come back over a queue; ChildFailed when it fails or dies."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of this one's state
    messages = context.Queue()
    child = context.Process(target=_prepare_child, args=(cfg, run_dir, messages), name="cold-start", daemon=True)
    child.start()
    try:
        while True:
            try:
                kind, payload = messages.get(timeout=0.5)
            except queue.Empty:
                if not child.is_alive():
                    raise ChildFailed(f"the cold start's process exited with code {child.exitcode}") from None
                continue
            if kind == "log":
                logging.getLogger(payload.name).handle(payload)
            elif kind == "view":
                for key, value in payload.items():
                    setattr(view, key, value)
                refresh()
            elif kind == "failed":
                raise ChildFailed(f"the cold start failed: {payload}")
            else:
                sft_dir, accuracy, info = payload
                return Path(sft_dir), accuracy, info
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()


COLD_START_VIEW = ("phase", "note", "step", "eval_before")  # what prepare() shows


class _ToQueue(logging.handlers.QueueHandler):
    def enqueue(self, record: logging.LogRecord) -> None:
        self.queue.put_nowait(("log", record))


def _prepare_child(cfg: DemoConfig, run_dir: Path, messages: Any) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_ToQueue(messages)]
    root.setLevel(logging.INFO)
    view = live.ViewState()

    def refresh() -> None:
        messages.put(("view", {key: getattr(view, key) for key in COLD_START_VIEW}))

    try:
        sft_dir, accuracy, info = prepare(cfg, run_dir, view, refresh)
    except BaseException as exc:
        messages.put(("failed", f"{type(exc).__name__}: {exc}"))
        raise
    messages.put(("done", (str(sft_dir), accuracy, info)))


def in_child(function: Callable[..., Any], *args: Any) -> Any:
    """function(*args) in a fresh process (spawn): what loads a model there leaves this one without it."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args).result()


def watch(
    sup: Supervisor, port: int, view: live.ViewState, refresh: Any, stall_s: float = 300.0, poll_s: float = 1.0
) -> None:
    """Follow the trainer until it exits; ChildFailed when a service dies or no step completes for stall_s."""
    trainer = next(c for c in sup.children if c.name == "trainer")
    progress, last_change = (-1, ""), time.monotonic()
    while trainer.alive():
        sup.check([c.name for c in sup.children if c.name != "trainer"])
        status = live.fetch_status(port)
        if status is not None:
            view.update(status)
            if status.get("phase") == "failed":
                raise trainer.failure(f"reported failure: {status.get('error')}")
            if (view.step, view.phase) != progress:
                progress, last_change = (view.step, view.phase), time.monotonic()
        if time.monotonic() - last_change > stall_s:
            tails = "\n".join(f"--- {c.name}:\n{log_tail(c.log_path, 8)}" for c in sup.children)
            raise ChildFailed(
                f"no progress for {stall_s:.0f}s at step {view.step} ({view.phase}); last log lines:\n{tails}"
            )
        refresh()
        time.sleep(poll_s)
    if trainer.proc.returncode != 0:
        raise trainer.failure(f"exited with code {trainer.proc.returncode}")


def grpo_phase(
    sup: Supervisor, cfg: DemoConfig, run_dir: Path, run_id: str, sft_dir: Path, view: live.ViewState, refresh: Any
) -> None:
    """Start Redis (unless given), reward, rollout replicas and the trainer on the SFT model; follow it to the end."""
    view.phase, view.note, view.step = "starting services", "redis, reward, rollout, trainer", 0
    # "Before GRPO" is the trainer's step-0 evaluation (ViewState.update), not the cold start's own measure.
    view.eval_before = None
    refresh()
    spec = StackSpec(
        run_id=run_id, run_dir=run_dir, redis_url=cfg.redis_url, replicas=cfg.replicas - cfg.colocate,
        colocate=cfg.colocate,
        rollout={"model": str(sft_dir), "worker_batch_tasks": cfg.worker_batch_tasks, "max_new_tokens_cap": 256},
        trainer=cfg.trainer_settings(
            model=str(sft_dir), train_data=str(run_dir / "data" / "train.jsonl"),
            eval_data=str(run_dir / "data" / "eval.jsonl"), redis_url="", run_id=run_id,
            output_dir=str(run_dir), grpc_port=0, http_port=0),
        start_timeout_s=cfg.start_timeout_s,
    )  # fmt: skip
    state = start_services(sup, spec)
    state.save()
    view.note = ""
    assert state.trainer_http is not None
    watch(sup, state.trainer_http, view, refresh, stall_s=cfg.stall_timeout_s)


def run_demo(
    cfg: DemoConfig, runs_dir: Path = Path("runs"), run_id: str | None = None, live_view: bool = True
) -> dict[str, Any]:
    """The whole demo; returns the summary (also in <run_dir>/summary.json). Every child is stopped on exit."""
    started = time.monotonic()
    run_id = run_id or new_run_id()
    run_dir = (runs_dir / run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    view = live.ViewState(note="building the tiny model")
    with Supervisor(run_dir / "logs") as sup, live.progress(view, "grpo demo", log, live_view) as refresh:
        sft_dir, _, sft_info = prepare_in_child(cfg, run_dir, view, refresh)
        grpo_phase(sup, cfg, run_dir, run_id, sft_dir, view, refresh)
    extra = {"run_id": run_id, "config": cfg.model_dump(), **sft_info}
    if cfg.task == "tool":
        models = {"sft": sft_dir, "final": run_dir / "final"}
        extra["in_process"] = log_tool_measures(in_child(tool_measures, cfg, models))
    return demo_report(run_dir, wall_seconds=time.monotonic() - started, extra=extra)


def tool_measures(cfg: DemoConfig, models: dict[str, Path]) -> dict[str, dict[str, float]]:
    """The tool task's in-process measures of each model (grpo.demo.tool_sft): on the sft_eval_size held-out
    problems, greedy, with the tool (print of arithmetic evaluated in-process) and without it."""
    from grpo.demo.tool_sft import measure_folder
    from grpo.demo.tool_task import make_splits

    n_eval = max(cfg.eval_size, cfg.sft_eval_size)
    problems = make_splits(n_sft=cfg.n_sft, n_grpo=cfg.n_grpo, n_eval=n_eval, seed=cfg.seed).eval[: cfg.sft_eval_size]
    return {name: measure_folder(path, problems) for name, path in models.items() if path.is_dir()}


def log_tool_measures(found: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    for name, m in found.items():
        log.info("%s model, in-process: %.3f with the tool (%.2f calls per episode, %.3f of them ran), %.3f without",
                 name, m["accuracy_with_tool"], m["calls_per_episode"], m["call_success"], m["accuracy_without_tool"])  # fmt: skip
    return found


def demo_report(run_dir: Path, *, wall_seconds: float, extra: dict[str, Any]) -> dict[str, Any]:
    """summary.json and report.md of a demo run. Before and after are both the trainer's evaluations (its step-0
    baseline and its last ones): the same eval_size problems, decoded by the rollout and scored by the reward
    service. The cold start's accuracy (in-process, on sft_eval_size problems, its own scorer) measures other
    problems another way, so it is kept as sft_accuracy and never compared with the after."""
    from grpo.trainer.report import write_report

    return write_report(run_dir, eval_before=None, wall_seconds=wall_seconds, extra=extra)
