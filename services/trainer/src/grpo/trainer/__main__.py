"""`grpo-trainer` / `python -m grpo.trainer`: settings are parsed (and errors reported) before torch loads."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from grpo.common.logs import setup_logging
from grpo.trainer.config import parse_settings


def main(argv: list[str] | None = None) -> None:
    try:
        settings = parse_settings(argv)
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors())
        sys.stderr.write(f"grpo-trainer: invalid settings: {errors}\n")
        raise SystemExit(2) from None
    setup_logging(settings.log_level, settings.json_logs)
    from grpo.trainer.control import RunControl
    from grpo.trainer.service import install_signal_handlers, serve

    control = RunControl(settings.run_id, settings.steps)
    install_signal_handlers(control)
    raise SystemExit(serve(settings, control))


if __name__ == "__main__":
    main()
