"""The order a run draws its rows in, and a resumable cursor over it: a seeded shuffle per epoch, or a weighted
mixture of its train_data files or task types."""

from __future__ import annotations

import functools
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

from grpo.trainer.data import DataError, PromptRow

if TYPE_CHECKING:
    from grpo.trainer.sources import Source

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataCursor:
    """Where the next prompt comes from: the epoch, the position in that epoch's shuffled order, the seed."""

    epoch: int = 0
    index: int = 0
    seed: int = 0

    def to_state(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, int]) -> DataCursor:
        return cls(**{k: int(v) for k, v in state.items()})


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The row order of one epoch: a permutation that depends only on (seed, epoch)."""
    return list(_permutation(n, seed, epoch))


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    # Cached: a run looks up the row of every group it settles (row_of), and a shuffle of 100k rows takes ~50 ms.
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tuple(order)


@dataclass(frozen=True)
class Mixture:
    """Weighted groups of a run's rows (its train_data files, or its task types). Each epoch has one draw per row;
    group g gets weight_g / sum(weights) of them (largest-remainder rounding), taken from its own endless stream of
    seeded permutations of its rows (each row once per pass), and the epoch's draws are then shuffled. The order
    depends only on (seed, epoch, the groups, the weights), so a task id's position finds its row after a resume."""

    names: tuple[str, ...]  # each group's name (a file, or a task type), for the logs and errors
    groups: tuple[tuple[int, ...], ...]  # each group's row indices
    weights: tuple[float, ...]
    _epochs: dict[tuple[int, int], list[int]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_rows(self) -> int:
        return sum(len(g) for g in self.groups)

    def counts(self) -> list[int]:
        """Each group's draws per epoch."""
        return shares(self.n_rows, self.weights)

    def epoch_order(self, seed: int, epoch: int) -> list[int]:
        """The rows drawn in epoch `epoch`, in order (a row may appear more than once, or not at all)."""
        order = self._epochs.get((seed, epoch))
        if order is None:  # a run reads one or two epochs at a time: a small cache spares a recomputation per task
            if len(self._epochs) >= 4:
                self._epochs.clear()
            order = mixed_order(self.groups, self.counts(), seed, epoch)
            self._epochs[(seed, epoch)] = order
        return order


def shares(n: int, weights: Sequence[float]) -> list[int]:
    """`n` draws split by `weights`: largest-remainder rounding of n × w / sum(w) (ties to the earlier group)."""
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    quotas = [n * w / total for w in exact]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda g: (counts[g] - quotas[g], g))
    for g in by_remainder[: n - sum(counts)]:
        counts[g] += 1
    return counts


def group_stream(rows: Sequence[int], seed: int, group: int, start: int, count: int) -> list[int]:
    """Positions [start, start + count) of group `group`'s endless stream: pass p is a permutation of its rows seeded
    by (seed, group, p), so each row comes once per pass."""
    out: list[int] = []
    position = start
    while len(out) < count:
        pass_index, offset = divmod(position, len(rows))
        permutation = list(rows)
        random.Random(f"{seed}:group{group}:pass{pass_index}").shuffle(permutation)
        chunk = permutation[offset : offset + count - len(out)]
        out += chunk
        position += len(chunk)
    return out


def mixed_order(groups: Sequence[Sequence[int]], counts: Sequence[int], seed: int, epoch: int) -> list[int]:
    """Epoch `epoch`'s draws: group g's positions [epoch × c_g, (epoch + 1) × c_g) of its stream, shuffled together
    with (seed, epoch)."""
    draws: list[int] = []
    for g, (rows, count) in enumerate(zip(groups, counts, strict=True)):
        draws += group_stream(rows, seed, g, epoch * count, count)
    random.Random(f"{seed}:{epoch}").shuffle(draws)
    return draws


