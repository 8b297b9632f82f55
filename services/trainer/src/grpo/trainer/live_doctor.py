"""`grpo doctor`'s rules while the run trains: every few steps over the rows so far, each new finding a warning.

The rules are grpo.common.doctor's, the same `grpo doctor RUN_DIR` runs on a finished run; here they read the
rows this process logged (a resumed run starts them afresh: its earlier steps are the doctor command's).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from grpo.algo.presets import LossConfig
from grpo.common.doctor import Finding, RunSettings, diagnose

log = logging.getLogger(__name__)
EVERY_STEPS = 10  # the trend rules need ten steps anyway; a check costs milliseconds of Python
KEEP_ROWS = 2000  # the rules compare a run's first and last fifth: enough rows to see a long run's trend


def finding_view(f: Finding) -> dict[str, str]:
    """A finding as the status reports it (/v1/status `doctor`, RunStatus.doctor): what a person reads."""
    return {"rule": f.rule, "symptom": f.symptom, "evidence": f.evidence, "remedy": f.remedy}


class LiveDoctor:
    """Runs the rules every EVERY_STEPS steps and warns of each symptom when it appears: a rule still firing at the
    next check is not said again, one that went quiet and comes back is."""

    def __init__(self, algo: LossConfig, max_staleness: int) -> None:
        self.settings = RunSettings(
            beta=algo.beta,
            ref_refresh_steps=algo.ref_refresh_steps or 0,
            group_size=algo.group_size,
            max_staleness=max_staleness,
            refill_zero_variance=algo.refill_zero_variance,
        )
        self.rows: list[dict[str, object]] = []
        self.findings: list[Finding] = []

    def observe(self, step: int, metrics: Mapping[str, object]) -> list[Finding]:
        """Record one step's metrics; on a check step, log the new findings. Returns the current findings."""
        self.rows.append({"step": step, **metrics})
        del self.rows[:-KEEP_ROWS]
        if step % EVERY_STEPS:
            return self.findings
        before = {f.rule for f in self.findings}
        self.findings = diagnose(self.rows, self.settings)
        for f in self.findings:
            if f.rule not in before:
                log.warning("doctor: %s: %s (%s); %s", f.rule, f.symptom, f.evidence, f.remedy)
        return self.findings

    def view(self) -> tuple[dict[str, str], ...]:
        """The current findings as the status reports them."""
        return tuple(finding_view(f) for f in self.findings)
