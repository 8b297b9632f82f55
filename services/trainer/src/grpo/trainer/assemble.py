"""Settings → the parts' own configs: the resolved algorithm preset, the LearnerConfig, the task recipe."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpo.trainer.config import TrainerSettings
from grpo.trainer.data import DataError, PromptRow, load_rows, load_sources
from grpo.trainer.order import Mixture, mixture_of
from grpo.trainer.publisher import TaskSpec
from grpo.trainer.sources import data_sources
from grpo.v1 import queue_pb2

if TYPE_CHECKING:
    from grpo.algo import LossConfig
    from grpo.trainer.learner import LearnerConfig, LoraOptions

log = logging.getLogger(__name__)

STALE_TIS_CAP = 2.0  # veRL's and Yao et al.'s usual cap


def resolve_algo(settings: TrainerSettings, *, warn: bool = True) -> LossConfig:
    """The preset's values with every explicitly set algorithm field laid over them (`warn`: log what was added;
    the start-up check resolves each stage before the run does, and one warning per run is enough)."""
    from grpo.algo import get_preset

    overrides = settings.algo_overrides()
    if overrides.get("ref_refresh_steps") == 0:
        overrides["ref_refresh_steps"] = None  # 0 in the settings means never, as None does in a preset
    algo = get_preset(settings.preset).with_overrides(**overrides)
    if settings.mode == "grpo" and settings.max_staleness > 0 and not settings.sampler_exact and algo.tis_cap is None:
        # π_old is then the trainer's current policy, so a stale sample's ratio starts at 1: without TIS
        # against the sampler's log-probs it would be trained as if on-policy.
        (log.warning if warn else log.debug)(
            "max_staleness %d without exact sampler log-probs: stale samples are corrected with truncated importance "
            "sampling (tis_cap %.1f). Set sampler_exact: true (hf engine, float32) for the exact ratio, or tis_cap.",
            settings.max_staleness,
            STALE_TIS_CAP,
        )
        algo = algo.with_overrides(tis_cap=STALE_TIS_CAP)
    return algo


def overlong_buffer(settings: TrainerSettings, algo: LossConfig) -> int:
    """Tokens of DAPO's soft overlong ramp (0 = off), capped at half the length budget (max_new_tokens; with tools
    the episode's, which is then the penalty's max_tokens: see TaskSpec.length_budget)."""
    if not algo.overlong_soft_penalty:
        return 0
    budget = settings.episode_tokens()
    wanted = algo.overlong_buffer or budget // 4
    capped = min(wanted, budget // 2)
    if capped != wanted:
        log.info("overlong buffer %d capped to %d (length budget %d tokens)", wanted, capped, budget)
    return capped


def episode_rules(settings: TrainerSettings) -> queue_pb2.EpisodeSpec | None:
    """The episodes' rules every task carries, or None for a run without tools."""
    if not settings.tools:
        return None
    return queue_pb2.EpisodeSpec(
        tools=settings.tools,
        tool_format=settings.tool_format,
        max_turns=settings.max_turns,
        max_tool_calls=settings.tool_call_limit(),
        max_total_tokens=settings.episode_tokens(),
        max_tool_output_chars=settings.tool_output_chars,
        tool_timeout_s=settings.tool_timeout_s,
        tool_memory_mb=settings.tool_memory_mb,
        python_session=settings.python_session,
    )


def probe_rules(settings: TrainerSettings, algo: LossConfig) -> queue_pb2.ProbeSpec | None:
    """Adaptive group size: the probe every training task carries (flat on what the zero-variance filter compares),
    or None for whole groups."""
    if not settings.probe_size:
        return None
    return queue_pb2.ProbeSpec(size=settings.probe_size, on=algo.zero_variance_basis())


def task_spec(settings: TrainerSettings, algo: LossConfig) -> TaskSpec:
    return TaskSpec(
        group_size=algo.group_size,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        max_new_tokens=settings.max_new_tokens,
        stop=tuple(settings.stop),
        reward_weights=tuple(sorted(settings.reward_weights.items())),
        task_reward_weights=tuple(
            (task, tuple(sorted(weights.items()))) for task, weights in sorted(settings.task_reward_weights.items())
        ),
        apply_chat_template=settings.apply_chat_template,
        overlong_buffer_tokens=overlong_buffer(settings, algo),
        steps_json=json.dumps(settings.step_check, sort_keys=True) if settings.step_check else "",
        episode=episode_rules(settings),
        probe=probe_rules(settings, algo),
    )


