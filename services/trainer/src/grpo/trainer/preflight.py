"""The run's data, checked at start-up against its settings, for every stage that is still to run.

A stage reads its data only when it starts: a bad row of a GRPO stage used to surface after the SFT stage before it
had trained for minutes. Here every unfinished stage's rows (and a plain run's) are read and checked as that stage
will check them, before anything trains; each error names the stage, the file and the line, and `main` turns it into
one line and exit code 2, as it does for a bad setting (`grpo up`, which starts the trainer, passes that code on).
"""

from __future__ import annotations

import logging

from grpo.trainer.config import TrainerSettings
from grpo.trainer.data import DataError, load_rows

log = logging.getLogger(__name__)


def check_run_data(settings: TrainerSettings) -> None:
    """DataError (naming the stage, the file and the line) for the first data problem of any stage still to run."""
    if not settings.stages:
        if needs_data(settings):
            check_stage_data(settings, settings.model)
        return
    from grpo.trainer.stages import plan_stages, read_outcome

    tokenizer_model = settings.model
    for stage, raw in zip(plan_stages(settings), settings.stages, strict=True):
        # A stage without its own model continues the previous one, whose final/ does not exist yet; SFT keeps the
        # tokenizer and the context length, so the chain's last named model stands in for it.
        tokenizer_model = str(raw.get("model") or tokenizer_model)
        if read_outcome(stage) is not None:
            continue  # finished: its data is not read again
        try:
            check_stage_data(stage.settings, tokenizer_model)
        except DataError as exc:
            raise DataError(f"stage {stage.index} ({stage.mode}): {exc}") from None
    log.info("the data of every stage still to run checked")


def needs_data(settings: TrainerSettings) -> bool:
    """Whether a plain run will read its data: not when it has finished, or when only its final/ is left to write
    from its last checkpoint (a run whose data was since moved must still finish)."""
    from grpo.trainer.service import end_checkpoint, final_evaluation_lost

    return end_checkpoint(settings) is None or final_evaluation_lost(settings)


def check_stage_data(settings: TrainerSettings, tokenizer_model: str) -> None:
    """Read and check the rows as the run (or stage) will: SFT pairs, or GRPO's prompts against its settings."""
    assert settings.train_data is not None
    if settings.mode == "sft":
        from grpo.trainer.export import load_tokenizer

        load_rows(settings.train_data, need_response=True, tokenizer=load_tokenizer(tokenizer_model))
        return
    from grpo.trainer.assemble import load_grpo_data, resolve_algo, task_spec

    algo = resolve_algo(settings, warn=False)
    load_grpo_data(settings, algo, task_spec(settings, algo), tokenizer_model)