def mixture_of(rows: Sequence[PromptRow], sources: Sequence[Source], task_weights: dict[str, float]) -> Mixture | None:
    """How the run draws `rows` (train_data's rows, joined in the list's order): by task_weights over task types, by
    the weights of a weighted train_data list over its files, or (None) as they come: `epoch_order`, a plain
    shuffle per epoch. DataError for a weight that names no task type of the data, a weighted file none of whose
    rows is left, or a group too light to get one draw per epoch (its rows would never be trained on)."""
    if task_weights:
        present = sorted({row.task_type for row in rows})
        unknown = sorted(set(task_weights) - set(present))
        if unknown:
            raise DataError(f"task_weights names {unknown}, but no train_data row has that task_type; the rows' task "
                            f"types: {present}")  # fmt: skip
        names = tuple(present)
        groups = tuple(tuple(i for i, row in enumerate(rows) if row.task_type == t) for t in present)
        weights = tuple(float(task_weights.get(t, 1.0)) for t in present)
        what = "task_type"
    elif any(source.weight is not None for source in sources):
        names = tuple(str(source.path) for source in sources)
        groups = tuple(tuple(i for i, row in enumerate(rows) if row.source == s) for s in range(len(sources)))
        weights = tuple(float(source.weight or 1.0) for source in sources)
        empty = [name for name, group in zip(names, groups, strict=True) if not group]
        if empty:
            raise DataError(f"train_data {empty[0]}: none of its rows is left to draw (overlong_prompts: drop left "
                            "them all out), so its weight cannot be met; fix or remove the file")  # fmt: skip
        what = "train_data file"
    else:
        return None
    mixture = Mixture(names, groups, weights)
    counts = mixture.counts()
    for name, weight, count in zip(names, weights, counts, strict=True):
        if count == 0:
            raise DataError(f"{what} {name} weighs {weight:g} of {sum(weights):g}: an epoch's {len(rows)} draws give "
                            "it none, so its rows would never be trained on; raise its weight")  # fmt: skip
    log.info("mixing by %s, draws per epoch of %d: %s", what, len(rows), ", ".join(
        f"{name} {count} ({100 * count / len(rows):.1f} %, {len(group)} rows)"
        for name, count, group in zip(names, counts, groups, strict=True)))  # fmt: skip
    return mixture


def draw_order(n_rows: int, seed: int, epoch: int, mixture: Mixture | None = None) -> list[int]:
    """Epoch `epoch`'s rows in order: the mixture's, or a plain permutation (epoch_order)."""
    if mixture is None:
        return epoch_order(n_rows, seed, epoch)
    if mixture.n_rows != n_rows:
        raise ValueError(f"the mixture holds {mixture.n_rows} rows, the data {n_rows}")
    return mixture.epoch_order(seed, epoch)


@dataclass(frozen=True)
class Taken:
    """What `take_eligible` drew: the (position key, row index) pairs, the advanced cursor, the draws it passed over,
    and whether it ran out of eligible rows (a whole epoch's worth of draws in a row skipped) and drew anyway."""

    picks: list[tuple[str, int]]
    cursor: DataCursor
    skipped: int = 0
    exhausted: bool = False


def take_eligible(
    cursor: DataCursor,
    n_rows: int,
    k: int,
    mixture: Mixture | None = None,
    skip: Callable[[int, int, int], bool] | None = None,
) -> Taken:
    """`take`, passing over each draw whose (row, epoch, index) `skip` says to skip (difficulty buckets): the cursor moves
    past it, no task is made of it. When a whole epoch's worth of draws (n_rows) comes up skipped in a row, every row
    is set aside: that draw and the rest are taken as they come (`exhausted`), so a run never spins through epochs
    without sampling."""
    if n_rows < 1:
        raise ValueError("cannot take from an empty dataset")
    out: list[tuple[str, int]] = []
    epoch, index, skipped, in_a_row, exhausted = cursor.epoch, cursor.index, 0, 0, False
    order = draw_order(n_rows, cursor.seed, epoch, mixture)
    while len(out) < k:
        if index >= n_rows:
            epoch, index = epoch + 1, 0
            order = draw_order(n_rows, cursor.seed, epoch, mixture)
        row = order[index]
        if skip is not None and not exhausted and skip(row, epoch, index):
            if in_a_row + 1 < n_rows:
                skipped, in_a_row, index = skipped + 1, in_a_row + 1, index + 1
                continue
            exhausted = True
        in_a_row = 0
        out.append((f"e{epoch}-{index}", row))
        index += 1
    return Taken(out, DataCursor(epoch=epoch, index=index, seed=cursor.seed), skipped, exhausted)


def take(
    cursor: DataCursor, n_rows: int, k: int, mixture: Mixture | None = None
) -> tuple[list[tuple[str, int]], DataCursor]:
    """The next `k` (position key, row index) pairs and the advanced cursor; wraps into new epochs (of n_rows draws,
    in the mixture's order when the run mixes its data).

    The position key `e<epoch>-<index>` is unique within a run and the same after a resume,
    so it makes a stable task id.
    """
    taken = take_eligible(cursor, n_rows, k, mixture)
    return taken.picks, taken.cursor
