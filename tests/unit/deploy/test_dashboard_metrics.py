"""Every metric the chart's Grafana dashboard queries is one the services really export, with the labels it
groups by.

The exported names come from the services themselves, no mocks: the reward service's metrics (the default
registry), the rollout's `Metrics` registry, and for the trainer the keys a GRPO step logs (one real `Learner`
step on the tiny model on CPU, the real `group_metrics` / `Accounting` / `ValueBooks`, plus the keys `GrpoRun`
adds in its loop, listed from run.py) put through the trainer's own `MetricsSink` into a registry with the
`/metrics` run collector, as the trainer service does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import REGISTRY, CollectorRegistry

DASHBOARD = Path(__file__).resolve().parents[3] / "k8s" / "grpo" / "dashboards" / "grpo.json"
METRIC = re.compile(r"\bgrpo_[a-z0-9_]+")
BY = re.compile(r"\bby\s*\(([^)]*)\)")
LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
# The series a metric family of each type exposes, and the labels a series adds of its own.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
OWN_LABELS = {"_bucket": {"le"}}


def targets() -> Iterator[dict[str, Any]]:
    """Every query target of every panel (rows included)."""

    def walk(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            if "expr" in node:
                yield node
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    return walk(json.loads(DASHBOARD.read_text()))


def series(registry: CollectorRegistry, labels: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    """Series name -> its label names, for every family in `registry` (also those with no sample yet)."""
    out: dict[str, set[str]] = {}
    for family in registry.collect():
        names = set(labels.get(family.name, ()))
        names |= {k for sample in family.samples for k in sample.labels}
        for suffix in SUFFIXES[family.type]:
            out[family.name + suffix] = names | OWN_LABELS.get(suffix, set())
    return out


def label_names(*wrappers: Any) -> dict[str, tuple[str, ...]]:
    """Family name -> declared label names of prometheus_client metric objects (a family that has not been
    observed yet has no samples to read its labels from)."""
    from prometheus_client.metrics import MetricWrapperBase

    return {w._name: tuple(w._labelnames) for w in wrappers if isinstance(w, MetricWrapperBase)}


def reward_series() -> dict[str, set[str]]:
    from grpo.reward import metrics

    return series(REGISTRY, label_names(*vars(metrics).values()))


def rollout_series() -> dict[str, set[str]]:
    from grpo.rollout.stats import Metrics

    m = Metrics()
    return series(m.registry, label_names(*vars(m).values()))


def trainer_keys(tmp_path: Path) -> dict[str, float]:
    """The keys one GRPO step of `GrpoRun.run` logs, with values from the real code where it runs without
    Redis or replicas."""
    from grpo.algo import group_advantages
    from grpo.trainer.accounting import DROP_REASONS, Accounting
    from grpo.trainer.assemble import build_learner, resolve_algo
    from grpo.trainer.config import TrainerSettings
    from grpo.trainer.consumer import group_metrics, to_samples
    from grpo.trainer.vine import ValueBooks
    from grpo.v1 import queue_pb2

    torch.set_num_threads(1)
    # The grpo preset (β 0.001, so the reference model and its KL are in the step's metrics).
    settings = TrainerSettings(preset="grpo", train_data=tmp_path / "train.jsonl", micro_batch_size=8)
    algo = resolve_algo(settings)
    learner = build_learner(settings, algo)
    g = algo.group_size
    records = []
    for i in range(2):
        record = queue_pb2.GroupRecord(group_id=f"t{i}", task_id=f"t{i}", prompt_token_ids=[5, 6, 7], generate_s=0.5)
        for j in range(g):
            sample = record.samples.add(reward=float(j % 2))
            sample.completion.token_ids.extend([8 + j, 9, 10])
            sample.completion.finish_reason = "stop" if j else "length"
            sample.components["math"].score = float(j % 2)
            sample.components["format"].score = 1.0
        records.append(record)
    rewards = torch.tensor([s.reward for r in records for s in r.samples])
    advantages = group_advantages(rewards, g, **algo.advantage_kwargs()).tolist()
    samples = [s for i, r in enumerate(records) for s in to_samples(r, advantages[i * g : (i + 1) * g])]

    keys: dict[str, float] = {}
    keys.update(group_metrics(records))  # GrpoRun._collect
    keys.update({f"train/{k}": v for k, v in learner.step(samples).items()})  # GrpoRun._train
    keys.update(ValueBooks().metrics(100))  # GrpoRun._train, VinePPO only
    keys.update(Accounting().summary())  # GrpoRun.run: self.acct.summary()
    keys.update(group_metrics(records, prefix="eval"))  # evaluation.evaluate, every eval_every steps
    # Only a full run (Redis, replicas) produces these; listed from the code that logs them:
    # GrpoRun._collect: a count per triage verdict (accounting.triage, plus "timeout"), the zero-variance
    # fraction, the refills, and the staleness of the kept groups.
    verdicts = ("train", "duplicate", "superseded", "regenerate", *DROP_REASONS)
    keys.update({f"groups/{v}": 1.0 for v in verdicts})
    keys.update({"groups/zero_variance_fraction": 0.1, "groups/refills": 0.0})
    keys.update({"staleness/mean": 0.5, "staleness/max": 1.0})
    # GrpoRun._sync_replicas: push_stats; GrpoRun.run: the step's times and the policy version.
    keys.update({"push/ok": 1.0, "push/failed": 0.0, "push/bytes_sent": 1e6})
    keys.update({"time/wait_rollouts_s": 0.1, "time/push_s": 0.01, "time/step_s": 1.0, "policy_version": 1.0})
    # evaluation.evaluate, besides group_metrics(prefix="eval"):
    keys.update({f"eval/{k}": 1.0 for k in ("completed", "missing", "failed", "wrong_weights", "wall_s")})
    return keys


def trainer_series(tmp_path: Path) -> dict[str, set[str]]:
    from grpo.trainer.control import RunControl
    from grpo.trainer.http_api import RunStatusCollector
    from grpo.trainer.metrics import MetricsSink

    registry = CollectorRegistry()
    registry.register(RunStatusCollector(RunControl("run", 1)))  # http_routes registers it for /metrics
    with MetricsSink(prometheus_registry=registry) as sink:
        sink.log(1, trainer_keys(tmp_path))
    return series(registry, {})


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    return {**reward_series(), **rollout_series(), **trainer_series(tmp_path_factory.mktemp("trainer"))}


def test_the_dashboard_has_queries() -> None:
    names = {n for t in targets() for n in METRIC.findall(t["expr"])}
    assert {p for n in names for p in ("grpo_reward", "grpo_rollout", "grpo_trainer") if n.startswith(p)} == {
        "grpo_reward",
        "grpo_rollout",
        "grpo_trainer",
    }


def test_every_metric_the_dashboard_queries_is_exported(exported: dict[str, set[str]]) -> None:
    missing = sorted({n for t in targets() for n in METRIC.findall(t["expr"]) if n not in exported})
    assert not missing, f"the dashboard queries metrics no service exports: {missing}"


def test_every_label_the_dashboard_groups_by_is_the_metrics_own(exported: dict[str, set[str]]) -> None:
    wrong = []
    for target in targets():
        names = [n for n in METRIC.findall(target["expr"]) if n in exported]
        have = set().union(*(exported[n] for n in names)) if names else set()
        used = {x.strip() for group in BY.findall(target["expr"]) for x in group.split(",") if x.strip()}
        used |= set(LEGEND_LABEL.findall(target.get("legendFormat", "")))
        wrong += [f"{target['expr']}: {label}" for label in sorted(used - have)]
    assert not wrong, f"labels the queried metrics do not have: {wrong}"
