"""Difficulty buckets: each prompt's pass rate across its groups, and which prompts the sampler passes over.

A row is `easy` once every sample of `skip_solved_after` groups in a row solved it, `hard` once `set_aside_after`
groups in a row had no sample that solved it, `medium` when seen otherwise, `unseen` before its first judged group.
An easy or hard row is set aside at the epoch of the group that put it there and skipped by the sampler for the next
`revisit_after_epochs` epochs; then it is drawn again, and that group decides anew (one more all-solved group keeps
an easy row easy; one solved sample makes a hard row medium). So nothing is left out for ever.

Predicted flat groups (`skip_flat_above`): the rows that come back flat are mostly not settled ones but rows near the
ends whose G samples agree by chance (a row 7/8 solved makes an 8/8 group a quarter of the time). The row's last
judged group gives its pass rate a posterior, Beta(1 + solved, 1 + missed), and the chance that its next group of the
same size is flat is E[p^G] + E[(1 - p)^G] under it; a row at or above the threshold is set aside as easy and hard
rows are, for revisit_after_epochs epochs, then drawn again.

Adaptive group size (`probe_size`): a row's task carries a probe (a few of G first, the rest only where they disagree)
when its record says the probe pays: k samples are flat more often than G (a row 7/8 solved makes 4 of 4 right
nearly half the time, 8 of 8 a quarter), so probing costs fewer samples on flat groups only where k·P(flat of k) <
G·P(flat of G) under the row's posterior: rows last solved 0, 1, 7 or 8 times in 8; not unseen rows, unless
`probe_all`. A flat probe is the row's last group like any other (its posterior is from k samples; the flat
prediction is for G), and it moves the streaks as a group does.

Curriculum (`bucket_weights`): a draw that is not set aside is taken with its row's bucket's weight (in [0, 1]; 1
when unnamed), decided by a hash of (seed, epoch, position), so a resumed run takes the same draws.

Solved means the sample's correctness score (math or code, grpo.trainer.consumer.correctness) is 1. A group with a
sample that has no correctness (a reward-model row) counts its samples but moves no streak: such rows are never
skipped. Pure and JSON-able: the state goes into the checkpoint, so a resumed run skips what an uninterrupted one
would.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

BUCKETS = ("easy", "medium", "hard", "unseen")
SOLVED = 1.0 - 1e-9  # a correctness score at least this solves the prompt (math is 0/1; code: every test passed)


@dataclass
class RowRecord:
    """One row's history across its judged groups."""

    solved_streak: int = 0  # groups in a row in which every sample solved it
    unsolved_streak: int = 0  # groups in a row in which no sample solved it
    groups: int = 0
    samples: int = 0
    correct: int = 0
    last_step: int = -1
    last_epoch: int = -1
    aside_epoch: int = -1  # the epoch of the group that made it easy or hard (-1: never set aside)
    last_solved: int = 0  # the last judged group's samples that solved it, and its size: the flat prediction's data
    last_size: int = 0


@dataclass(frozen=True)
class BucketRules:
    """When a row is easy or hard, and for how long the sampler passes it over (0 turns a rule off)."""

    skip_solved_after: int = 0
    set_aside_after: int = 0
    revisit_after_epochs: int = 1
    weights: tuple[tuple[str, float], ...] = ()  # curriculum: (bucket, share of its draws taken); unnamed: 1
    skip_flat_above: float = 0.0  # set aside a row whose next group is predicted flat with at least this chance
    probe_size: int = 0  # adaptive group size: the probe (0: whole groups), sent where the row's record says it pays
    probe_all: bool = False  # ... or on every task, unseen rows included
    group_size: int = 0  # G: the size predictions are made for (a row's last group may be a probe's); 0: its own

    @property
    def active(self) -> bool:
        return (self.skip_solved_after > 0 or self.set_aside_after > 0 or self.skip_flat_above > 0
                or bool(self.weights) or self.probe_size > 0)  # fmt: skip

    def weight(self, bucket: str) -> float:
        return dict(self.weights).get(bucket, 1.0)


def flat_chance(solved: int, size: int, new: int | None = None) -> float:
    """The chance that a new group of `new` samples (default: `size`) is flat (all solve or none does) for a row whose
    last group of `size` samples had `solved` solving ones: E[p^n] + E[(1 - p)^n] with p ~ Beta(1 + solved,
    1 + size - solved), the pass rate's posterior from a uniform prior. E[p^n] under Beta(a, b) is the product of
    (a + i) / (a + b + i) for i < n."""
    a, b = 1.0 + solved, 1.0 + size - solved
    all_solve = none_solve = 1.0
    for i in range(size if new is None else new):
        all_solve *= (a + i) / (a + b + i)
        none_solve *= (b + i) / (a + b + i)
    return all_solve + none_solve


def probe_pays(solved: int, size: int, probe: int, group: int) -> bool:
    """Whether a probe of `probe` samples is expected to spend fewer samples on a flat group than the whole `group`
    (probe · P(flat of probe) < group · P(flat of group)) for a row whose last group of `size` had `solved` right.
    At G 8, probe 4: rows last solved 0, 1, 7 or 8 times (and after a flat probe of 4); not 2-6."""
    return probe * flat_chance(solved, size, probe) < group * flat_chance(solved, size, group)


