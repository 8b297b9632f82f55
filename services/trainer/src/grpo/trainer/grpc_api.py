"""TrainerService over gRPC: thin servicer methods over RunControl (status, checkpoint now, stop)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import grpc

from grpo.trainer.control import RunControl, StatusSnapshot
from grpo.v1 import trainer_pb2, trainer_pb2_grpc

log = logging.getLogger(__name__)
# A checkpoint waits for the current step to end: allow a long step, but never wait forever.
DEFAULT_CHECKPOINT_WAIT_S = 600.0


def to_proto(snap: StatusSnapshot) -> trainer_pb2.RunStatus:
    return trainer_pb2.RunStatus(
        run_id=snap.run_id,
        phase=snap.phase,
        step=snap.step,
        total_steps=snap.total_steps,
        policy_version=snap.policy_version,
        tasks_published=snap.tasks_published,
        groups_trained=snap.groups_trained,
        dropped={k: int(v) for k, v in snap.dropped.items()},
        in_flight=snap.in_flight,
        replicas=[
            trainer_pb2.ReplicaInfo(
                replica_id=r.replica_id, address=r.address, weight_version=r.weight_version, last_seen_s=r.last_seen_s
            )
            for r in snap.replicas
        ],
        metrics={k: float(v) for k, v in snap.metrics.items()},
        duplicates=snap.duplicates,
        superseded=snap.superseded,
        error=snap.error,
        eval_history=[trainer_pb2.EvalPoint(step=step, accuracy=acc) for step, acc in snap.eval_history],
        stage=snap.stage,
        stages=[_stage_proto(outcome) for outcome in snap.stages],
        last_eval=None if snap.last_eval is None else trainer_pb2.EvalResult(
            step=snap.last_eval[0], metrics={k: float(v) for k, v in snap.last_eval[1].items()}),
    )  # fmt: skip


def _stage_proto(outcome: dict[str, Any]) -> trainer_pb2.StageOutcome:
    return trainer_pb2.StageOutcome(
        index=int(outcome.get("index", 0)),
        mode=str(outcome.get("mode", "")),
        steps=int(outcome.get("steps") or 0),
        seconds=float(outcome.get("seconds") or 0.0),
        folder=str(outcome.get("folder", "")),
        outcome=str(outcome.get("outcome", "")),
    )


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, control: RunControl) -> None:
        self.control = control

    def GetRunStatus(
        self, request: trainer_pb2.GetRunStatusRequest, context: grpc.ServicerContext
    ) -> trainer_pb2.RunStatus:
        return to_proto(self.control.status())

    def SaveCheckpoint(
        self, request: trainer_pb2.SaveCheckpointRequest, context: grpc.ServicerContext
    ) -> trainer_pb2.SaveCheckpointResponse:
        remaining = context.time_remaining()
        wait_s = min(remaining, DEFAULT_CHECKPOINT_WAIT_S) if remaining is not None else DEFAULT_CHECKPOINT_WAIT_S
        fut = self.control.request_checkpoint()
        try:
            path, step = fut.result(timeout=wait_s)
        except FutureTimeout:
            fut.cancel()
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"the current step did not end within {wait_s:.0f}s")
        except RuntimeError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return trainer_pb2.SaveCheckpointResponse(path=path, step=step)

    def Stop(self, request: trainer_pb2.StopRequest, context: grpc.ServicerContext) -> trainer_pb2.StopResponse:
        log.info("Stop requested over gRPC: finishing the current step, then checkpointing")
        self.control.request_stop()
        return trainer_pb2.StopResponse(step=self.control.status().step)


def register(control: RunControl) -> Callable[[grpc.Server], None]:
    def add(server: grpc.Server) -> None:
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server(TrainerServicer(control), server)

    return add
