"""The live terminal view: a rich table refreshed from the trainer's /v1/status (plain log lines off a TTY).

Used by `grpo demo` and by an attached `grpo up`.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table


def fetch_status(port: int, timeout_s: float = 2.0, token: str | None = None) -> dict[str, Any] | None:
    """The trainer's /v1/status JSON, or None when it does not answer.

    The trainer's token (when it runs with one) comes from GRPO_TRAINER_TOKEN, as for the trainer itself.
    """
    token = token or os.environ.get("GRPO_TRAINER_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/status", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return dict(json.loads(resp.read()))
    except (OSError, ValueError):
        return None


@dataclass
class ViewState:
    """What the view shows; eval accuracy and KL persist between the steps that report them."""

    phase: str = "starting"
    stage: str = ""  # "1/2 sft" in a staged run
    step: int = 0
    total: int = 0
    started: float = field(default_factory=time.monotonic)
    grpo_started: float | None = None
    grpo_first_step: int = 0
    eval_before: float | None = None
    last: dict[str, float] = field(default_factory=dict)
    note: str = ""
    # The trainer's current grpo doctor findings, (rule, remedy) each: replaced at each status, as they come and go.
    doctor: list[tuple[str, str]] = field(default_factory=list)

    def update(self, status: dict[str, Any]) -> None:
        self.phase = str(status.get("phase", self.phase))
        self.stage = str(status.get("stage") or "")
        step = int(status.get("step", 0))
        if self.grpo_started is None and self.phase in ("grpo", "eval") and step > 0:
            self.grpo_started, self.grpo_first_step = time.monotonic(), step
        self.step, self.total = step, int(status.get("total_steps", self.total))
        for key, value in (status.get("metrics") or {}).items():
            self.last[key] = value
        self.doctor = [(str(f.get("rule", "")), str(f.get("remedy", ""))) for f in status.get("doctor") or []]
        for point in status.get("eval_history") or []:
            if point.get("step") == 0:  # the trainer's baseline: the "before" the report compares with
                self.eval_before = point.get("accuracy")

    def eta_s(self) -> float | None:
        if self.grpo_started is None or self.step <= self.grpo_first_step:
            return None
        rate = (time.monotonic() - self.grpo_started) / (self.step - self.grpo_first_step)
        return rate * max(self.total - self.step, 0)


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def rows(v: ViewState) -> list[tuple[str, str]]:
    m = v.last
    eta = v.eta_s()
    return [
        ("phase", v.phase + (f"  stage {v.stage}" if v.stage else "") + (f"  ({v.note})" if v.note else "")),
        ("step", f"{v.step} / {v.total}" if v.total else "–"),
        ("reward (mean)", _fmt(m.get("rollout/reward_mean"))),
        ("train accuracy (T=1)", _fmt(m.get("rollout/accuracy"))),
        ("eval accuracy", f"{_fmt(m.get('eval/accuracy'))}   (before GRPO: {_fmt(v.eval_before)})"),
        ("KL to SFT model", _fmt(m.get("train/kl"), ".5f")),
        (
            "throughput",
            f"{_fmt(m.get('train/tokens_per_s'), '.0f')} train tok/s, step {_fmt(m.get('time/step_s'), '.2f')} s",
        ),
        ("staleness (mean)", _fmt(m.get("staleness/mean"), ".2f")),
        ("elapsed / ETA", f"{time.monotonic() - v.started:.0f} s / {_fmt(eta, '.0f')} s"),
        *task_rows(m),
        *[(f"doctor: {rule}", remedy) for rule, remedy in v.doctor],
    ]


def task_rows(m: dict[str, float]) -> list[tuple[str, str]]:
    """A multi-task run's line per task type (task/<type>/*, eval/<type>/*); none for a single-task run."""
    types = sorted(k[len("task/") : -len("/groups")] for k in m if k.startswith("task/") and k.endswith("/groups"))
    out = []
    for t in types:
        reward, accuracy = _fmt(m.get(f"task/{t}/reward_mean")), _fmt(m.get(f"task/{t}/accuracy"))
        zero = _fmt(m.get(f"task/{t}/zero_variance_fraction"), ".2f")
        held_out = _fmt(m.get(f"eval/{t}/accuracy", m.get(f"eval/{t}/reward_mean")))
        out.append((f"task {t}", f"reward {reward}, accuracy {accuracy}, zero-variance {zero}, eval {held_out}"))
    return out


def render(v: ViewState, title: str = "grpo demo") -> Table:
    table = Table(title=title, show_header=False, min_width=60)
    table.add_column(style="bold cyan")
    table.add_column()
    for name, value in rows(v):
        table.add_row(name, value)
    return table


def plain_line(v: ViewState) -> str:
    line = " | ".join(f"{k}: {val}" for k, val in rows(v)[:8])
    return line + (f" | doctor: {', '.join(rule for rule, _ in v.doctor)}" if v.doctor else "")


__all__ = ["Live", "ViewState", "fetch_status", "make_console", "plain_line", "progress", "render"]


def make_console() -> Console:
    return Console(stderr=False)


@contextmanager
def progress(
    view: ViewState, title: str, log: logging.Logger, live_view: bool = True, every_s: float = 10.0
) -> Iterator[Callable[[], None]]:
    """Yields `refresh()`, which shows `view`: the live table on a terminal, else a plain log line at most every
    `every_s` (the first at once). Under the table INFO logging is quieted (lines written under it tear the
    display) and restored after."""
    console = make_console()
    if not (live_view and console.is_terminal):
        last = [-every_s]

        def log_line() -> None:
            if time.monotonic() - last[0] >= every_s:
                last[0] = time.monotonic()
                log.info("%s", plain_line(view))

        yield log_line
        return
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        with Live(render(view, title), console=console, refresh_per_second=2) as screen:
            yield lambda: screen.update(render(view, title))
    finally:
        root.setLevel(level)
