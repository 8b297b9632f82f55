"""Task accounting, admission control and group triage: pure, checkpointed, unit-tested.

Invariant (checked every step, exported as a metric): every published task is exactly one of
trained, dropped (with a reason) or in flight:  published == trained + Σ dropped + in_flight.

How a killed trainer resumes with nothing lost and nothing trained twice
-----------------------------------------------------------------------
* Task ids come from the data cursor (`<run>-e<epoch>-<index>`), so the same prompt gets the
  same id after a resume. The checkpoint holds this Accounting (counts + the in-flight map)
  and the cursor, written atomically together with the model and optimizer.
* The trainer acks a group in Redis only *after* a checkpoint that records its outcome is on
  disk. Groups consumed after the last checkpoint therefore stay in the trainer's pending list
  (PEL), and groups written while the trainer was down stay undelivered in the stream.
* On resume the trainer first re-reads its own PEL, then new entries. A group whose task is in
  the restored in-flight map is triaged normally: that is exactly the set of tasks the restored
  model has not yet learned from, so a group trained before the crash (after the checkpoint) is
  trained again *from the checkpointed weights*: once in the surviving lineage.
* Tasks published after the checkpoint are re-published from the restored cursor with the same
  ids. A group whose id is not in flight (its twin from before the crash, a rollout retry that
  slipped through) is a `duplicate`: counted and acked, never trained. Duplicates are groups,
  not tasks, so they are reported beside the invariant, not inside it.
* Weight versions keep increasing across a resume (replicas reject older versions): the trainer
  pushes its restored weights as a new version and records an alias (checkpoint version, new
  version). `lineage_staleness` measures staleness along the surviving lineage.
* A group made by weights of the discarded lineage (versions between an alias pair) teaches the
  restored model nothing it can use, but its task is not lost: the group is `superseded` (acked,
  counted beside the invariant like a duplicate) and the task stays in flight. When the books hold a
  newer publication of the task (the restored cursor republished it), that one's group is awaited;
  otherwise the task is published again (`regenerate`), at most MAX_REGENERATIONS times.
* A task whose group never comes (Redis lost it) is dropped as `timeout` after
  `group_timeout_s`, so no run waits forever.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from grpo.common.signal import no_spread
from grpo.trainer.errors import RunError

DROP_REASONS = ("zero_variance", "stale", "failed", "unscored", "timeout")
# Every verdict a group can get in a step's collection (triage's, plus "timeout" for a group that never came):
# each is logged every step as groups/<verdict>, 0 when none.
GROUP_VERDICTS = ("train", "duplicate", "superseded", "regenerate", *DROP_REASONS)
MAX_REGENERATIONS = 3  # a task whose groups keep coming from discarded weights is then dropped as stale


class AccountingError(RuntimeError):
    """The books do not balance: a bug, never an expected condition."""


@dataclass(frozen=True)
class InFlight:
    """A published task whose group has not been resolved yet."""

    task_id: str
    policy_version: int  # of its latest publication
    batch: int
    published_s: float
    regenerations: int = 0  # publications after the first (see `regenerate`)


@dataclass
class Accounting:
    """Counts of published, trained and dropped tasks, the tasks in flight, and batch bookkeeping."""

    published: int = 0
    trained: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    superseded: int = 0  # groups made by the weights of a discarded lineage (their tasks stay in flight)
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    batches_published: int = 0
    # (old, new): version `new` holds the same weights as `old`; versions in between were discarded.
    version_aliases: list[tuple[int, int]] = field(default_factory=list)
    # Outcomes since the last ledger write (task id, outcome); not checkpointed (see ledger.py).
    recent: list[tuple[str, str]] = field(default_factory=list)

    @property
    def n_in_flight(self) -> int:
        return len(self.in_flight)

    def publish(self, task_id: str, policy_version: int, batch: int, now: float) -> None:
        if task_id in self.in_flight:
            raise AccountingError(f"task {task_id} published twice while in flight")
        self.in_flight[task_id] = InFlight(task_id, policy_version, batch, now)
        self.published += 1

    def republish(self, task_id: str, policy_version: int, now: float) -> None:
        """An in-flight task was published again (same id); its timeout restarts. Not a new task."""
        task = self.in_flight[task_id]
        self.in_flight[task_id] = InFlight(task_id, policy_version, task.batch, now, task.regenerations + 1)

    def resolve(self, task_id: str, outcome: str) -> InFlight:
        """Mark an in-flight task trained (`outcome == "trained"`) or dropped for `outcome`."""
        if outcome != "trained" and outcome not in DROP_REASONS:
            raise AccountingError(f"unknown drop reason {outcome!r}; known: {DROP_REASONS}")
        task = self.in_flight.pop(task_id, None)
        if task is None:
            raise AccountingError(f"task {task_id} resolved but not in flight")
        if outcome == "trained":
            self.trained += 1
        else:
            self.dropped[outcome] += 1
        self.recent.append((task_id, outcome))
        return task

    def expired(self, now: float, timeout_s: float) -> list[str]:
        """In-flight task ids published more than `timeout_s` ago."""
        return [t.task_id for t in self.in_flight.values() if now - t.published_s > timeout_s]

    def balanced(self) -> bool:
        return self.published == self.trained + sum(self.dropped.values()) + self.n_in_flight

    def check(self) -> None:
        if not self.balanced():
            raise AccountingError(
                f"accounting broken: published {self.published} != trained {self.trained} + dropped "
                f"{sum(self.dropped.values())} + in flight {self.n_in_flight}"
            )

    def summary(self) -> dict[str, float]:
        """Flat numbers for metrics and the status API."""
        out: dict[str, float] = {
            "tasks/published": self.published,
            "tasks/trained": self.trained,
            "tasks/in_flight": self.n_in_flight,
            "tasks/duplicates": self.duplicates,
            "tasks/superseded": self.superseded,
            "tasks/balanced": float(self.balanced()),
        }
        for reason in DROP_REASONS:
            out[f"tasks/dropped/{reason}"] = self.dropped.get(reason, 0)
        return out

    def to_state(self, now: float) -> dict[str, Any]:
        """JSON-able state; in-flight ages are stored relative to `now` (clocks differ after a restart)."""
        return {
            "published": self.published,
            "trained": self.trained,
            "dropped": dict(self.dropped),
            "duplicates": self.duplicates,
            "superseded": self.superseded,
            "batches_published": self.batches_published,
            "version_aliases": [list(a) for a in self.version_aliases],
            "in_flight": [{**asdict(t), "published_s": t.published_s - now} for t in self.in_flight.values()],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], now: float) -> Accounting:
        """Restore; in-flight tasks get their age back relative to this process's clock."""
        acct = cls(
            published=int(state["published"]),
            trained=int(state["trained"]),
            dropped=Counter({k: int(v) for k, v in state["dropped"].items()}),
            duplicates=int(state["duplicates"]),
            superseded=int(state.get("superseded", 0)),  # absent in checkpoints of earlier releases
            batches_published=int(state["batches_published"]),
            version_aliases=[(int(a), int(b)) for a, b in state["version_aliases"]],
        )
        for t in state["in_flight"]:
            acct.in_flight[t["task_id"]] = InFlight(
                t["task_id"], int(t["policy_version"]), int(t["batch"]), now + float(t["published_s"]),
                int(t.get("regenerations", 0)),
            )  # fmt: skip
        acct.check()
        return acct