def uniform(seed: int, epoch: int, index: int) -> float:
    """A number in [0, 1) that depends only on the draw's position (and the seed): the curriculum's coin."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass
class DifficultyTracker:
    """Per-row records keyed by row index (the data's order), and the rules that read them."""

    rules: BucketRules
    records: dict[int, RowRecord] = field(default_factory=dict)
    seed: int = 0  # the run's: the curriculum's coin

    def bucket(self, row: int) -> str:
        rec = self.records.get(row)
        if rec is None or rec.groups == 0:
            return "unseen"
        if self.rules.skip_solved_after and rec.solved_streak >= self.rules.skip_solved_after:
            return "easy"
        if self.rules.set_aside_after and rec.unsolved_streak >= self.rules.set_aside_after:
            return "hard"
        return "medium"

    def skips(self, row: int, epoch: int, index: int = 0) -> bool:
        """Whether the sampler passes over `row` when it comes up in `epoch` at position `index`: easy or hard, and
        set aside fewer than revisit_after_epochs epochs before it (a row set aside in epoch e comes back in
        e + revisit + 1); else, with bucket_weights, unless the draw's coin falls under its bucket's weight."""
        bucket = self.bucket(row)
        if bucket in ("easy", "hard") and epoch <= self.records[row].aside_epoch + self.rules.revisit_after_epochs:
            return True
        if self.predicts_flat(row) and epoch <= self.records[row].last_epoch + self.rules.revisit_after_epochs:
            return True
        weight = self.rules.weight(bucket)
        return weight < 1.0 and uniform(self.seed, epoch, index) >= weight

    def predicts_flat(self, row: int) -> bool:
        """Whether skip_flat_above sets `row` aside: its last judged group predicts a flat next one at least that
        likely."""
        rec = self.records.get(row)
        return (self.rules.skip_flat_above > 0 and rec is not None and rec.last_size > 0
                and flat_chance(rec.last_solved, rec.last_size, self.rules.group_size or None)
                >= self.rules.skip_flat_above)  # fmt: skip

    def probes(self, row: int, group: int) -> bool:
        """Whether `row`'s next task of `group` samples carries the probe: probe_all, or its last judged group says
        the probe pays (probe_pays); a row without one (unseen, or no correctness) samples whole groups."""
        if self.rules.probe_size <= 0:
            return False
        if self.rules.probe_all:
            return True
        rec = self.records.get(row)
        return (rec is not None and rec.last_size > 0
                and probe_pays(rec.last_solved, rec.last_size, self.rules.probe_size, group))  # fmt: skip

    def observe(self, row: int, epoch: int, step: int, correctness: Sequence[float | None]) -> str:
        """Record one group of `row` drawn in `epoch` and settled at `step`; returns the bucket it had before (the
        bucket its group is reported under)."""
        before = self.bucket(row)
        rec = self.records.setdefault(row, RowRecord())
        rec.samples += len(correctness)
        rec.last_step, rec.last_epoch = max(rec.last_step, step), max(rec.last_epoch, epoch)
        if not correctness or any(c is None for c in correctness):
            return before  # nothing judges it: no streak moves, so the row is never skipped
        solved = [c is not None and c >= SOLVED for c in correctness]
        rec.groups += 1
        rec.correct += sum(solved)
        rec.solved_streak = rec.solved_streak + 1 if all(solved) else 0
        rec.unsolved_streak = rec.unsolved_streak + 1 if not any(solved) else 0
        rec.last_solved, rec.last_size = sum(solved), len(solved)
        if self.bucket(row) in ("easy", "hard"):
            rec.aside_epoch = max(rec.aside_epoch, epoch)
        return before

    def counts(self, n_rows: int) -> dict[str, int]:
        """Rows per bucket, every bucket named (0 when none)."""
        counts = Counter(self.bucket(r) for r in self.records if r < n_rows)
        counts["unseen"] += n_rows - sum(counts.values())
        return {b: counts.get(b, 0) for b in BUCKETS}

    def to_state(self) -> dict[str, Any]:
        return {"records": {str(r): asdict(rec) for r, rec in sorted(self.records.items())}}

    @classmethod
    def from_state(cls, rules: BucketRules, state: dict[str, Any] | None, seed: int = 0) -> DifficultyTracker:
        """A tracker with `rules` and the records a checkpoint kept (None: a fresh one)."""
        records = {int(r): RowRecord(**{k: int(v) for k, v in rec.items()}) for r, rec in (state or {}).get(
            "records", {}).items()}  # fmt: skip
        return cls(rules, records, seed)


def bucket_metrics(
    tracker: DifficultyTracker, n_rows: int, skipped: int, groups: Sequence[tuple[str, float, float | None]]
) -> dict[str, float]:
    """buckets/<bucket> (rows in it now), buckets/skipped (draws passed over this step), buckets/predicted_flat (rows
    whose last group predicts a flat next one, with skip_flat_above) and, per bucket the step's
    judged groups were in when they came, buckets/<bucket>/reward_mean and /accuracy. `groups`: (bucket, mean reward,
    mean correctness or None) of each."""
    out: dict[str, float] = {f"buckets/{b}": float(n) for b, n in tracker.counts(n_rows).items()}
    out["buckets/skipped"] = float(skipped)
    if tracker.rules.skip_flat_above > 0:
        out["buckets/predicted_flat"] = float(sum(tracker.predicts_flat(r) for r in tracker.records if r < n_rows))
    for b in BUCKETS:
        mine = [g for g in groups if g[0] == b]
        if mine:
            out[f"buckets/{b}/reward_mean"] = sum(g[1] for g in mine) / len(mine)
            judged = [g[2] for g in mine if g[2] is not None]
            if judged:
                out[f"buckets/{b}/accuracy"] = sum(judged) / len(judged)
    return out
