"""`grpo-trainer` / `python -m grpo.trainer`: settings are parsed (and their errors reported) before torch loads."""

from __future__ import annotations

import logging
import sys

from grpo.common.logs import setup_logging
from grpo.common.net import exposure_warning
from grpo.common.settings import InvalidSettings, exit_on_invalid_settings
from grpo.common.tiny_model import check_model
from grpo.trainer.config import TrainerSettings, parse_settings
from grpo.trainer.sources import MODEL_REFERENCES


def main(argv: list[str] | None = None) -> None:
    with exit_on_invalid_settings("grpo-trainer"):
        settings = parse_settings(argv)
        setup_logging(settings.log_level, settings.json_logs)
    from grpo.common.ports import check_ports
    from grpo.trainer.control import RunControl
    from grpo.trainer.ranks import env_rank, env_world_size, exit_rank, single_process_backend_problem
    from grpo.trainer.service import install_signal_handlers, quiet_deepspeed_on_cpu, serve

    with exit_on_invalid_settings("grpo-trainer"):  # on every rank, before any of them loads a model
        problem = single_process_backend_problem(run_backends(settings), env_world_size())
        if problem:
            raise InvalidSettings(problem)
    if env_rank() == 0:  # only rank 0 serves; a taken port is said before torch loads
        check_ports(settings, "grpc_port", "http_port")
        if warning := exposure_warning(settings.host, settings.token, "GRPO_TRAINER_"):
            logging.getLogger("grpo.trainer").warning(warning)  # Stop and SaveCheckpoint are open to the network
    quiet_deepspeed_on_cpu()  # imports torch; before check_models, which may build (and save) the tiny model
    with exit_on_invalid_settings("grpo-trainer"):
        check_models(settings)
    check_data(settings)  # on every rank too: one that went on alone would wait for the others' collectives

    control = RunControl(settings.run_id, settings.steps)
    install_signal_handlers(control)
    code = serve(settings, control)
    if env_world_size() > 1:
        exit_rank(code)  # not SystemExit: a rank could abort in the interpreter's teardown (see exit_rank)
    raise SystemExit(code)


def run_backends(settings: TrainerSettings) -> list[str]:
    """The training backend of the run, or of each of its stages (a stage may name its own)."""
    return [str(stage.get("backend", settings.backend)) for stage in settings.stages] or [settings.backend]


def check_models(settings: TrainerSettings) -> None:
    """Every model the run will load, before anything starts (a stage without one, or with `base` or `previous`,
    continues the last or takes the run's)."""
    check_model(settings.model)
    for stage in settings.stages or []:
        if stage.get("model") and stage["model"] not in MODEL_REFERENCES:
            check_model(stage["model"])


def check_data(settings: TrainerSettings) -> None:
    """The data of the run, or of every stage still to run, before anything trains: one line and exit code 2."""
    from grpo.trainer.data import DataError
    from grpo.trainer.preflight import check_run_data

    try:
        check_run_data(settings)
    except DataError as exc:
        sys.stderr.write(f"grpo-trainer: invalid data: {exc}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