def batches_to_publish(batches_published: int, updates_done: int, max_staleness: int, total_steps: int) -> int:
    """How many new batches admission control allows now.

    Batch b is consumed by update b; at most max_staleness+1 batches may be ahead of the
    updates, so with max_staleness=0 batch k+1 is published only after update k pushed weights.
    """
    limit = min(updates_done + max_staleness + 1, total_steps)
    return max(0, limit - batches_published)


def lineage_staleness(policy_version: int, weight_version: int, aliases: list[tuple[int, int]]) -> int | None:
    """Policy updates between the weights that generated a group and the current policy.

    None when `weight_version` belongs to a discarded lineage (see `discarded`) or is from the future.
    """
    if weight_version > policy_version or discarded(weight_version, aliases):
        return None
    staleness = policy_version - weight_version
    for old, new in aliases:
        if weight_version <= old and new <= policy_version:
            staleness -= new - old
    return staleness


def discarded(weight_version: int, aliases: list[tuple[int, int]]) -> bool:
    """True for a version between an alias pair: pushed by a trainer that crashed before checkpointing it."""
    return any(old < weight_version < new for old, new in aliases)


@dataclass(frozen=True)
class GroupFacts:
    """What triage needs from a group record (converted from protobuf at the edge)."""

    group_id: str
    status: str
    weight_version: int
    rewards: tuple[float | None, ...]
    policy_version: int = 0  # the version its task was published under
    # What the zero-variance filter compares (consumer.zero_variance_signal); the rewards when empty.
    signal: tuple[float, ...] = ()


