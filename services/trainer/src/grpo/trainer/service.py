"""Wire the trainer process together: servers up, the run (grpo or sft) in the main thread, clean exit."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry

from grpo.common.api_servers import api_servers
from grpo.common.signals import exit_at_once
from grpo.trainer.checkpoint import checkpoint_step, latest_checkpoint
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.data import DataError
from grpo.trainer.errors import RunError
from grpo.trainer.export import final_model_saved
from grpo.trainer.grpc_api import register
from grpo.trainer.http_api import http_routes
from grpo.trainer.ranks import env_rank, env_world_size, leave_process_group
from grpo.trainer.report import evaluated, last_row_at

log = logging.getLogger(__name__)


def install_signal_handlers(control: RunControl) -> None:
    """SIGTERM/SIGINT: finish the current step, checkpoint, exit; a second signal exits at once.

    While rank 0 is still starting (loading a large model takes minutes) there is nothing to keep: exit
    at once. Ranks > 0 always wait for rank 0, whose final checkpoint needs them.
    """

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if control.status().phase == "starting" and env_rank() == 0:
            exit_at_once(signum, "start-up")
        if control.stopping:
            log.warning("second signal %d: exiting without a final checkpoint", signum)
            os._exit(130)
        log.info("signal %d: finishing the current step, then checkpointing", signum)
        control.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def quiet_deepspeed_on_cpu() -> None:
    """DeepSpeed (ours, or imported by transformers when it saves a model, as building the tiny one does) prints
    a plain-text warning that it "was unable to detect" a GPU: say CPU first, so the log stays one JSON event a line."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def serve(settings: TrainerSettings, control: RunControl | None = None) -> int:
    """Run the configured mode with the gRPC and HTTP APIs up; returns the process exit code.

    main() has checked the ports and quietened DeepSpeed already, before torch and the model load."""
    import torch

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    try:
        return follow_rank(settings) if env_rank() > 0 else lead(settings, control)
    finally:
        leave_process_group()  # once per process: the stages of a staged run share the group


def lead(settings: TrainerSettings, control: RunControl | None) -> int:
    """Rank 0 (or the only process): the APIs up, the run in this thread; returns the process exit code."""
    control = control or RunControl(settings.run_id, settings.steps)
    registry = CollectorRegistry()
    grpc_server, http = api_servers(
        settings, register(control), ["grpo.v1.TrainerService"], http_routes(control, registry), "trainer-http"
    )
    grpc_server.start()
    http.start()
    log.info("trainer %s: %s, gRPC %d, HTTP %d", settings.run_id, run_description(settings), grpc_server.port,
             http.port)  # fmt: skip
    code = 0
    try:
        run_mode(settings, control, registry)
        if settings.when_done == "serve" and control.status().phase == "done":
            log.info("the run is done; serving its status until stopped (--when-done serve)")
            control.stop_event.wait()
    except (DataError, RunError) as exc:  # the user's file or settings: one clear line, no traceback
        log.error("the run failed: %s", exc)
        control.update(phase="failed", error=str(exc))
        code = 1
    except Exception as exc:
        log.exception("the run failed")
        control.update(phase="failed", error=f"{type(exc).__name__}: {exc}")
        code = 1
    finally:
        control.fail_pending_requests("the run has ended")
        http.stop()
        grpc_server.stop()
    return code


def run_description(settings: TrainerSettings) -> str:
    """What the run does, for its start-up line: each stage's own mode (a staged run's top-level mode is only the
    default its stages override), and a preset only where GRPO uses one (SFT and rejection sampling have none)."""

    def mode(values: dict[str, Any]) -> str:
        name = values.get("mode", settings.mode)
        if name in ("sft", "rejection_sampling"):  # no update, or none a preset shapes
            return str(name)
        return f"{name}, preset {values.get('preset', settings.preset)}"

    if settings.stages:
        parts = "; ".join(f"{i}: {mode(stage)}" for i, stage in enumerate(settings.stages, 1))
        return f"{len(settings.stages)} stages ({parts})"
    return f"mode {mode({})}"


def run_mode(settings: TrainerSettings, control: RunControl, registry: CollectorRegistry) -> None:
    """The run: its stages in order, or the one run; a finished run's summary.json and report go to output_dir."""
    from grpo.trainer.stages import run_stages, write_single_report

    make_output_dir(settings.output_dir)  # before the model loads: a folder that cannot be made fails at once
    if settings.stages:
        run_stages(settings, control, lambda stage: run_single(stage, control, registry))
        return
    began = time.monotonic()
    run_single(settings, control, registry)
    if control.status().phase == "done":  # also a run finished earlier: its report is rewritten, never lost
        write_single_report(settings, time.monotonic() - began)


