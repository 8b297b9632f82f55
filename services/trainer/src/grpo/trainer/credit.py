"""The credit registry: how a step's kept groups get their advantages, chosen by the `credit` setting.

An advantage estimator (grpo.algo.advantages.ADVANTAGE_MODES) maps a group's rewards to one advantage per
completion. A credit assignment starts from those and may give each token its own (`process`: step scores,
`vineppo`: values estimated by continuations). A new one (per-turn, per-step) is a `Credit` subclass and an
entry in CREDITS; the loop (run.py) asks the entry, never the name.

Why two modules: the math of credit is pure (grpo.algo.credit: floats in, floats out, no protos, no I/O, as the
algo package's import boundary requires). An assignment reads the groups as they came from Redis (GroupRecord
protos), and VinePPO's runs value rollouts through the queue, so the registry lives here, trainer side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grpo.algo import LossConfig
from grpo.trainer.consumer import process_credit, step_metrics
from grpo.trainer.vine import ValueRollouts
from grpo.v1 import queue_pb2

# Per group, per sample, per token; None for a group: its outcome advantage on every token.
TokenCredit = list[list[list[float]] | None]


@dataclass
class CreditParts:
    """What a credit assignment may use beyond the loss config: VinePPO's value rollouts (the queue, the reader)."""

    value_rollouts: ValueRollouts


class Credit:
    """Outcome credit (the base): every token of a completion gets the completion's advantage."""

    steps = False  # whether triage needs judged steps on every sample (consumer.facts_of's `steps`)

    def __init__(self, algo: LossConfig, parts: CreditParts) -> None:
        self.algo = algo

    def token_advantages(
        self, records: Sequence[queue_pb2.GroupRecord], outcome: Sequence[Sequence[float]], version: int, step: int
    ) -> TokenCredit:
        """Per-token advantages of each kept group (None: none of its own); `outcome[i]` are group i's advantages
        (one per sample), `version` the policy version and `step` the step (for what a wait says)."""
        return [None] * len(records)

    def train_metrics(self, records: Sequence[queue_pb2.GroupRecord]) -> dict[str, float]:
        """Metrics logged with the learner's (as train/<name>)."""
        return {}

    def metrics(self, records: Sequence[queue_pb2.GroupRecord]) -> dict[str, float]:
        """Metrics logged as named, after the train/ ones (called once per update, after it)."""
        return {}


class ProcessCredit(Credit):
    """Process supervision: per-step advantages from the step scores, mixed with the outcome (consumer.py)."""

    steps = True

    def token_advantages(
        self, records: Sequence[queue_pb2.GroupRecord], outcome: Sequence[Sequence[float]], version: int, step: int
    ) -> TokenCredit:
        return [process_credit(r, out, self.algo) for r, out in zip(records, outcome, strict=True)]

    def train_metrics(self, records: Sequence[queue_pb2.GroupRecord]) -> dict[str, float]:
        return step_metrics(records)


class VineCredit(Credit):
    """VinePPO: per-step advantages from values estimated by value rollouts (vine.py), the outcome unused."""

    def __init__(self, algo: LossConfig, parts: CreditParts) -> None:
        super().__init__(algo, parts)
        self.values = parts.value_rollouts

    def token_advantages(
        self, records: Sequence[queue_pb2.GroupRecord], outcome: Sequence[Sequence[float]], version: int, step: int
    ) -> TokenCredit:
        return list(self.values.credit(records, version, step))

    def metrics(self, records: Sequence[queue_pb2.GroupRecord]) -> dict[str, float]:
        """The value rollouts' books and their cost per trained token."""
        return self.values.books.metrics(sum(len(s.completion.token_ids) for r in records for s in r.samples))


CREDITS: dict[str, type[Credit]] = {"outcome": Credit, "process": ProcessCredit, "vineppo": VineCredit}


def make_credit(algo: LossConfig, parts: CreditParts) -> Credit:
    """The credit assignment algo.credit names; ValueError naming the choices for an unknown one."""
    if algo.credit not in CREDITS:
        raise ValueError(f"unknown credit {algo.credit!r}; choose one of {sorted(CREDITS)}")
    return CREDITS[algo.credit](algo, parts)