def triage(
    group: GroupFacts,
    acct: Accounting,
    policy_version: int,
    max_staleness: int,
    skip_zero_variance: bool,
    group_size: int | None = None,
    probe_size: int = 0,
) -> str:
    """`train`, `duplicate`, `superseded`, `regenerate`, or a drop reason, for one group (does not change `acct`).

    With adaptive group size (probe_size) a group of probe_size samples is a probe the rollout did not widen: it is
    zero-variance (or unscored), never trained; one whose signal varies is malformed (failed)."""
    task = acct.in_flight.get(group.group_id)
    if task is None:
        return "duplicate"
    if discarded(group.weight_version, acct.version_aliases):
        if task.policy_version > group.policy_version:
            return "superseded"  # a later publication of the task is out; its group will come
        return "regenerate" if task.regenerations < MAX_REGENERATIONS else "stale"
    if group.status != "ok":
        return "failed"
    probe = bool(probe_size) and len(group.rewards) == probe_size
    if group_size is not None and len(group.rewards) != group_size and not probe:
        return "failed"  # a malformed group (wrong sample count) cannot be normalised with the others
    if not group.rewards or any(r is None for r in group.rewards):
        # A sample the verifier could not judge has no reward; guessing 0 would be a fake signal.
        return "unscored"
    staleness = lineage_staleness(policy_version, group.weight_version, acct.version_aliases)
    if staleness is None or staleness > max_staleness:
        return "stale"
    signal = group.signal or [r for r in group.rewards if r is not None]
    if skip_zero_variance and no_spread(signal):
        return "zero_variance"
    return "failed" if probe else "train"


@dataclass
class StepQuota:
    """How many resolutions the current step still owes, and the refill budget (DAPO dynamic sampling)."""

    need: int
    refill_budget: int = 0
    refills: int = 0

    def on_resolved(self, outcome: str) -> bool:
        """Account one resolved task; True when a refill task should be published for it."""
        self.need -= 1
        if outcome == "zero_variance" and self.refill_budget > 0:
            self.refill_budget -= 1
            self.refills += 1
            self.need += 1
            return True
        return False

    @property
    def done(self) -> bool:
        return self.need <= 0


def resolved_groups(outcomes: Mapping[str, int]) -> int:
    """Groups that settled their task (trained or dropped); duplicates and superseded groups settle none."""
    return sum(n for verdict, n in outcomes.items() if verdict == "train" or verdict in DROP_REASONS)


def describe_failures(reasons: Mapping[str, int]) -> str:
    """`3× "invalid task: …"; 1× "…"`: each distinct reason once, the most frequent first (quoted as written: a repr
    doubled every backslash of a gold the reason quotes)."""
    return "; ".join(f'{n}× "{reason}"' for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class FailureStreak:
    """Steps in a row in which every group that resolved had failed, and their reasons.

    Such a run trains nothing and would end "done" with the starting model as its final one: the rollout or the
    reward service refuses its tasks (a setting over the rollout's cap, a weight naming no check) and retrying
    cannot help. After `limit` such steps the run fails, naming the reasons.
    """

    limit: int
    steps: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, outcomes: Mapping[str, int], failures: Mapping[str, int]) -> None:
        """Count one step's triage `outcomes` (verdict -> groups) and its failed groups' `failures` (reason -> n);
        raises RunError once `limit` steps in a row failed every group."""
        resolved = resolved_groups(outcomes)
        if resolved == 0 or outcomes.get("failed", 0) < resolved:
            self.steps, self.reasons = 0, Counter()
            return
        self.steps += 1
        self.reasons.update(failures)
        if self.steps >= self.limit:
            raise RunError(
                f"every group failed for {self.steps} steps in a row, so nothing was trained; the rollout "
                f"reported: {describe_failures(self.reasons)}. Fix the cause and start the run again "
                "(max_failed_steps sets how many such steps end a run)"
            )
