"""The live view's state and table, from /v1/status-shaped dicts (pure; rendered to text)."""

from __future__ import annotations

from rich.console import Console

from grpo.demo.live import ViewState, plain_line, render


def _text(view: ViewState) -> str:
    console = Console(record=True, width=120)
    console.print(render(view))
    return console.export_text()


def test_eval_accuracy_persists_between_steps_that_report_it() -> None:
    view = ViewState(eval_before=0.42)
    view.update({"phase": "grpo", "step": 20, "total_steps": 200,
                 "metrics": {"eval/accuracy": 0.61, "rollout/reward_mean": 1.5, "train/kl": 0.01}})  # fmt: skip
    view.update({"phase": "grpo", "step": 21, "total_steps": 200, "metrics": {"rollout/reward_mean": 1.6}})
    text = _text(view)
    assert "21 / 200" in text and "0.610" in text and "0.420" in text and "1.600" in text and "0.01000" in text


def test_eta_needs_progress_and_missing_values_show_a_dash() -> None:
    view = ViewState()
    view.update({"phase": "grpo", "step": 1, "total_steps": 10, "metrics": {}})
    assert view.eta_s() is None
    view.grpo_started = view.grpo_started - 10.0  # type: ignore[operator]  # 10 s for the first step
    view.update({"phase": "grpo", "step": 2, "total_steps": 10, "metrics": {}})
    assert view.eta_s() is not None and 70 < view.eta_s() < 90  # type: ignore[operator]
    assert "reward (mean): –" in plain_line(view)


def test_before_grpo_is_the_trainers_step_0_evaluation() -> None:
    """The report compares after with the trainer's baseline (same problems, same scorer): so does the view."""
    view = ViewState(eval_before=0.42)  # the cold start's own measure, on other problems
    view.update({"phase": "grpo", "step": 0, "total_steps": 40, "metrics": {},
                 "eval_history": [{"step": 0, "accuracy": 0.37}]})  # fmt: skip
    assert view.eval_before == 0.37 and "(before GRPO: 0.370)" in _text(view)


def test_a_multi_task_run_gets_a_line_per_task_type_and_a_single_task_run_none() -> None:
    view = ViewState()
    view.update({"phase": "grpo", "step": 3, "total_steps": 10,
                 "metrics": {"task/math/groups": 2, "task/math/reward_mean": 0.5, "task/math/accuracy": 0.25,
                             "task/math/zero_variance_fraction": 0.5, "eval/math/accuracy": 0.4,
                             "task/chat/groups": 2, "task/chat/reward_mean": 0.7, "eval/chat/reward_mean": 0.65,
                             "task/chat/zero_variance_fraction": 0.0}})  # fmt: skip
    text = _text(view)
    assert "task math" in text and "reward 0.500, accuracy 0.250, zero-variance 0.50, eval 0.400" in text
    assert "task chat" in text and "reward 0.700, accuracy –, zero-variance 0.00, eval 0.650" in text
    single = ViewState()
    single.update({"phase": "grpo", "step": 1, "total_steps": 10, "metrics": {"rollout/reward_mean": 0.5}})
    assert "task " not in _text(single)


def test_the_trainers_doctor_findings_get_a_line_each_while_they_last() -> None:
    finding = {"rule": "truncation", "symptom": "completions cut by the length limit", "evidence": "0.9",
               "remedy": "give a larger budget (max_new_tokens)"}  # fmt: skip
    view = ViewState()
    view.update({"phase": "grpo", "step": 10, "total_steps": 40, "metrics": {}, "doctor": [finding]})
    text = _text(view)
    assert "doctor: truncation" in text and "give a larger budget (max_new_tokens)" in text
    assert plain_line(view).endswith(" | doctor: truncation")
    view.update({"phase": "grpo", "step": 20, "total_steps": 40, "metrics": {}, "doctor": []})  # it went away
    assert "doctor" not in _text(view) and "doctor" not in plain_line(view)
