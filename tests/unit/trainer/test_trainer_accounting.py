"""Accounting invariants, admission control, lineage staleness and group triage (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.trainer.accounting import (
    MAX_REGENERATIONS,
    Accounting,
    AccountingError,
    FailureStreak,
    GroupFacts,
    StepQuota,
    batches_to_publish,
    describe_failures,
    lineage_staleness,
    triage,
)
from grpo.trainer.errors import RunError


def facts(gid: str, rewards: tuple = (0.0, 1.0), version: int = 3, status: str = "ok", issued: int = 3) -> GroupFacts:
    return GroupFacts(gid, status, version, rewards, issued)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["publish", "train", "zero_variance", "stale", "failed", "timeout", "dup"]), max_size=60)
)
def test_invariant_holds_under_any_sequence(ops: list[str]) -> None:
    acct = Accounting()
    n = 0
    for op in ops:
        if op == "publish":
            acct.publish(f"t{n}", 0, 0, 0.0)
            n += 1
        elif op == "dup":
            acct.duplicates += 1
        elif acct.in_flight:
            acct.resolve(next(iter(acct.in_flight)), "trained" if op == "train" else op)
        acct.check()
    assert acct.published == n
    assert acct.trained + sum(acct.dropped.values()) + acct.n_in_flight == n


def test_resolve_twice_or_unknown_reason_is_an_error() -> None:
    acct = Accounting()
    acct.publish("t", 0, 0, 0.0)
    with pytest.raises(AccountingError, match="unknown drop reason"):
        acct.resolve("t", "bored")
    acct.resolve("t", "trained")
    with pytest.raises(AccountingError, match="not in flight"):
        acct.resolve("t", "trained")
    with pytest.raises(AccountingError):
        acct.publish("t", 0, 0, 0.0) or acct.publish("t", 0, 0, 0.0)


def test_state_round_trip_keeps_in_flight_ages() -> None:
    acct = Accounting()
    for i in range(3):
        acct.publish(f"t{i}", 2, 1, 100.0 + i)
    acct.resolve("t0", "stale")
    acct.duplicates = 2
    acct.batches_published = 2
    acct.version_aliases.append((4, 9))
    back = Accounting.from_state(acct.to_state(now=110.0), now=5.0)
    assert back.summary() == acct.summary()
    assert back.version_aliases == [(4, 9)]
    assert back.in_flight["t2"].published_s == pytest.approx(5.0 - 8.0)  # same age, new clock
    assert back.expired(now=5.0, timeout_s=8.5) == ["t1"]


def test_from_state_rejects_unbalanced_books() -> None:
    state = Accounting().to_state(0.0)
    state["published"] = 3
    with pytest.raises(AccountingError, match="accounting broken"):
        Accounting.from_state(state, 0.0)


@pytest.mark.parametrize(
    ("published", "done", "staleness", "total", "expected"),
    [
        (0, 0, 0, 10, 1),  # on-policy: one batch at a time
        (1, 0, 0, 10, 0),  # ... and nothing more until update 0 is pushed
        (1, 1, 0, 10, 1),
        (0, 0, 2, 10, 3),  # max_staleness 2: three batches ahead
        (3, 1, 2, 10, 1),
        (9, 8, 2, 10, 1),  # never beyond the last step's batch
        (10, 9, 2, 10, 0),
    ],
)
def test_admission(published: int, done: int, staleness: int, total: int, expected: int) -> None:
    assert batches_to_publish(published, done, staleness, total) == expected


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 4), st.integers(1, 12))
def test_admission_bounds_batches_in_flight(max_staleness: int, steps: int) -> None:
    published = 0
    for done in range(steps):
        published += batches_to_publish(published, done, max_staleness, steps)
        assert published - done <= max_staleness + 1
        assert published > done  # the batch update `done` consumes is out
    assert published == steps


def test_lineage_staleness_with_resume_alias() -> None:
    assert lineage_staleness(5, 5, []) == 0
    assert lineage_staleness(5, 3, []) == 2
    assert lineage_staleness(5, 6, []) is None  # from the future
    aliases = [(4, 9)]  # checkpoint at 4, crashed trainer pushed 5..8, resumed weights pushed as 9
    assert lineage_staleness(9, 4, aliases) == 0
    assert lineage_staleness(10, 4, aliases) == 1
    assert lineage_staleness(10, 3, aliases) == 2
    assert lineage_staleness(10, 7, aliases) is None  # discarded lineage
    assert lineage_staleness(10, 9, aliases) == 1


def test_triage_order_of_reasons() -> None:
    acct = Accounting()
    for gid in "abcdefg":
        acct.publish(gid, 3, 0, 0.0)
    assert triage(facts("zzz"), acct, 3, 0, True) == "duplicate"
    assert triage(facts("a", status="failed"), acct, 3, 0, True) == "failed"
    assert triage(facts("b", rewards=(1.0, None)), acct, 3, 0, True) == "unscored"
    assert triage(facts("c", version=2), acct, 3, 0, True) == "stale"
    assert triage(facts("c", version=2), acct, 3, 1, True) == "train"
    assert triage(facts("d", rewards=(1.0, 1.0)), acct, 3, 0, True) == "zero_variance"
    assert triage(facts("d", rewards=(1.0, 1.0)), acct, 3, 0, False) == "train"
    assert triage(facts("e", rewards=(1.0, 0.0, 1.0)), acct, 3, 0, True, group_size=2) == "failed"
    assert triage(facts("f"), acct, 3, 0, True) == "train"


def test_triage_of_probe_groups() -> None:
    """Adaptive group size: a group of probe_size samples is a probe the rollout did not widen. Flat, it is dropped
    as zero-variance; unscored, as unscored; one whose signal varies should have been widened: failed, never trained.
    Any other count than G or the probe's is malformed as before."""
    acct = Accounting()
    for gid in "abcdef":
        acct.publish(gid, 3, 0, 0.0)
    probe = {"group_size": 4, "probe_size": 2}
    assert triage(facts("a", rewards=(1.0, 1.0)), acct, 3, 0, True, **probe) == "zero_variance"
    assert triage(facts("b", rewards=(1.0, None)), acct, 3, 0, True, **probe) == "unscored"
    assert triage(facts("c", rewards=(1.0, 0.0)), acct, 3, 0, True, **probe) == "failed"
    assert triage(facts("d", rewards=(1.0, 0.0, 1.0)), acct, 3, 0, True, **probe) == "failed"
    assert triage(facts("e", rewards=(1.0, 0.0, 1.0, 1.0)), acct, 3, 0, True, **probe) == "train"
    # the signal decides, as for whole groups: equal correctness with different rewards is flat on accuracy
    assert triage(GroupFacts("f", "ok", 3, (1.0, 0.5), 3, (1.0, 1.0)), acct, 3, 0, True, **probe) == "zero_variance"
    assert triage(facts("a", rewards=(1.0, 1.0)), acct, 3, 0, True, group_size=4) == "failed"  # no probe: malformed


