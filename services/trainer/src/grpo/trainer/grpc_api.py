"""TrainerService over gRPC: thin servicer methods over RunControl (status, checkpoint now, stop)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout

import grpc
from google.protobuf import json_format

from grpo.trainer.control import RunControl, StatusSnapshot
from grpo.v1 import trainer_pb2, trainer_pb2_grpc

log = logging.getLogger(__name__)
# A checkpoint waits for the current step to end: allow a long step, but never wait forever.
DEFAULT_CHECKPOINT_WAIT_S = 600.0


def to_proto(snap: StatusSnapshot) -> trainer_pb2.RunStatus:
    """The status as /v1/status says it, read into the proto: one document, so the two APIs cannot drift. What the
    proto has no field for (a replica's tasks_done, a stage's loss curve) stays HTTP's."""
    return json_format.ParseDict(snap.to_json(), trainer_pb2.RunStatus(), ignore_unknown_fields=True)


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
