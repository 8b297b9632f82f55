"""MetricsSink: one `log(step, metrics)` fanned out to TensorBoard, a JSONL file, Prometheus and W&B."""

from __future__ import annotations

import json
import logging
import math
import re
import time
import weakref
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger(__name__)

_PROM_BAD = re.compile(r"[^a-zA-Z0-9_]")
# Gauges per registry, not per sink: the stages of one run log through successive sinks into one /metrics.
_GAUGES: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Gauge | None]] = weakref.WeakKeyDictionary()


def prometheus_name(key: str, prefix: str = "grpo_trainer_") -> str:
    """'reward/mean' → 'grpo_trainer_reward_mean' (Prometheus allows [a-zA-Z0-9_:] only)."""
    return prefix + _PROM_BAD.sub("_", key).strip("_")


class MetricsSink:
    """Fan-out of per-step scalar metrics. Each target is optional; non-finite values are kept in JSONL only.

    tensorboard_dir: SummaryWriter event files. jsonl_path: one JSON object per step (appended, so a
    resumed run continues the file). prometheus_registry: gauges named grpo_trainer_<key>, served by
    the service's /metrics; a gauge holds the last value logged for its key. The run logs its counts (groups/*,
    tasks/*, push/*) every step, 0 included, so those gauges are always the last step's; keys that exist only when
    there is something to measure (eval/* on evaluation steps, train/* after an update, rollout/* and
    staleness/* when groups came) keep the value of the last step that had one. wandb_project: used only when `wandb` is installed and the project is set.
    start_step: the step the run (re)starts from; rows and events logged after it by a lost lineage
    (steps done after the checkpoint a crashed run resumes from) are removed, so each step is written once.
    """

    def __init__(
        self,
        *,
        tensorboard_dir: Path | str | None = None,
        jsonl_path: Path | str | None = None,
        prometheus_registry: CollectorRegistry | None = None,
        wandb_project: str | None = None,
        wandb_run_name: str | None = None,
        run_config: dict[str, Any] | None = None,
        start_step: int | None = None,
    ) -> None:
        self._tb = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if start_step is None else start_step + 1  # TensorBoard hides events from purge_step on
            self._tb = SummaryWriter(log_dir=str(tensorboard_dir), purge_step=purge)
        self._jsonl = None
        if jsonl_path is not None:
            path = Path(jsonl_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            if start_step is not None:
                drop_rows_after(path, start_step)
            self._jsonl = path.open("a", encoding="utf-8")
        self._registry = prometheus_registry
        self._wandb = _init_wandb(wandb_project, wandb_run_name, run_config) if wandb_project else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record `metrics` for `step` in every configured target."""
        if self._jsonl is not None:
            record = {"step": step, "time": round(time.time(), 3), **{k: _jsonable(v) for k, v in metrics.items()}}
            self._jsonl.write(json.dumps(record, sort_keys=True) + "\n")
            self._jsonl.flush()
        finite = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        if self._tb is not None:
            for key, value in finite.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._registry is not None:
            for key, value in finite.items():
                gauge = self._gauge(key)
                if gauge is not None:
                    gauge.set(value)
        if self._wandb is not None:
            self._wandb.log(finite, step=step)

    def _gauge(self, key: str) -> Gauge | None:
        """The key's gauge; None (warned once) when its Prometheus name is another key's: keys made of task types
        (task/<type>/...) may differ only in characters Prometheus does not allow ("a-b" and "a_b")."""
        assert self._registry is not None
        gauges = _GAUGES.setdefault(self._registry, {})
        if key not in gauges:
            name = prometheus_name(key)
            taken = next((k for k, g in gauges.items() if g is not None and prometheus_name(k) == name), None)
            if taken is not None:
                log.warning("metric %r is not exported to Prometheus: its name %s is %r's (it stays in metrics.jsonl "
                            "and TensorBoard); rename the task type", key, name, taken)  # fmt: skip
                gauges[key] = None
            else:
                gauges[key] = Gauge(name, f"trainer metric {key}", registry=self._registry)
        return gauges[key]

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def drop_rows_after(path: Path, step: int) -> int:
    """Rewrite the JSONL at `path` without rows whose step is > `step` (atomically); the number removed.

    Lines that do not parse go too: a trainer killed mid-write leaves a cut last line, which must neither
    stop the restart nor have the next row appended onto it."""
    if not path.exists():
        return 0
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    steps = [_row_step(line) for line in lines]
    kept = [line for line, s in zip(lines, steps, strict=True) if s is not None and s <= step]
    unreadable = sum(s is None and bool(line.strip()) for line, s in zip(lines, steps, strict=True))
    if unreadable:
        log.warning("%s: dropping %d line(s) that are not a JSON row (a write cut short)", path, unreadable)
    if len(kept) == len(lines) and (not text or text.endswith("\n")):
        return 0
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
    return len(lines) - len(kept)


def _row_step(line: str) -> int | None:
    """The step of one JSONL row; None for a line that is not a JSON object (blank, or cut short)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return int(row.get("step", 0)) if isinstance(row, dict) else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible as strings
    return value


def _init_wandb(project: str, name: str | None, config: dict[str, Any] | None) -> Any:
    try:
        import wandb
    except ImportError:
        log.warning("wandb_project=%r is set but wandb is not installed: not logging to W&B", project)
        return None
    return wandb.init(project=project, name=name, config=config or {})
