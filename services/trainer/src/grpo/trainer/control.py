"""The thread-safe meeting point of the training loop and the APIs: status snapshot, stop, checkpoint requests."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from grpo.common.readiness import Readiness


@dataclass(frozen=True)
class ReplicaView:
    replica_id: str
    address: str
    weight_version: int
    last_seen_s: float
    tasks_done: int = 0  # groups this replica has written (its registry entry; restarts from 0 with the replica)


@dataclass(frozen=True)
class StatusSnapshot:
    """What GetRunStatus and /v1/status report; replaced whole by the loop (readers never see half an update)."""

    run_id: str = ""
    phase: str = "starting"  # starting | sft | grpo | eval | done | failed
    step: int = 0
    total_steps: int = 0
    policy_version: int = 0
    tasks_published: int = 0
    groups_trained: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # tasks, by reason: published = trained + Σ + in_flight
    in_flight: int = 0
    duplicates: int = 0  # groups whose task was already settled (twins, retries): beside the books, not in them
    superseded: int = 0  # groups made by a discarded lineage's weights (their tasks stay in flight)
    replicas: tuple[ReplicaView, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""
    eval_history: tuple[tuple[int, float], ...] = ()  # (step, held-out accuracy) of this GRPO run's evaluations
    stage: str = ""  # "2/2 grpo" in a staged run
    stages: tuple[dict[str, Any], ...] = ()  # the finished stages' outcomes
    # The latest finished evaluation (step, its eval/* metrics), kept between evaluations: `metrics` is the last
    # step's, so a monitor polling between evaluation steps would otherwise never see a held-out accuracy.
    last_eval: tuple[int, dict[str, float]] | None = None
    # grpo doctor's findings on the run so far (live_doctor.LiveDoctor): {rule, symptom, evidence, remedy} each.
    doctor: tuple[dict[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The snapshot as /v1/status says it; GetRunStatus is the same document as a RunStatus (grpc_api)."""
        out = asdict(self)
        out["replicas"] = list(out["replicas"])
        out["eval_history"] = [{"step": s, "accuracy": a} for s, a in self.eval_history]
        out["stages"] = list(self.stages)
        out["doctor"] = [dict(f) for f in self.doctor]
        out["last_eval"] = None if self.last_eval is None else {"step": self.last_eval[0],
                                                                 "metrics": dict(self.last_eval[1])}  # fmt: skip
        return out


class RunControl:
    """Stop flag, checkpoint requests (answered by the loop between steps) and the status snapshot."""

    def __init__(self, run_id: str = "", total_steps: int = 0) -> None:
        self.stop_event = threading.Event()
        self._requests: queue.Queue[Future[tuple[str, int]]] = queue.Queue()
        self._lock = threading.Lock()
        self._status = StatusSnapshot(run_id=run_id, total_steps=total_steps)
        self.readiness = Readiness()  # what /readyz asks besides the phase (the run adds its Redis)

    # ---- status -------------------------------------------------------------------------
    def status(self) -> StatusSnapshot:
        with self._lock:
            return self._status

    def update(self, **changes: Any) -> None:
        with self._lock:
            self._status = replace(self._status, **changes)

    # ---- stop ---------------------------------------------------------------------------
    def request_stop(self) -> None:
        self.stop_event.set()

    @property
    def stopping(self) -> bool:
        return self.stop_event.is_set()

    # ---- checkpoints --------------------------------------------------------------------
    def request_checkpoint(self) -> Future[tuple[str, int]]:
        """A future the loop resolves with (path, step) after its next step boundary."""
        fut: Future[tuple[str, int]] = Future()
        if self.status().phase in ("done", "failed"):
            fut.set_exception(RuntimeError(f"the run is {self.status().phase}: no checkpoint can be taken"))
            return fut
        self._requests.put(fut)
        return fut

    def take_checkpoint_requests(self) -> list[Future[tuple[str, int]]]:
        out: list[Future[tuple[str, int]]] = []
        while True:
            try:
                fut = self._requests.get_nowait()
            except queue.Empty:
                return out
            if fut.set_running_or_notify_cancel():  # False: the caller gave up (deadline passed)
                out.append(fut)

    def fail_pending_requests(self, reason: str) -> None:
        for fut in self.take_checkpoint_requests():
            fut.set_exception(RuntimeError(reason))
