"""The run's data, checked at start-up against its settings, for every stage that is still to run.

A stage reads its data only when it starts: a bad row of a GRPO stage used to surface after the SFT stage before it
had trained for minutes. Here every unfinished stage's rows (and a plain run's) are read and checked as that stage
will check them, before anything trains; each error names the stage, the file and the line, and `main` turns it into
one line and exit code 2, as it does for a bad setting (`grpo up`, which starts the trainer, passes that code on).
The one exception is data this run is still to write (a rejection_sampling stage's data.jsonl): it is checked when
the stage that reads it starts.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from grpo.trainer.config import TrainerSettings
from grpo.trainer.data import DataError, load_sources
from grpo.trainer.order import mixture_of
from grpo.trainer.sources import data_sources

if TYPE_CHECKING:
    from grpo.trainer.stages import Stage

log = logging.getLogger(__name__)


def check_run_data(settings: TrainerSettings) -> None:
    """DataError (naming the stage, the file and the line) for the first data problem of any stage still to run.

    Data an earlier stage of this run is still to write (a rejection_sampling stage's data.jsonl) cannot be read yet:
    it is checked when its stage starts, which the log says; the stage's other files are checked now."""
    if not settings.stages:
        if needs_data(settings):
            check_stage_data(settings, settings.model)
        return
    from grpo.trainer.stages import plan_stages, read_outcome

    stages = plan_stages(settings)
    tokenizer_model = settings.model
    for stage, raw in zip(stages, settings.stages, strict=True):
        # A stage without its own model continues the previous one, whose final/ does not exist yet; SFT keeps the
        # tokenizer and the context length, so the chain's last named model stands in for it.
        named = raw.get("model")
        if named == "base":
            tokenizer_model = settings.model
        elif named not in (None, "previous"):
            tokenizer_model = str(named)
        if read_outcome(stage) is not None:
            continue  # finished: its data is not read again
        checked = checkable_now(stage.settings, stages[: stage.index - 1], stage.index)
        if checked is None:
            continue
        try:
            check_stage_data(checked, tokenizer_model)
        except DataError as exc:
            raise DataError(f"stage {stage.index} ({stage.mode}): {exc}") from None
    log.info("the data of every stage still to run checked")


def checkable_now(settings: TrainerSettings, earlier: list[Stage], index: int) -> TrainerSettings | None:
    """The stage's settings with only the train_data that exists at start-up: a file an earlier, unfinished
    rejection_sampling stage of this run will write is left out (and logged); None when no file is left."""
    from grpo.trainer.stages import produced_by, read_outcome

    sources = data_sources(settings)
    later = [s for s in sources if (p := produced_by(earlier, s.path)) is not None and read_outcome(p) is None]
    if not later:
        return settings
    for source in later:
        producer = produced_by(earlier, source.path)
        assert producer is not None
        log.info("stage %d (%s): train_data %s is written by stage %d (rejection_sampling) of this run: it is checked "
                 "when stage %d starts", index, settings.mode, source.path, producer.index, index)  # fmt: skip
    now = [s for s in sources if s not in later]
    if not now:
        return None
    # The later file's rows are not known yet: the shares (weights, task_weights) are checked with them at the start.
    return settings.model_copy(update={"train_data": [str(s.path) for s in now], "task_weights": {}})


def needs_data(settings: TrainerSettings) -> bool:
    """Whether a plain run will read its data: not when it has finished, or when only its final/ is left to write
    from its last checkpoint (a run whose data was since moved must still finish)."""
    from grpo.trainer.service import end_checkpoint, final_evaluation_lost

    if settings.mode == "rejection_sampling":
        from grpo.trainer.rejection import rs_finished

        return not rs_finished(settings.output_dir)
    return end_checkpoint(settings) is None or final_evaluation_lost(settings)


def check_stage_data(settings: TrainerSettings, tokenizer_model: str) -> None:
    """Read and check the rows as the run (or stage) will: SFT pairs, or GRPO's prompts against its settings."""
    if settings.mode == "sft":
        from grpo.trainer.export import load_tokenizer

        sources = data_sources(settings)
        rows = load_sources([s.path for s in sources], need_response=True, tokenizer=load_tokenizer(tokenizer_model))
        mixture_of(rows, sources, settings.task_weights)
        return
    if settings.mode == "rejection_sampling":  # GRPO's prompts, each with something to pass, and the filters
        from grpo.trainer.rejection_run import check_rs_data

        check_rs_data(settings, tokenizer_model)
        return
    from grpo.trainer.assemble import load_grpo_data, resolve_algo, task_spec

    algo = resolve_algo(settings, warn=False)
    load_grpo_data(settings, algo, task_spec(settings, algo), tokenizer_model)