def check_step_credit(settings: TrainerSettings, algo: LossConfig, rows: Sequence[PromptRow]) -> None:
    """Step credit needs step scores for every task: from the `step_check` setting or each row's checks.steps."""
    if algo.credit == "outcome":
        return
    if algo.credit == "process":  # it trains on the scores: steps that are only cut would leave every group unscored
        unscored = [row for row in rows if row.checks.get("steps", {}).get("source") == "cut"]
        if (settings.step_check or {}).get("source") == "cut" or unscored:
            where = "step_check" if (settings.step_check or {}).get("source") == "cut" else unscored[0].where
            raise DataError(f"credit 'process' trains on step scores, but {where} asks for source cut (no scores): "
                            "use source rule or prm, or credit vineppo")  # fmt: skip
    if settings.step_check:
        return
    missing = [row for row in rows if "steps" not in row.checks]
    if missing:
        raise DataError(
            f"credit {algo.credit!r} ({settings.preset} preset) needs steps, but {len(missing)} of {len(rows)} rows "
            f"(the first: {missing[0].where}) have no checks.steps: set `step_check`, e.g. {{source: rule, rule: "
            f"column_addition}} or {{source: cut, delimiter: '\\n\\n'}}, or add checks.steps to the rows"
        )


def model_context(model: str) -> int:
    """The policy model's context length in tokens (its config's max_position_embeddings)."""
    from transformers import AutoConfig

    from grpo.common.tiny_model import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(model))
    return int(getattr(config, "max_position_embeddings", 0) or 0)


def fit_prompts(
    rows: Sequence[PromptRow], prompt_tokens: Callable[[PromptRow], int], settings: TrainerSettings, context: int
) -> tuple[list[PromptRow], int]:
    """The rows whose prompt leaves room for the length budget (max_new_tokens; with tools the episode's) in the
    model's context, and the longest of their
    prompts in tokens. The rollout refuses the others on every epoch (and an evaluation counts them as failed, not
    wrong): DataError naming the first under `overlong_prompts: error`, left out and counted under `drop`."""
    lengths = [prompt_tokens(row) for row in rows]
    budget = settings.episode_tokens()
    room = context - budget if context > 0 else max(lengths, default=0)
    over = [(row, n) for row, n in zip(rows, lengths, strict=True) if n > room]
    if not over:
        return list(rows), max(lengths, default=0)
    first, n = over[0]
    limit = f"max_episode_tokens {budget}" if settings.tools else f"max_new_tokens {budget}"
    what = (f"{len(over)} of {len(rows)} prompts (the first: {first.where}, {n} tokens) leave no room for "
            f"{limit} in the model's context of {context} tokens")  # fmt: skip
    if settings.overlong_prompts == "error" or len(over) == len(rows):
        raise DataError(f"{what}: shorten them, lower {limit.split()[0]}, or set overlong_prompts: drop to leave "
                        "them out")  # fmt: skip
    log.warning("%s: left out (overlong_prompts: drop)", what)
    kept = [(row, n) for row, n in zip(rows, lengths, strict=True) if n <= room]
    return [row for row, _ in kept], max(n for _, n in kept)


def check_reward_weights(spec: TaskSpec, rows: Sequence[PromptRow]) -> None:
    """Every weight's name must be a component of every row it is sent with (reward_weights, or task_reward_weights
    for the row's task_type): the reward service refuses an item whose weights name a component its checks lack, so
    each such task would come back failed, on every epoch."""
    present = sorted({row.task_type for row in rows})
    unknown = sorted(task for task, _ in spec.task_reward_weights if task not in present)
    if unknown:
        raise DataError(f"task_reward_weights names task type(s) {unknown} that no row has; the rows' task types: "
                        f"{present}")  # fmt: skip
    added = {"overlong"} if spec.overlong_buffer_tokens > 0 else set()  # build_task adds it to every task
    own = dict(spec.task_reward_weights)
    by_setting: dict[str, list[PromptRow]] = {}  # task type with weights of its own ("": reward_weights) -> rows
    for row in rows:
        by_setting.setdefault(row.task_type if row.task_type in own else "", []).append(row)
    for task, sent_with in by_setting.items():
        setting = f"task_reward_weights[{task}]" if task else "reward_weights"
        for name, _ in own.get(task, spec.reward_weights):
            lacking = [row for row in sent_with if name not in row.components() | added]
            if not lacking:
                continue
            known = sorted(set().union(*(row.components() for row in sent_with)) | added)
            hint = "a typo?" if len(lacking) == len(sent_with) else f"{len(lacking)} of {len(sent_with)} rows lack it"
            raise DataError(
                f"{setting} names {name!r}, but {lacking[0].where} has no {name!r} check ({hint}): the reward "
                f"service fails every task whose weights name a check it lacks. The rows' checks: {known}"
                + (
                    ""
                    if own
                    else "; a run whose task types have different checks can weight each type on its own "
                    "with task_reward_weights"
                )
            )


