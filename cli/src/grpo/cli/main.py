"""`grpo`: `demo` (the embedded default, grpo.demo), `up` / `status` / `down` (the services locally from one
config file, grpo.local).

Arguments are parsed before torch is imported, so `grpo --help` is instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from grpo.common.logs import setup_logging

if TYPE_CHECKING:
    from pydantic import ValidationError

log = logging.getLogger("grpo.cli")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo", description=__doc__)
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where run folders go (default: runs)")
    p.add_argument("--log-level", default="INFO")
    # Also accepted after the subcommand (`grpo status --runs-dir X`); SUPPRESS keeps the top-level default.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--runs-dir", type=Path, default=argparse.SUPPRESS, help="where run folders go (default: runs)")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "demo", parents=[common], help="train a tiny model with GRPO through all three services and show it learning"
    )
    d.add_argument("--sync", action="store_true", help="strictly on-policy (max_staleness 0) instead of async (1)")
    d.add_argument(
        "--preset", default=None,
        help="trainer algorithm preset: grpo, dapo, dr_grpo, rloo, reinforce_pp, gspo, prm, vineppo",
    )  # fmt: skip
    d.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the calibrated 200)")
    d.add_argument("--replicas", type=int, default=None, help="rollout replicas (default 1)")
    d.add_argument("--redis-url", default=None, help="use this Redis instead of a private redis-server")
    d.add_argument("--seed", type=int, default=None)
    d.add_argument("--run-id", default=None, help="run folder name under --runs-dir (default demo-<time>)")
    d.add_argument("--quick", action="store_true", help="the short profile used by the e2e test")
    d.add_argument("--sft-max-steps", type=int, default=None, help="cap on cold-start SFT steps")
    d.add_argument(
        "--fresh-sft",
        action="store_true",
        help="train the cold start again instead of reusing an earlier run's with the same settings",
    )
    d.add_argument("--no-live", action="store_true", help="log lines instead of the live view")
    u = sub.add_parser("up", parents=[common], help="start Redis, reward, rollout and trainer from one config file")
    u.add_argument("-c", "--config", type=Path, required=True)
    u.add_argument("--detach", action="store_true", help="return once everything is healthy; stop it with `grpo down`")
    for name, text in (("status", "show a running stack"), ("down", "stop a running stack")):
        s = sub.add_parser(name, parents=[common], help=text)
        s.add_argument("--run-id", default=None, help="default: every stack under --runs-dir")
    return p


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # the same clean shutdown as Ctrl-C


# DemoConfig fields set by a flag of another name; every other field's flag is --<field-with-dashes>.
FLAG_OF_FIELD = {"max_staleness": "--sync", "reuse_sft": "--fresh-sft"}


def bad_options(exc: ValidationError) -> list[str]:
    """One line per rejected demo option, in the words `grpo up` uses for a bad setting."""
    problems = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        flag = FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))
        problems.append(f"invalid option {flag} {error['input']}: {error['msg']}")
    return problems


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def pooled_evaluations(count: int) -> str:
    """What `eval_accuracy_after` pooled, in words: the report pools up to three evaluations, fewer in a short run."""
    if count <= 0:
        return "no evaluation after GRPO"
    return "the last evaluation" if count == 1 else f"mean of the last {count} evaluations"


def accuracy_line(summary: dict[str, Any]) -> str:
    """The demo's closing headline from its summary.json: before (after SFT) → after, and what "after" pooled.

    The count comes from the summary, not a fixed "three": `--quick` pools two evaluations and `--steps 2` one.
    """
    pooled = pooled_evaluations(int(summary.get("eval_after_evaluations") or 0))
    return (
        f"held-out accuracy: {_pct(summary['eval_accuracy_before'])} after SFT → {_pct(summary['eval_accuracy_after'])} "
        f"after {summary['grpo_steps']} GRPO steps ({pooled}); {summary['wall_seconds']:.0f} s in all"
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from grpo.demo.config import DemoConfig
    from grpo.demo.demo import run_demo
    from grpo.local.procs import ChildFailed
    from grpo.local.stack import LaunchError

    overrides = {k: v for k, v in (("preset", args.preset), ("steps", args.steps), ("replicas", args.replicas),
                                   ("redis_url", args.redis_url), ("seed", args.seed),
                                   ("sft_max_steps", args.sft_max_steps)) if v is not None}  # fmt: skip
    if args.sync:
        overrides["max_staleness"] = 0
    if args.fresh_sft:
        overrides["reuse_sft"] = False
    try:
        cfg = DemoConfig.quick(**overrides) if args.quick else DemoConfig(**overrides)
    except ValidationError as exc:
        for problem in bad_options(exc):
            log.error("%s", problem)
        return 2  # argparse's code for a bad option
    try:
        summary = run_demo(cfg, args.runs_dir, args.run_id, live_view=not args.no_live)
    except (ChildFailed, LaunchError) as exc:
        log.error("%s", exc)
        return 1
    run_dir = args.runs_dir / summary["run_id"]
    sys.stdout.write(
        f"\n{accuracy_line(summary)}\n"
        f"summary:     {run_dir / 'summary.json'}\nreport:      {run_dir / 'report.md'} (PNG plots beside it)\n"
        f"tensorboard: tensorboard --logdir {run_dir / 'tensorboard'}\n"
    )
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from grpo.local.launcher import LaunchError, TrainerFailed, up
    from grpo.local.procs import ChildFailed

    try:
        state = up(args.config, args.runs_dir, args.detach)
    except TrainerFailed as exc:  # its run failed: say so with its own code, as a script or CI job expects
        log.error("%s", exc)
        return exc.exit_code
    except (LaunchError, ChildFailed) as exc:
        log.error("%s", exc)
        return 2 if isinstance(exc, LaunchError) else 1
    if args.detach:
        sys.stdout.write(
            f"up: run {state.run_id}, state in {Path(state.run_dir) / 'stack.json'}; `grpo down` stops it\n"
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from grpo.local.launcher import find_states, status

    paths = find_states(args.runs_dir, args.run_id, live_only=True)
    if not paths:
        sys.stdout.write(f"no running stack under {args.runs_dir}\n")
        return 1
    for path in paths:
        sys.stdout.write(json.dumps(status(path), indent=1, default=str) + "\n")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from grpo.local.launcher import down, find_states

    paths = find_states(args.runs_dir, args.run_id, live_only=args.run_id is None)
    if not paths:
        sys.stdout.write(f"no running stack under {args.runs_dir}\n")
        return 1
    for path in paths:
        stopped = down(path)
        sys.stdout.write(f"down: {path.parent.name}: stopped {', '.join(stopped) or 'nothing (already gone)'}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.log_level, False)
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    commands = {"demo": cmd_demo, "up": cmd_up, "status": cmd_status, "down": cmd_down}
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        log.warning("interrupted: every child process has been stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
