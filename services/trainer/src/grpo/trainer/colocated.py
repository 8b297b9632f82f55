"""Colocated mode: the trainer hosts a rollout replica in its own process, generating from the policy it trains.

What TRL's `vllm_mode="colocate"` and veRL's hybrid engine give one-GPU users, on our contract: the replica is the
rollout service's own code (its gRPC and HTTP servers, its Redis worker, the registry), built around the
learner's module instead of a model of its own (grpo.rollout.engines.shared). So there is one model in memory and
no weight transfer; everything else (tasks, groups, books, faults) is the same as with separate replicas, which
the trainer may have as well.

Generation and update take turns: every change to the weights (an optimizer step, a resume, a new version
number) runs with the replica's engine paused, and the replica's version moves on before generation resumes,
so no sample mixes two versions and every sample's version is the one that generated it. The trainer never
pushes to this replica (ReplicaSync.holds asks it), and the replica refuses pushes from anyone else.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo.trainer.colocated_settings import replica_settings
from grpo.trainer.pusher import record_pushed
from grpo.trainer.ranks import RankDriver

if TYPE_CHECKING:
    from grpo.rollout.settings import RolloutSettings
    from grpo.trainer.checkpoint import CheckpointInfo
    from grpo.trainer.config import TrainerSettings
    from grpo.trainer.learner.batch import SftPair, TrainableSample

log = logging.getLogger(__name__)


class ColocatedRollout:
    """The rollout service in this process on the learner's module: servers, Redis worker, engine lock."""

    def __init__(self, settings: RolloutSettings, model: Any, device: Any, output_dir: Path) -> None:
        from transformers import AutoTokenizer

        from grpo.rollout.__main__ import run_worker_logged, start
        from grpo.rollout.engines.shared import SHARED, SharedHFEngine

        assert settings.model is not None  # replica_settings sets it
        self.engine = SharedHFEngine(model, AutoTokenizer.from_pretrained(settings.model), device)
        self.output_dir = output_dir
        self.grpc, self.http, self.service = start(settings, self.engine)
        self.service.updates.refusal = f"replica {settings.replica_id} is colocated with its trainer: {SHARED}"
        self.stopping = threading.Event()
        self.worker = threading.Thread(target=run_worker_logged, args=(self.service, settings, self.stopping),
                                       name="colocated-rollout", daemon=True)  # fmt: skip
        self.worker.start()
        log.info("colocated rollout replica %s: gRPC %d, HTTP %d, generating from the learner's module",
                 settings.replica_id, self.grpc.port, self.http.port)  # fmt: skip

    @property
    def replica_id(self) -> str:
        return self.service.replica_id

    @property
    def version(self) -> int:
        """The version the replica generates under (the learner's, once the last change was told)."""
        return self.service.version

    @contextlib.contextmanager
    def changing_weights(self, version_after: Callable[[], int]) -> Iterator[None]:
        """Generation waits while inside; on a clean exit the replica takes `version_after()` (recorded as pushed
        first, as a push would: a restarted trainer numbers its versions above it)."""
        with self.service.paused():
            yield
            version = version_after()
            if version != self.service.version:
                record_pushed(self.output_dir, version)
                self.service.load_weights(version, in_process_checksum(version), {})

    def close(self) -> None:
        self.stopping.set()
        self.worker.join(timeout=30)
        self.grpc.set_serving(False)
        self.grpc.stop(grace=2)
        self.http.stop()
        self.service.close()


def in_process_checksum(version: int) -> str:
    """What a colocated replica reports as its weights' checksum after an update: a label, not a sha256.

    Its weights are the learner's own tensors, so they cannot differ from what the trainer holds at that version; a
    checksum guards bytes that travel. Hashing them cost every update a copy to the host and ~0.5 s per GB
    (sha256 at ~1.9 GB/s here: ~7 s a step for a 7B model in bf16)."""
    return f"in-process-v{version}"


class ColocatedDriver(RankDriver):
    """The learner's handle when it shares its module with a colocated replica: every change to the weights
    pauses the replica's generation, and tells it the version after."""

    def __init__(self, driver: RankDriver, rollout: ColocatedRollout) -> None:
        super().__init__(driver.learner, driver.model)
        self.rollout = rollout

    def _changing(self) -> contextlib.AbstractContextManager[None]:
        return self.rollout.changing_weights(lambda: self.learner.version)

    def set_version(self, version: int) -> None:
        with self._changing():
            super().set_version(version)

    def step(self, samples: list[TrainableSample]) -> dict[str, float]:
        with self._changing():
            return super().step(samples)

    def sft_step(self, pairs: list[SftPair]) -> dict[str, float]:
        with self._changing():
            return super().sft_step(pairs)

    def load(self, path: Path | str) -> CheckpointInfo:
        with self._changing():
            return super().load(path)

    def close(self) -> None:
        self.rollout.close()
        super().close()


def colocate(s: TrainerSettings, driver: RankDriver) -> ColocatedDriver:
    """Start the replica on `driver`'s module (after any resume: it joins with the restored weights)."""
    from grpo.common.tiny_model import resolve_model

    if driver.world > 1:
        raise ValueError("colocate: one trainer process only (the replica shares rank 0's module); run several "
                         "ranks with separate replicas")  # fmt: skip
    learner = driver.learner
    settings = replica_settings(s, resolve_model(learner.config.model))
    return ColocatedDriver(driver, ColocatedRollout(settings, learner.model, learner.backend.device, s.output_dir))