@dataclass(frozen=True)
class GrpoData:
    """A GRPO run's rows, checked against its settings: what it trains on, what it evaluates on, and the longest
    prompt of either in tokens (what every replica's context must hold with max_new_tokens)."""

    rows: list[PromptRow]
    eval_rows: list[PromptRow]
    longest_prompt: int
    mixture: Mixture | None = None  # how `rows` are drawn (train_data's weights or task_weights); None: as they come


def load_grpo_data(settings: TrainerSettings, algo: LossConfig, spec: TaskSpec, tokenizer_model: str) -> GrpoData:
    """Read and check a GRPO run's data: every row, each prompt's room in the context, step credit, and the reward
    weights against every training and evaluation row. DataError names the file and the line.

    `tokenizer_model`: where the tokenizer and context length come from; a later stage's own model (the previous
    stage's final/) does not exist before that stage, and SFT leaves both as they were."""
    from grpo.trainer.evaluation import eval_rows
    from grpo.trainer.export import load_tokenizer
    from grpo.trainer.sft import encode_prompt

    tokenizer, context = load_tokenizer(tokenizer_model), model_context(tokenizer_model)
    if settings.tools and settings.tool_format == "chat" and not getattr(tokenizer, "chat_template", None):
        raise DataError(f"tool_format chat needs the model's chat template, and {tokenizer_model}'s tokenizer has "
                        "none: use tool_format tagged (<code>…</code>), or a model with a chat template")  # fmt: skip

    def prompt_tokens(row: PromptRow) -> int:
        return len(encode_prompt(tokenizer, row, settings.apply_chat_template))

    sources = data_sources(settings)
    loaded = load_sources([s.path for s in sources], tokenizer=tokenizer, default_checks=settings.default_checks)
    rows, longest = fit_prompts(loaded, prompt_tokens, settings, context)
    mixture = mixture_of(rows, sources, settings.task_weights)  # after fit_prompts: the rows that are drawn
    check_step_credit(settings, algo, rows)
    held_out: list[PromptRow] = []
    longest_held_out = 0
    if settings.eval_data:
        held_out, longest_held_out = fit_prompts(
            load_rows(settings.eval_data, tokenizer=tokenizer, default_checks=settings.default_checks),
            prompt_tokens,
            settings,
            context,
        )
    evaluated = eval_rows(held_out, settings.eval_size)
    check_reward_weights(spec, [*rows, *evaluated])  # eval tasks carry the weights too
    return GrpoData(rows, evaluated, max(longest, longest_held_out), mixture)


def learner_config(settings: TrainerSettings, algo: LossConfig) -> LearnerConfig:
    from grpo.trainer.learner import LearnerConfig

    # The schedule counts optimizer steps: ppo_epochs per GRPO step, one per SFT step. Settings speak in steps.
    per_step = settings.ppo_epochs if settings.mode == "grpo" else 1
    return LearnerConfig(
        model=settings.model,
        backend=settings.backend,
        seed=settings.seed,
        lr=settings.lr,
        weight_decay=settings.weight_decay,
        warmup_steps=settings.warmup_steps * per_step,
        lr_schedule=settings.lr_schedule,
        total_steps=settings.steps * per_step,
        max_grad_norm=settings.grad_clip,
        micro_batch_size=settings.micro_batch_size,
        packing=settings.packing,
        ppo_epochs=settings.ppo_epochs,
        # Greedy sampling still defines log-probs at T = 1 (the rollout's convention).
        temperature=settings.temperature if settings.temperature > 0 else 1.0,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        beta=algo.beta,
        kl_kind=algo.kl_kind,
        agg=algo.agg,
        ratio_level=algo.ratio_level,
        max_len=settings.episode_tokens(),  # Dr. GRPO's constant: the length budget of one sample
        tis_cap=algo.tis_cap,
        mask_truncated=algo.mask_truncated,
        sampler_exact=settings.sampler_exact,
        ref_refresh_steps=algo.ref_refresh_steps or 0,
        gradient_checkpointing=settings.gradient_checkpointing,
        precision=settings.precision,
        lora=lora_options(settings),
        zero_stage=settings.zero_stage,
        offload_optimizer=settings.offload_optimizer,
    )


def lora_options(settings: TrainerSettings) -> LoraOptions | None:
    from grpo.trainer.learner import LoraOptions

    if settings.lora_rank == 0:
        return None
    return LoraOptions(
        r=settings.lora_rank, alpha=settings.lora_alpha, target_modules=tuple(settings.lora_target_modules)
    )


def build_learner(settings: TrainerSettings, algo: LossConfig | None = None) -> Any:
    """The Learner for the configured mode (SFT never loads a reference model). Collective under DeepSpeed.

    `algo`: the run's already resolved algorithm (resolving logs its warnings; once per process is enough).
    """
    from grpo.trainer.learner import Learner

    algo = algo or resolve_algo(settings)
    if settings.mode == "sft":
        algo = algo.with_overrides(beta=0.0)
    return Learner(learner_config(settings, algo))