def test_groups_of_a_discarded_lineage_never_resolve_their_task() -> None:
    """Checkpoint at version 4, the crashed trainer pushed 5..8, the restored weights were pushed as 9."""
    acct = Accounting(version_aliases=[(4, 9)])
    acct.publish("restored", 4, 5, 0.0)  # in flight at the checkpoint (published under 4)
    acct.publish("cursor", 9, 6, 0.0)  # published after the checkpoint, and again by the restored cursor under 9
    # The crashed trainer's group for a task the restored cursor republished: superseded, its twin is coming.
    assert triage(facts("cursor", version=6, issued=5), acct, 9, 1, True) == "superseded"
    # Made by discarded weights for the publication the books know: the task must be published again.
    assert triage(facts("restored", version=5, issued=4), acct, 9, 1, True) == "regenerate"
    assert triage(facts("restored", version=5, issued=4, status="failed"), acct, 9, 1, True) == "regenerate"
    # A group from the surviving lineage (the checkpointed weights) is trained, whichever publication it answers.
    assert triage(facts("cursor", version=4, issued=4), acct, 9, 1, True) == "train"
    acct.republish("restored", 9, 50.0)
    task = acct.in_flight["restored"]
    assert (task.policy_version, task.batch, task.published_s, task.regenerations) == (9, 5, 50.0, 1)
    assert acct.published == 2 and acct.balanced()  # a republication is not a new task
    for _ in range(MAX_REGENERATIONS - 1):
        assert triage(facts("restored", version=7, issued=9), acct, 9, 1, True) == "regenerate"
        acct.republish("restored", 9, 60.0)
    assert triage(facts("restored", version=7, issued=9), acct, 9, 1, True) == "stale"  # bounded: then dropped
    assert triage(facts("restored", version=9, issued=9), acct, 9, 1, True) == "train"


def test_state_from_an_earlier_release_restores() -> None:
    acct = Accounting()
    acct.publish("t0", 2, 1, 100.0)
    acct.republish("t0", 3, 101.0)
    acct.superseded = 4
    state = acct.to_state(now=110.0)
    assert Accounting.from_state(state, 0.0).in_flight["t0"].regenerations == 1
    assert Accounting.from_state(state, 0.0).superseded == 4
    del state["superseded"]
    del state["in_flight"][0]["regenerations"]
    back = Accounting.from_state(state, 0.0)
    assert back.superseded == 0 and back.in_flight["t0"].regenerations == 0


def test_step_quota_refills_zero_variance_within_budget() -> None:
    quota = StepQuota(need=2, refill_budget=1)
    assert quota.on_resolved("zero_variance") is True  # refill published
    assert not quota.done and quota.need == 2
    assert quota.on_resolved("zero_variance") is False  # budget spent
    assert quota.on_resolved("train") is False
    assert quota.done and quota.refills == 1


CAP = "invalid task: sampling.max_new_tokens = 16 is over the cap of 8"


def test_a_run_whose_every_group_keeps_failing_ends_naming_why() -> None:
    streak = FailureStreak(limit=3)
    streak.add({"failed": 3}, {CAP: 3})
    streak.add({"failed": 2, "duplicate": 4, "superseded": 1}, {CAP: 1, "reward service: timeout": 1})
    with pytest.raises(RunError, match=r"every group failed for 3 steps in a row") as exc:
        streak.add({"failed": 3}, {CAP: 3})
    assert f'7× "{CAP}"; 1× "reward service: timeout"' in str(exc.value)


@pytest.mark.parametrize(
    "other",
    [{"train": 1, "failed": 2}, {"zero_variance": 1, "failed": 2}, {"timeout": 3}, {"duplicate": 2}, {}],
)
def test_a_step_that_did_not_fail_every_group_restarts_the_count(other: dict[str, int]) -> None:
    streak = FailureStreak(limit=2)
    streak.add({"failed": 3}, {CAP: 3})
    streak.add(other, {CAP: other.get("failed", 0)})  # scored groups, timeouts, or nothing resolved: not all failed
    streak.add({"failed": 3}, {CAP: 3})
    with pytest.raises(RunError):
        streak.add({"failed": 3}, {CAP: 3})


def test_failure_reasons_most_frequent_first() -> None:
    assert describe_failures({"b": 1, "a": 1, "c": 5}) == '5× "c"; 1× "a"; 1× "b"'
