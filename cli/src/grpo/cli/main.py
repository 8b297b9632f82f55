"""`grpo`: `demo` (the embedded default, grpo.demo), `up` / `status` / `down` (the services locally from one
config file, grpo.local), `doctor` (a run's metrics against the debugging checklist, grpo.cli.doctor).

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
from typing import TYPE_CHECKING

from grpo.cli.doctor import cmd_doctor
from grpo.cli.views import accuracy_line, closing_lines, pooled_evaluations, status_view
from grpo.common.logs import setup_logging

if TYPE_CHECKING:
    from pydantic import ValidationError

log = logging.getLogger("grpo.cli")
__all__ = ["accuracy_line", "closing_lines", "main", "pooled_evaluations"]
# The services' level names (grpo.common.settings.LOG_LEVELS), in any case; not imported: `grpo --help` stays instant.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(value: str) -> str:
    if value.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(LOG_LEVELS)})")
    return value.upper()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo", description=__doc__)
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), metavar="DIR",
                   help="where run folders go (default: runs)")  # fmt: skip
    p.add_argument("--log-level", type=_log_level, default="INFO", metavar="LEVEL",
                   help=f"{', '.join(LOG_LEVELS)} (any case; default INFO)")  # fmt: skip
    # Also accepted after the subcommand (`grpo status --runs-dir X`); SUPPRESS keeps the top-level default.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--runs-dir", type=Path, default=argparse.SUPPRESS, metavar="DIR",
                        help="where run folders go (default: runs)")  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "demo", parents=[common], help="train a tiny model with GRPO through all three services and show it learning"
    )
    d.add_argument("--task", choices=("addition", "tool"), default=None,
                   help="addition (default), or tool: multiplication with the python tool (docs/demo.md, Tool use)")  # fmt: skip
    d.add_argument("--sync", action="store_true", help="strictly on-policy (max_staleness 0) instead of async (1)")
    d.add_argument(
        "--preset", default=None, metavar="NAME",
        help="trainer algorithm preset: grpo, dapo, dr_grpo, rloo, reinforce_pp, gspo, prm, vineppo",
    )  # fmt: skip
    d.add_argument("--steps", type=int, default=None, metavar="N", help="GRPO steps (default: the calibrated 200)")
    d.add_argument("--replicas", type=int, default=None, metavar="N", help="rollout replicas (default 1)")
    d.add_argument("--colocate", action="store_true",
                   help="the trainer hosts a replica on its own model: one model in memory (docs/colocated.md)")  # fmt: skip
    d.add_argument("--redis-url", default=None, metavar="URL", help="use this Redis instead of a private redis-server")
    d.add_argument("--seed", type=int, default=None, metavar="N")
    d.add_argument(
        "--run-id", default=None, metavar="ID", help="run folder name under --runs-dir (default demo-<time>)"
    )
    d.add_argument("--quick", action="store_true", help="the short profile used by the e2e test")
    d.add_argument("--sft-max-steps", type=int, default=None, metavar="N", help="cap on cold-start SFT steps")
    d.add_argument(
        "--fresh-sft",
        action="store_true",
        help="train the cold start again instead of reusing an earlier run's with the same settings",
    )
    d.add_argument("--no-live", action="store_true", help="log lines instead of the live view")
    u = sub.add_parser("up", parents=[common], help="start Redis, reward, rollout and trainer from one config file")
    u.add_argument(
        "-c", "--config", type=Path, required=True, metavar="FILE",
        help="the stack file: run_id, redis_url, replicas and one section per service in its own settings "
             "(reward, rollout, trainer; docs/demo.md)",
    )  # fmt: skip
    u.add_argument("--detach", action="store_true", help="return once everything is healthy; stop it with `grpo down`")
    u.add_argument("--no-live", action="store_true", help="log lines instead of the live view")
    for name, text in (("status", "show a running stack"), ("down", "stop a running stack")):
        s = sub.add_parser(name, parents=[common], help=text)
        s.add_argument("--run-id", default=None, metavar="ID", help="default: every stack under --runs-dir")
    sub.choices["status"].add_argument("--json", action="store_true", help="everything, as JSON")
    doc = sub.add_parser(
        "doctor", parents=[common], help="check a run's metrics for the symptoms of a GRPO run going wrong",
        description="Check a run folder's metrics.jsonl against the GRPO debugging checklist (docs/doctor.md). Exit "
                    "0: no symptom found; 1: findings (symptom, evidence, remedy); 2: not a readable run folder.",
    )  # fmt: skip
    doc.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder (or a run id under --runs-dir)")
    doc.add_argument("--json", action="store_true", help="the findings as JSON")
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


def cmd_demo(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from grpo.demo.config import DemoConfig
    from grpo.demo.demo import run_demo
    from grpo.local.procs import ChildFailed
    from grpo.local.stack import LaunchError

    overrides = {k: v for k, v in (("task", args.task), ("preset", args.preset), ("steps", args.steps), ("replicas", args.replicas),
                                   ("redis_url", args.redis_url), ("seed", args.seed),
                                   ("sft_max_steps", args.sft_max_steps)) if v is not None}  # fmt: skip
    if args.sync:
        overrides["max_staleness"] = 0
    if args.colocate:
        overrides["colocate"] = True
    if args.fresh_sft:
        overrides["reuse_sft"] = False
    try:
        cfg = DemoConfig.quick(**overrides) if args.quick else DemoConfig(**overrides)
    except ValidationError as exc:
        for problem in bad_options(exc):
            log.error("%s", problem)
        return 2  # argparse's code for a bad option
    if cfg.redis_url is not None and (unusable := demo_redis_problem(cfg.redis_url)):
        log.error("%s", unusable)  # before the cold start, which takes minutes
        return 2
    if args.run_id is not None and (note := used_run_note((args.runs_dir / args.run_id).resolve())):
        log.warning("%s", note)
    try:
        summary = run_demo(cfg, args.runs_dir, args.run_id, live_view=not args.no_live)
    except (ChildFailed, LaunchError) as exc:
        log.error("%s", exc)
        return 1
    sys.stdout.write("\n" + closing_lines(args.runs_dir / summary["run_id"]))
    return 0


def demo_redis_problem(url: str) -> str | None:
    """`--redis-url` in the words `grpo up` uses for its redis_url: a URL that is not one, or no Redis there."""
    from grpo.local.preflight import redis_problem, redis_url_problem

    problem = redis_url_problem(url)
    if problem:
        return f"invalid option --redis-url {url}: {problem}"
    # Other runs' keys are said when the services start (grpo.local.stack), not twice.
    return redis_problem(url, run_id="", look_for_other_runs=False)


def used_run_note(run_dir: Path) -> str | None:
    """What re-using a run folder does, in words (the trainer says only that it set its checkpoints aside, by
    name); None for a new folder."""
    if not ((run_dir / "summary.json").exists() or (run_dir / "checkpoints").is_dir()):
        return None
    return (
        f"{run_dir} already holds an earlier run: this one starts afresh there, replacing its summary and report; "
        "its checkpoints are kept, renamed abandoned-step-<N>. Give another --run-id to keep the two runs apart"
    )


def cmd_up(args: argparse.Namespace) -> int:
    from grpo.local.launcher import LaunchError, up
    from grpo.local.procs import ChildFailed

    try:
        state = up(args.config, args.runs_dir, args.detach, live_view=not args.no_live)
    except ChildFailed as exc:  # its run failed (TrainerFailed: with the trainer's own code), or a child refused
        log.error("%s", exc)  # its settings or data at start-up (2): say so as a script or CI job expects
        return exc.exit_code
    except LaunchError as exc:
        log.error("%s", exc)
        return 2
    if args.detach:
        sys.stdout.write(
            f"up: run {state.run_id}, state in {Path(state.run_dir) / 'stack.json'}; `grpo down` stops it\n"
        )
    elif state.trainer_http is not None:
        sys.stdout.write("\n" + closing_lines(Path(state.trainer_output_dir or state.run_dir)))
    return 0


def no_stack(args: argparse.Namespace) -> int:
    """Where `status` / `down` looked, in full, and how to look elsewhere (run from another directory, `runs` is
    another folder)."""
    which = f" of run {args.run_id!r}" if args.run_id else ""
    sys.stdout.write(
        f"no running stack{which} under {args.runs_dir.resolve()}; give the folder `grpo up` put it in with "
        "--runs-dir DIR\n"
    )
    return 1


def cmd_status(args: argparse.Namespace) -> int:
    from grpo.local.launcher import find_states
    from grpo.local.status import status

    paths = find_states(args.runs_dir, args.run_id, live_only=True)
    if not paths:
        return no_stack(args)
    shown = [status(path) for path in paths]
    if args.json:
        sys.stdout.write("".join(json.dumps(s, indent=1, default=str) + "\n" for s in shown))
    else:
        sys.stdout.write("\n".join(status_view(s) for s in shown))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from grpo.local.launcher import down, find_states

    paths = find_states(args.runs_dir, args.run_id, live_only=args.run_id is None)
    if not paths:
        return no_stack(args)
    for path in paths:
        stopped = down(path)
        sys.stdout.write(f"down: {path.parent.name}: stopped {', '.join(stopped) or 'nothing (already gone)'}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.log_level, False)
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    commands = {"demo": cmd_demo, "up": cmd_up, "status": cmd_status, "down": cmd_down, "doctor": cmd_doctor}
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        log.warning("interrupted: every child process has been stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
