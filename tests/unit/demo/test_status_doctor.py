"""`grpo status`'s lines for the trainer's live doctor findings (/v1/status `doctor`). The real path, a trainer that
reports a finding while `grpo status` reads its stack, is tests/service/test_doctor_real_runs.py's truncation run."""

from __future__ import annotations

from typing import Any

from grpo.cli.views import status_view
from grpo.local.status import doctor_findings

FINDING = {"rule": "truncation", "symptom": "completions cut by the length limit",
           "evidence": "rollout/truncation_rate 0.98 (mean, steps 8–12)", "remedy": "give a larger budget (max_new_tokens)"}  # fmt: skip


def shown(alive: bool, doctor: list[dict[str, str]]) -> dict[str, Any]:
    return {"run_id": "r", "run_dir": "/runs/r", "redis_url": "redis://x", "processes": [],
            "trainer": {"phase": "grpo", "step": 10, "total_steps": 12, "alive": alive}, "doctor": doctor}  # fmt: skip


def rows(text: str) -> list[list[str]]:
    return [row.split(None, 1) for row in text.splitlines()]


def test_each_finding_gets_a_line_with_its_rule_symptom_and_remedy() -> None:
    line = "truncation: completions cut by the length limit; remedy: give a larger budget (max_new_tokens)"
    assert ["doctor", line] in rows(status_view(shown(True, [FINDING])))
    # A trainer that has exited: what it last reported, said so.
    assert ["doctor", f"(last reported) {line}"] in rows(status_view(shown(False, [FINDING])))
    assert not any(r[0] == "doctor" for r in rows(status_view(shown(True, []))))  # a healthy run: no line


def test_findings_are_read_whole_and_anything_else_is_left_out() -> None:
    assert doctor_findings({"doctor": [FINDING, "junk", {"rule": "kl_spike"}]}) == [
        FINDING,
        {"rule": "kl_spike", "symptom": "", "evidence": "", "remedy": ""},
    ]
    assert doctor_findings({}) == [] and doctor_findings({"doctor": None}) == []  # a trainer from before the doctor
