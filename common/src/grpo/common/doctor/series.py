"""What the doctor's rules read and return: a finding, the run's settings, and one metric's values step by step.

Pure floats over the rows the trainer writes to metrics.jsonl (one JSON object per step, grpo.trainer.metrics):
no torch, no I/O, so the `grpo` command and the trainer itself can both run the rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MetricRows = Sequence[Mapping[str, object]]

# Trend rules compare the run's first and last fifth: a window that short still follows the run, and one of at
# least MIN_WINDOW steps keeps a single noisy step from deciding.
WINDOW_FRACTION = 0.2
MIN_WINDOW = 5
# Below two windows of MIN_WINDOW steps a trend cannot be told from step-to-step noise: trend rules stay silent.
MIN_TREND_STEPS = 2 * MIN_WINDOW


@dataclass(frozen=True)
class Finding:
    """One symptom found: what it is, the steps and numbers that show it, and the setting to change.

    `settings` names the settings the remedy changes: the trainer's own field names (TrainerSettings), or
    `rollout.<field>` (RolloutSettings) and `stack.<key>` (the `grpo up` stack file) for the others.
    """

    rule: str
    symptom: str
    evidence: str
    remedy: str
    settings: tuple[str, ...]
    steps: tuple[int, int]  # the first and last step of the evidence


@dataclass(frozen=True)
class RunSettings:
    """The settings a rule's verdict or remedy depends on, as the run resolved them; None: not known (a run folder
    without its config, or a trainer started by hand), and the rule then says what it could not check."""

    beta: float | None = None
    ref_refresh_steps: int | None = None  # 0: never
    group_size: int | None = None
    max_staleness: int | None = None
    refill_zero_variance: bool | None = None


@dataclass(frozen=True)
class Series:
    """One metric's finite values in step order (the last row of a step wins: a resumed step is logged again)."""

    key: str
    steps: tuple[int, ...]
    values: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.values)

    def head(self, n: int) -> Series:
        return Series(self.key, self.steps[:n], self.values[:n])

    def tail(self, n: int) -> Series:
        return Series(self.key, self.steps[-n:], self.values[-n:]) if n > 0 else self.head(0)

    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else math.nan

    @property
    def span(self) -> tuple[int, int]:
        return (self.steps[0], self.steps[-1]) if self.steps else (0, 0)

    def at_steps(self, steps: Sequence[int]) -> Series:
        """The values of these steps only (those the series has)."""
        wanted = set(steps)
        kept = [(s, v) for s, v in zip(self.steps, self.values, strict=True) if s in wanted]
        return Series(self.key, tuple(s for s, _ in kept), tuple(v for _, v in kept))

    def describe(self, spec: str = ".3g") -> str:
        """'rollout/truncation_rate 0.42 (mean, steps 81–100)'."""
        first, last = self.span
        where = f"step {first}" if first == last else f"steps {first}–{last}"
        return f"{self.key} {format(self.mean(), spec)} ({'mean, ' if len(self) > 1 else ''}{where})"


def series(rows: MetricRows, key: str) -> Series:
    """`key`'s finite numeric values over `rows`, one per step in step order (NaN, inf and text are left out)."""
    by_step: dict[int, float] = {}
    for row in rows:
        value, step = row.get(key), row.get("step")
        if isinstance(value, bool) or not isinstance(value, int | float) or not isinstance(step, int):
            continue
        if math.isfinite(value):
            by_step[step] = float(value)
    steps = tuple(sorted(by_step))
    return Series(key, steps, tuple(by_step[s] for s in steps))


def window(n: int) -> int:
    """The length of the first and last windows of an n-step series."""
    return max(MIN_WINDOW, round(n * WINDOW_FRACTION))


def first_and_last(s: Series) -> tuple[Series, Series] | None:
    """The series' first and last windows; None when it is too short to show a trend."""
    if len(s) < MIN_TREND_STEPS:
        return None
    n = window(len(s))
    return s.head(n), s.tail(n)


def worst_window(s: Series, highest: bool = True) -> Series | None:
    """The MIN_WINDOW consecutive steps with the highest (or lowest) mean: a sustained episode anywhere in the run,
    where a single step could be noise; None when the series is shorter than one window."""
    if len(s) < MIN_WINDOW:
        return None
    starts = range(len(s) - MIN_WINDOW + 1)
    means = [sum(s.values[i : i + MIN_WINDOW]) for i in starts]
    best = (max if highest else min)(starts, key=means.__getitem__)
    return Series(s.key, s.steps[best : best + MIN_WINDOW], s.values[best : best + MIN_WINDOW])


def whole_span(rows: MetricRows) -> tuple[int, int]:
    """The first and last step of the rows."""
    steps = [s for s in (row.get("step") for row in rows) if isinstance(s, int)]
    return (min(steps), max(steps)) if steps else (0, 0)