def run_single(settings: TrainerSettings, control: RunControl, registry: CollectorRegistry) -> None:
    """One sft, grpo or rejection_sampling run (or stage): resumed, finished from its last checkpoint, or found
    finished."""
    make_output_dir(settings.output_dir)  # a stage's own folder too, before its model loads
    if settings.mode == "rejection_sampling":
        run_rejection_sampling(settings, control, registry)
        return
    finished = finished_run(settings)
    if finished:
        log.warning("%s", finished)
        control.update(phase="done", step=settings.steps, total_steps=settings.steps)
        return
    last = end_checkpoint(settings)
    if last is not None and not final_evaluation_lost(settings):  # every step done, stopped before final/
        save_final_from(settings, control, last)
        return
    if settings.mode == "sft":
        from grpo.trainer.sft import run_sft

        run_sft(settings, control, registry)
        return
    from grpo.trainer.run import GrpoRun

    run = GrpoRun(settings, control, registry)
    try:
        run.run()
    finally:
        run.close()


def run_rejection_sampling(settings: TrainerSettings, control: RunControl, registry: CollectorRegistry) -> None:
    """Rank 0 samples alone (there is no update to share); on several ranks it then releases the followers, which
    wait for it (follow_rank), telling them whether the stage finished."""
    from grpo.trainer import rejection_run

    if env_world_size() <= 1:
        rejection_run.run_rejection_sampling(settings, control, registry)
        return
    rejection_run.rank_store()  # the followers form the process group here if no earlier stage did
    try:
        rejection_run.run_rejection_sampling(settings, control, registry)
    finally:
        rejection_run.tell_followers(settings.stage, control.status().phase == "done")


def make_output_dir(path: Path) -> None:
    """Create the run's output folder (or find it), writable; RunError naming it otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunError(f"output_dir {path}: cannot create it ({exc.strerror or exc})") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise RunError(f"output_dir {path}: not a writable folder")


def end_checkpoint(s: TrainerSettings) -> Path | None:
    """The checkpoint to resume from when it has done every step (else None)."""
    if s.resume == "never":
        return None
    path = latest_checkpoint(s.output_dir / "checkpoints") if s.resume == "auto" else Path(s.resume)
    if path is None or checkpoint_step(path) < s.steps:
        return None
    return path


def finished_run(s: TrainerSettings) -> str | None:
    """What to tell the operator when the run has done every step and written its final model (else None).

    Re-running a finished run would load the model, wait for replicas and exit 0 having done nothing.
    """
    path = end_checkpoint(s)
    if path is None or not final_model_saved(s.output_dir / "final"):
        return None
    return (
        f"run {s.run_id!r} has finished: checkpoint {path} is at step {checkpoint_step(path)} of {s.steps} "
        f"(final model: {s.output_dir / 'final'}); nothing to do. To train further raise --steps (it resumes "
        "from there); to start again use --resume never or another --output-dir"
    )


def final_evaluation_lost(s: TrainerSettings) -> bool:
    """A GRPO run with eval data whose last step has no finished evaluation: no metrics row (the trainer was
    killed after the last checkpoint, in the final evaluation) or a row without eval/accuracy (a stop cut the
    evaluation short). GrpoRun then redoes that evaluation on the checkpoint's weights (on replicas, through
    Redis) before it writes final/."""
    if s.mode != "grpo" or not s.eval_data:
        return False
    return not evaluated(last_row_at(s.output_dir / "metrics.jsonl", s.steps))


def save_final_from(s: TrainerSettings, control: RunControl, path: Path) -> None:
    """Write final/ from the last checkpoint: what a trainer stopped after its final evaluation missed.

    No Redis, no replicas: the rest of the run's end is done.
    """
    from grpo.trainer.assemble import build_learner
    from grpo.trainer.ranks import RankDriver

    log.warning("run %r: checkpoint %s has done all %d steps but the final model was never written; writing %s "
                "from it", s.run_id, path, s.steps, s.output_dir / "final")  # fmt: skip
    control.update(phase=s.mode, step=checkpoint_step(path), total_steps=s.steps)
    learner = RankDriver(build_learner(s), s.model)
    try:
        learner.load(path)
        learner.save_final(s.output_dir / "final")
    finally:
        learner.close()  # releases the follower ranks, which mirror the load and the save, and the engine
    control.update(phase="done")


def follow_rank(settings: TrainerSettings) -> int:
    """A DeepSpeed rank > 0: build the same learner, then mirror rank 0's collective operations."""
    from grpo.trainer.assemble import build_learner
    from grpo.trainer.ranks import follow
    from grpo.trainer.rejection_run import await_rank0
    from grpo.trainer.stages import plan_stages, read_outcome

    if settings.stages:  # rank 0 runs the unfinished stages in order; so do we
        for stage in plan_stages(settings):
            if read_outcome(stage) is None:
                if stage.mode == "rejection_sampling":  # rank 0 samples alone; we wait for it
                    if not await_rank0(stage.settings.stage):
                        return 0  # rank 0 stopped inside the stage
                    continue
                follow_rank(stage.settings)
                if not final_model_saved(stage.folder / "final"):
                    return 0  # rank 0 stopped inside the stage (it writes final/ before releasing us)
        return 0
    if settings.mode == "rejection_sampling":
        await_rank0(settings.stage)
        return 0
    if finished_run(settings):  # rank 0 says so and returns without a collective call
        return 0
    learner = build_learner(settings)
    try:
        follow(learner, settings.model)
    finally:
        learner.close()
    return 0
