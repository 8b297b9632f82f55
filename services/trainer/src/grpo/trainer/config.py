"""The trainer's settings: one typed, documented class; parsed before torch is imported.

Precedence: field defaults < `--preset` values < config file < env (GRPO_TRAINER_*) < CLI flags.
Algorithm fields (group size, beta, clipping, loss aggregation, advantage mode, ...) default to
None, meaning "the preset's value"; `algo_overrides()` returns only what was set explicitly,
and `assemble.resolve_algo` lays them over `grpo.algo.get_preset(preset)`. Their defaults are
therefore defined in one place, `grpo.algo.presets` (LossConfig's field defaults, the `grpo` preset).
The checks across fields are plain functions in `config_checks`, which the model validator below calls in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo.algo.presets import PRESETS as ALGO_PRESETS
from grpo.algo.presets import LossConfig
from grpo.common.settings import LogLevel, ServiceSettings, load_settings, service_config
from grpo.trainer.config_checks import (
    check_algorithm,
    check_broadcast,
    check_buckets,
    check_colocate,
    check_data_settings,
    check_rejection_sampling,
    check_step_check,
)

PRESETS = tuple(ALGO_PRESETS)
# The algorithm settings: every LossConfig knob, each a field below defaulting to None ("the preset's"); the module
# refuses to load if one is missing (see the end of this file), so a new knob cannot be left without a setting.
ALGO_FIELDS = LossConfig.knobs()


class TrainerSettings(ServiceSettings):
    """grpo-trainer: owns a GRPO run (data, publishing, updates, weight push, checkpoints)."""

    model_config = service_config("GRPO_TRAINER_", "grpo-trainer")

    mode: Literal["grpo", "sft", "rejection_sampling"] = "grpo"
    """`grpo`: the RL loop through Redis and the rollout service; `sft`: cold-start SFT on (prompt, response) pairs;
    `rejection_sampling` (a stage of a staged run, R1's stage 3): the stage's model samples rs_samples answers per
    prompt through the rollout replicas, the reward service scores them, and the verified ones (the rs_* filters)
    are written as SFT rows to the stage folder's data.jsonl, which a later stage trains on (`train_data: previous`)."""
    stages: list[dict[str, Any]] = Field(default_factory=list)
    """A staged run, e.g. R1's `[{mode: sft, train_data: sft.jsonl, steps: 300}, {mode: grpo}]`: each stage is these
    settings overridden by its own. A stage's `model` may be `base` (the run's `model`) or `previous` (the final model
    of the latest earlier sft or grpo stage; the default), and its `train_data` may refer to what an earlier
    rejection_sampling stage wrote: `previous` or `stage:<N>`. Stage i writes to output_dir/stage-<i>-<mode>; a
    restart skips finished stages and resumes the current one."""
    stage: int = Field(0, ge=0)
    """Set by the run, not by you: the stage's 1-based index in a staged run (0: not a staged run). It goes into the
    stage's task ids, so that two stages of one run never share one."""
    preset: Literal["grpo", "dapo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "prm", "vineppo"] = "grpo"
    """Named algorithm preset (grpo.algo); its values are defaults that explicit settings override."""
    model: str = "tiny"
    """Model: a local Hugging Face folder, a hub id, or `tiny` for the built-in tiny Qwen2 model. Inside `stages`
    also `base` (the run's own `model`) or `previous` (the final model of the latest earlier sft or grpo stage)."""
    train_data: Path | list[str | dict[str, Any]] | None = None
    """Training prompts (JSONL or Parquet: prompt, task_type, checks, optional id). Required in grpo mode;
    in sft mode rows need `response` too. A list is a mixture of sources: each item a path, or
    `{data: <path>, weight: <number > 0>}` (a bare item weighs 1). Without any `weight` the sources' rows are simply
    joined; with one, source s gets weight_s / sum(weights) of each epoch's draws, however many rows it holds. Inside
    `stages` an item (or the whole value) may be `previous` (the data the latest earlier rejection_sampling stage
    wrote) or `stage:<N>` (the data stage N, an earlier rejection_sampling stage, wrote)."""
    task_weights: dict[str, float] = Field(default_factory=dict)
    """Sampling shares by the rows' `task_type`, e.g. {math: 2, chat: 1}: each epoch's draws are split between the
    task types in these proportions (a type present in the data without a weight weighs 1). Empty: rows are drawn as
    they come. Not together with a weighted train_data list (set one)."""
    default_checks: dict[str, Any] | None = None
    """The reward checks of a GRPO row that has no `checks` (or `gold`), e.g. {reward_model: {}}: a hybrid reward,
    rules where a row has them and the reward model for the rest. Unset: such a row is refused."""
    rs_samples: int = Field(8, ge=1)
    """rejection_sampling: answers sampled per prompt (k; the stage's group size, group_size is not used)."""
    rs_prompts: int = Field(0, ge=0)
    """rejection_sampling: prompts sampled (0: every train_data row once); the stage runs ceil(rs_prompts /
    prompts_per_step) steps (`steps` is not used)."""
    rs_keep_per_prompt: int = Field(1, ge=1)
    """rejection_sampling: answers kept per prompt at most (m)."""
    rs_require: list[str] | None = None
    """rejection_sampling: the reward components an answer must pass (score >= rs_pass_score), e.g. [math, format].
    None: every component the row's checks ask for except overlong and reward_model (which are not pass/fail)."""
    rs_pass_score: float = Field(1.0, allow_inf_nan=False)
    """rejection_sampling: the score at which a required component passes."""
    rs_shortest_first: bool = False
    """rejection_sampling: keep a prompt's shortest passing answers (in tokens) first; false: in sample order."""
    rs_filters: list[str] = Field(default_factory=list)
    """rejection_sampling: readability filters applied after the pass check (R1's): `mixed_language` (letters of more
    than one script), `truncated` (hit the length limit), `overlong` (more than rs_max_tokens tokens), or a plug-in
    `package.module:function` that takes one candidate (a dict: prompt, response, row_id, task_type, components,
    tokens, truncated) and returns True to keep it, False or a reason to reject it. Equal answers to one prompt
    (whitespace aside) are always kept once."""
    rs_max_tokens: int = Field(0, ge=0)
    """rejection_sampling: the `overlong` filter's limit in tokens (that filter needs it set)."""
    eval_data: Path | None = None
    """Held-out prompts for periodic evaluation (same format); no evaluation when unset."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the task/group streams and the replica registry."""
    run_id: str = "default"
    """Run name: namespaces the Redis keys (shared with the rollout service) and the task ids."""
    output_dir: Path = Path("runs/default")
    """Checkpoints (checkpoints/), metrics (metrics.jsonl, tensorboard/) and the final model (final/)."""

    steps: int = Field(100, ge=1)
    """Optimizer updates (each consumes one batch of groups) before the run ends."""
    prompts_per_step: int = Field(8, ge=1)
    """Prompt tasks per batch; each yields one group of G samples."""
    group_size: int | None = Field(None, ge=1)
    """G, samples per prompt (R1: 16). None: the preset's."""
    probe_size: int = Field(0, ge=0)
    """Adaptive group size: the rollout samples this many answers of a group first and the rest of G only when they
    disagree (on zero_variance_on); a probe whose answers all agree comes back as a zero-variance group of probe_size
    samples, costing probe_size instead of G. A task carries the probe only where its prompt's last judged group
    says it pays (fewer samples on flat groups: at G 8, probe 4, prompts last solved 0, 1, 7 or 8 times), since a
    short probe agrees by chance far more often than G samples do (docs/algorithms.md). 2 <= probe_size < G; needs
    skip_zero_variance and outcome credit. 0: off."""
    probe_all: bool = False
    """Adaptive group size: every training task carries the probe, unseen prompts included (data with many prompts
    the policy never, or always, solves); measured on the demo, where most flat groups are chance, it spends more."""
    max_staleness: int = Field(0, ge=0)
    """Policy versions a group may lag; at most max_staleness+1 batches in flight. 0: strictly on-policy."""
    max_refill_per_step: int | None = Field(None, ge=0)
    """Dynamic sampling: extra tasks a step may publish to replace zero-variance groups (None = 2 × prompts_per_step)."""
    # ---- difficulty buckets (difficulty.py) ----
    skip_solved_after: int = Field(0, ge=0)
    """Difficulty buckets: a prompt every sample of which solved it (correctness 1, math or code) in this many groups
    in a row is `easy`, and the sampler passes it over (no task is published; the cursor moves on) for
    revisit_after_epochs epochs. Spends no rollouts on groups that would be zero-variance. 0: off."""
    set_aside_after: int = Field(0, ge=0)
    """Difficulty buckets: a prompt no sample solved in this many groups in a row is `hard`, and is set aside (passed
    over) for revisit_after_epochs epochs. 0: off. Rows without a correctness check (reward model) are never skipped."""
    skip_flat_above: float = Field(0.0, ge=0.0, le=1.0)
    """Difficulty buckets, predicted flat groups: a prompt whose next group would be flat (every sample solving it,
    or none) with at least this chance is set aside for revisit_after_epochs epochs. The chance comes from its last
    judged group (pass rate ~ Beta(1 + solved, 1 + missed)): with G = 8, 0.25 sets aside rows last solved 7 or 8
    times, or 0 or 1 time. Catches the rows near the ends whose samples agree by chance. 0: off."""
    revisit_after_epochs: int = Field(1, ge=1)
    """Difficulty buckets: epochs a prompt set aside as easy or hard is passed over before it is drawn again (set
    aside in epoch e, it comes back in e + revisit_after_epochs + 1); that group decides its bucket anew."""
    bucket_weights: dict[Literal["easy", "medium", "hard", "unseen"], float] = Field(default_factory=dict)
    """Difficulty buckets, curriculum: the share in [0, 1] of each bucket's draws that are taken (an unnamed bucket:
    1), e.g. {easy: 0.25, hard: 0.5} after their set-aside epochs; the coin is a hash of the draw's position, so a
    resumed run takes the same draws. easy needs skip_solved_after, hard set_aside_after. Empty: no weighing."""
    # ---- end difficulty buckets ----
    redis_outage_s: float = Field(120.0, gt=0)
    """How long the run rides out an unreachable Redis (retrying) before it fails with an error."""
    group_timeout_s: float = Field(600.0, gt=0)
    """A task whose group has not arrived this long after publishing is dropped (reason `timeout`)."""
    max_failed_steps: int = Field(3, ge=1)
    """Fail the run (exit 1, no final model) after this many steps in a row in which every group failed: the
    rollout or reward service refuses the tasks (e.g. max_new_tokens over the rollout's cap); the log says why."""

    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    """Sampling temperature for training rollouts."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    top_k: int = Field(0, ge=0)
    """Top-k sampling (0 = off)."""
    max_new_tokens: int = Field(256, ge=1)
    """Completion length limit; hitting it marks the completion truncated."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings (kept in the text)."""
    apply_chat_template: bool = False
    """Wrap text prompts as one user message in the chat template (chat-message prompts always use it)."""
    tools: list[str] = Field(default_factory=list)
    """Tools the model may call, e.g. [python] (the reward service's sandbox) or the rollout's tool_plugins names.
    Non-empty: every task, training and evaluation, is a multi-turn episode (docs/multi-turn.md): the model acts, a
    tool's result is appended as tokens it did not sample (never trained on), until it answers without a call or a
    limit ends the episode; the reward scores its final answer. Empty: one completion per sample."""
    tool_format: Literal["tagged", "chat", "markdown"] = "tagged"
    """How the model calls a tool: `tagged` (`<code>…</code>`, answered with `<output>…</output>`; any model),
    `chat` (the chat template's `<tool_call>` JSON and tool messages, Qwen/Hermes style; needs a tokenizer with a chat
    template and apply_chat_template: true) or `markdown` (a ```python block, then ```output, answered with the
    result and a closing fence: Qwen2.5-Math-Instruct's tool-integrated reasoning, ToRA, ToRL)."""
    max_turns: int = Field(4, ge=1)
    """Model turns per episode at most (the last one must answer: a call in it ends the episode unrun)."""
    max_tool_calls: int | None = Field(None, ge=0)
    """Tool calls per episode at most; a call past it ends the episode without running. None: max_turns - 1."""
    max_episode_tokens: int = Field(0, ge=0)
    """Tokens after the prompt per episode, the model's and the tools' together (max_new_tokens stays each turn's
    limit). 0: max_turns × max_new_tokens. It is the episodes' length budget everywhere a run needs one: the room a
    prompt must leave in the context, the overlong penalty's max_tokens (its ramp ends at the episode budget, over
    every token after the prompt) and Dr. GRPO's constant normaliser (seq_mean_token_sum)."""
    tool_timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit of one tool call; a call past it is answered `Error: timed out …` (the model sees it)."""
    tool_output_chars: int = Field(1000, ge=1)
    """A tool result longer than this keeps its head and tail (` … ` between) before it is appended."""
    tool_memory_mb: int = Field(0, ge=0)
    """Memory limit of one python tool call (0: the reward service's default)."""
    python_session: bool = False
    """An episode's python calls share their state, as a notebook's cells do: each call runs after the episode's
    earlier calls, replayed with their output hidden (python's `random` seeded, so that they draw the same again;
    a call that ran past a limit is not replayed). False: each call is a fresh program."""
    overlong_prompts: Literal["error", "drop"] = "error"
    """A prompt whose tokens plus max_new_tokens exceed the model's context fails every time it is sampled: refuse
    the run naming its row (`error`), or leave such rows out, counted in the log (`drop`)."""

    beta: float | None = Field(None, ge=0)
    """KL coefficient to the reference model (0: no reference model is loaded). None: the preset's."""
    clip_low: float | None = Field(None, ge=0)
    """PPO clip epsilon below 1. None: the preset's."""
    clip_high: float | None = Field(None, ge=0)
    """PPO clip epsilon above 1 (DAPO clip-higher). None: the preset's."""
    kl_kind: Literal["k1", "k2", "k3"] | None = None
    """KL estimator. None: the preset's."""
    agg: Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"] | None = None
    """Loss aggregation. None: the preset's."""
    advantage_mode: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "rank"] | None = None
    """Advantage estimator. None: the preset's."""
    ratio_level: Literal["token", "sequence"] | None = None
    """Importance ratio per token (PPO/GRPO) or per sequence (GSPO). None: the preset's."""
    skip_zero_variance: bool | None = None
    """Drop groups whose rewards are all equal (no signal). None: the preset's."""
    tis_cap: float | None = Field(None, gt=0)
    """Truncated importance sampling cap against the sampler's log-probs. None: the preset's."""
    refill_zero_variance: bool | None = None
    """Refill the batch with new tasks for every zero-variance drop (DAPO). None: the preset's."""
    zero_variance_on: Literal["auto", "reward", "accuracy"] | None = None
    """What the zero-variance filter compares: `reward` (clipped as the advantages see it), `accuracy` (the math or
    code correctness score, DAPO's filter; the reward for groups without one), `auto` (accuracy when refilling,
    else the reward). None: the preset's."""
    ref_refresh_steps: int | None = Field(None, ge=0)
    """Copy the policy into the reference model every N steps (R1: 400; 0 = never). None: the preset's."""
    overlong_soft_penalty: bool | None = None
    """Ask the reward service for DAPO's soft overlong penalty, ramping to max_new_tokens (with tools: to the episode's
    budget, max_episode_tokens resolved, over all its tokens after the prompt). None: the preset's."""
    overlong_buffer: int | None = Field(None, ge=1)
    """Tokens before the length budget over which that penalty ramps (capped at half the budget: max_new_tokens, or
    with tools the episode's). None: the preset's."""
    mask_truncated: bool | None = None
    """Exclude completions that hit max_new_tokens from the loss (DAPO overlong masking). None: the preset's
    (on for dapo; R1, the seeds and TRL train on truncated completions)."""
    std_unbiased: bool | None = None
    """Group std with Bessel's correction, ÷(G−1), as the seeds' code, TRL and veRL; false: ÷G. None: the preset's."""
    advantage_eps: float | None = Field(None, gt=0)
    """Added to the group std before dividing. None: the preset's."""
    reward_clip: tuple[float, float] | None = None
    """[lo, hi]: clamp rewards before the group statistics (the seeds' reward clipping). None: the preset's."""
    credit: Literal["outcome", "process", "vineppo"] | None = None
    """`outcome`: one advantage per completion; `process`: per step, from the step scores the reward service
    returns for each task's step check (process supervision, DeepSeekMath §4.1.3); `vineppo`: per step, from the
    values of the step boundaries estimated by sampled continuations (VinePPO). None: the preset's."""
    process_advantage: Literal["cumulative", "step_aligned"] | None = None
    """Process advantages: `cumulative` (DeepSeekMath: group-normalised step scores summed from each step on) or
    `step_aligned` (the seed's: step k against step k of the other completions). None: the preset's."""
    process_weight: float | None = Field(None, ge=0, le=1)
    """A = (1 − w)·A_outcome + w·A_process per token (1: process only). None: the preset's."""
    vine_k: int | None = Field(None, ge=1)
    """VinePPO: continuations sampled at each split point to estimate its value. None: the preset's."""
    vine_max_splits: int | None = Field(None, ge=1)
    """VinePPO: split points per completion at most, spread evenly over its step boundaries. None: the preset's."""
    step_check: dict[str, Any] | None = None
    """The reward service's step check for tasks whose row has none, e.g. {"source": "rule", "rule":
    "column_addition"}, {"source": "prm", "delimiter": "\n\n"} or {"source": "cut", "delimiter": "\n\n"}
    (boundaries only). credit process and vineppo need it (or rows with checks.steps)."""

    lr: float = Field(1e-6, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up, in trainer steps (with ppo_epochs > 1 each step is several optimizer steps)."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """LR after warm-up; cosine reaches its floor at the last of `steps`."""
    grad_clip: float = Field(1.0, gt=0)
    """Max global grad norm."""
    micro_batch_size: int = Field(8, ge=1)
    """Sequences per forward/backward (gradient accumulation over the batch)."""
    packing: bool | Literal["auto"] = "auto"
    """Pack several samples into each row instead of padding each to its micro-batch's longest: rows as long as
    the batch's longest sample, micro_batch_size rows per forward, attention kept inside each sample. The same
    loss, gradients and metrics as padding up to float rounding, fewer token positions through the model
    (bench/bench_packing.py: 2.0× tokens/s at 52 % padding). auto (default): a batch is packed when that cuts its
    token positions by 30 % or more (train/packed says which were); a model that fails the start-up check (it
    must keep packed samples apart) pads. On the quick demos auto packed 0 of 80 addition steps and 3 of 80 tool
    steps, learning as padded runs do (docs/algorithms.md, bench/bench_packing_demo.py). true: always, and such a
    model refuses to start. false: never."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each batch (>1: old log-probs from before the first pass)."""
    sampler_exact: bool = False
    """The rollout computes fp32 log-probs exactly as the trainer does (hf engine, float32): use them as π_old,
    which also corrects stale samples exactly (PPO's ratio against the policy that generated them)."""
    seed: int = 0
    """Seed for the data order and torch."""
    backend: Literal["torch", "deepspeed"] = "torch"
    """Training backend."""
    # An int range, not Literal[1, 2, 3]: flags and env values arrive as text, which a Literal of ints refuses.
    zero_stage: int = Field(2, ge=1, le=3)
    """DeepSpeed ZeRO stage 1, 2 or 3 (backend deepspeed; launch with torchrun: rank 0 drives, the others follow)."""
    offload_optimizer: bool = False
    """DeepSpeed: keep the optimizer state on the CPU."""
    gradient_checkpointing: bool = False
    """Trade compute for memory."""
    lora_rank: int = Field(0, ge=0)
    """Train LoRA adapters of this rank instead of the whole model (0: full fine-tuning; peft, the `lora` extra).
    Weight pushes, checkpoints' `model/` aside, and `final/` carry the merged weights under the base names."""
    lora_alpha: int = Field(16, ge=1)
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)."""
    lora_target_modules: list[str] = Field(["q_proj", "k_proj", "v_proj", "o_proj"])  # copied per instance
    """Module names that get adapters (Qwen2/Llama attention projections by default; add gate_proj, up_proj,
    down_proj for the MLP)."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """The one precision of the policy, π_old and reference forward passes (log-probs, ratios and KL are always
    computed in fp32 from their logits). `auto`: bf16 on a GPU unless sampler_exact, fp32 on a CPU. Torch backend:
    autocast over fp32 weights; DeepSpeed: its bf16 mode, with the reference held in bf16 too."""

    checkpoint_every: int = Field(50, ge=1)
    """Write a checkpoint every K steps (and at the end / on SIGTERM)."""
    keep_checkpoints: int = Field(3, ge=1)
    """Keep the last N checkpoints."""
    resume: str = "auto"
    """`auto` (latest checkpoint in output_dir if any), `never`, or a checkpoint path."""
    when_done: Literal["exit", "serve"] = "exit"
    """After a finished run: `exit` 0 (a job: compose, `grpo up`), or `serve` the status, metrics and report APIs
    until stopped (a Kubernetes StatefulSet, whose restart policy would otherwise restart a finished run in a loop)."""

    eval_every: int = Field(0, ge=0)
    """Evaluate on eval_data every N steps (0 = only at the end when eval_data is set)."""
    eval_size: int = Field(64, ge=1)
    """Held-out prompts per evaluation."""
    eval_temperature: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Sampling temperature for evaluation (0 = greedy)."""
    eval_timeout_s: float = Field(300.0, gt=0)
    """Deadline for one evaluation's groups."""
    eval_before_train: bool = True
    """Evaluate the starting model once before the first GRPO update (step 0), as veRL's val_before_train: the
    baseline the run's gain is measured against."""

    reward_weights: dict[str, float] = Field(default_factory=dict)
    """Reward component weights sent with every task (e.g. {"math": 1.0, "format": 0.2}); unset = 1."""
    task_reward_weights: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Reward component weights per task_type, for a run whose task types are scored by different components (the
    hybrid reward, docs/reward.md): e.g. {add: {math: 1.0, format: 0.5}, chat: {reward_model: 1.0}}. A row of a listed
    type is sent its type's weights instead of reward_weights. As with reward_weights, each name must be a check of
    every row of that type (refused at start-up naming the row), and a type must be one the data hold."""

    push_timeout_s: float = Field(120.0, gt=0)
    """Deadline of one weight push to one replica."""
    push_retries: int = Field(1, ge=0)
    """Extra attempts for a replica whose push failed before it is dropped from this step's set."""
    weight_push: Literal["auto", "direct", "relay"] = "auto"
    """How a new weight version reaches the replicas: `direct` sends each its own copy (the trainer's egress grows
    with the replicas), `relay` sends one copy into a tree of replicas that pass it on as they receive it, each
    checking it itself; `auto` relays to 2 or more replicas. A replica the relay misses is pushed to directly."""
    relay_fanout: int = Field(1, ge=1)
    """Children of each replica in the relay tree (1: a chain, the least egress per replica, the most hops). A parent
    splits its NIC among its children, so where the NIC binds a chain is `relay_fanout`× faster, at ~6 ms per extra
    hop (measured: docs/scaling.md, "Weight transfer"); hence the chain by default (past 64 hops it becomes a tree of 2)."""
    weights_send_rate_mb_s: float = Field(0.0, ge=0)
    """Cap on the rate the trainer sends weight bytes at, in MB/s (10^6 bytes) over all its push streams together
    (10 Gb/s = 1,250); 0: no cap. Keeps weight pushes from starving other traffic on the trainer's links."""
    weights_token: str | None = None
    """Bearer token for the rollout's UpdateWeights; defaults to `token` (as the rollout's own weights_token does,
    so one API token for the whole deployment authenticates the weight push too)."""
    weight_transport: Literal["data_port", "broadcast"] = "data_port"
    """How updates reach the replicas: `data_port` (each replica's advertised data port, else the gRPC stream) or
    `broadcast` (the bytes sent once to all of them by a collective the trainer hosts; those it does not update get
    the ordinary push (`weight_push`); docs/gpu-weight-broadcast.md)."""
    broadcast_address: str = "127.0.0.1:0"
    """`host:port` where replicas reach the broadcast group's store (port 0: any free one); the group listens on that
    host's interface. Keep it on a private network: the store and the collective carry no credentials."""
    broadcast_backend: Literal["gloo", "nccl"] = "gloo"
    """The collective's backend: `gloo` (CPU memory, any network) or `nccl` (GPUs; see the doc for what is unverified)."""
    broadcast_timeout_s: float = Field(30.0, gt=0)
    """Bound on forming the broadcast group and on each piece; a round that misses it falls back to the data port."""
    rollout_tls_ca_file: str | None = None
    """PEM root certificates to verify the rollout replicas' TLS certificates; plaintext when unset."""
    colocate: dict[str, Any] | None = None
    """Host a rollout replica in this process (colocated mode, docs/colocated.md): it generates from the policy
    being trained (one model in memory, no weight transfer), taking turns with the updates. The mapping holds
    that replica's rollout settings (grpo-rollout's names: reward_addr is required; engine hf only, model and
    run are the trainer's); {} where the defaults do. null: separate replicas only. Torch backend, one process."""
    min_replicas: int = Field(1, ge=0)
    """Wait (up to replica_wait_s) for this many live rollout replicas before publishing."""
    replica_wait_s: float = Field(300.0, gt=0)
    """How long to wait for replicas at start before failing the run."""

    host: str = "0.0.0.0"
    """Bind address of the gRPC and HTTP servers."""
    grpc_port: int = Field(7053, ge=0, le=65535)
    """TrainerService gRPC port (0 = pick a free one)."""
    http_port: int = Field(8003, ge=0, le=65535)
    """HTTP port: /healthz, /metrics, /v1/status (0 = pick a free one)."""
    wandb_project: str | None = None
    """Also log every step's metrics to this Weights & Biases project (needs the `wandb` extra; the
    usual WANDB_API_KEY / WANDB_MODE / WANDB_DIR environment applies). Unset: no W&B."""
    token: str | None = None
    """Bearer token required by the trainer's gRPC API and HTTP /v1/status (off when unset; /healthz, /metrics open)."""
    tls_cert_file: str | None = None
    """PEM certificate for gRPC TLS (with tls_key_file); plaintext when unset."""
    tls_key_file: str | None = None
    """PEM private key for gRPC TLS."""
    log_level: LogLevel = "INFO"
    """Logging level."""
    json_logs: bool = False
    """One JSON object per log line."""
    torch_threads: int = Field(0, ge=0)
    """torch intra-op threads (0 = torch's default)."""

    @field_validator("resume")
    @classmethod
    def _resume_value(cls, value: str) -> str:
        if value in ("auto", "never"):
            return value
        if not Path(value).exists():
            raise ValueError(f"must be 'auto', 'never' or an existing checkpoint path; {value!r} does not exist")
        if not (Path(value) / "trainer_state.json").is_file():  # checkpoint.STATE_FILE (that module imports torch)
            raise ValueError(
                f"{value!r} is not a checkpoint (no trainer_state.json); checkpoints are "
                "<output_dir>/checkpoints/step-<N>"
            )
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url_value(cls, value: str) -> str:
        # redis-py's own error names no setting and surfaces as a traceback once the model has loaded.
        if not value.startswith(("redis://", "rediss://", "unix://")):
            # Only what follows the credentials: a mistyped scheme must not put a password into the logs.
            raise ValueError(
                f"redis_url must start with redis://, rediss:// or unix:// (got …{value.rpartition('@')[2]!r})"
            )
        return value

    @field_validator("run_id")
    @classmethod
    def _run_id_value(cls, value: str) -> str:
        if not value or any(c in value for c in "{}: \n"):
            raise ValueError(f"run id {value!r} must be non-empty, without braces, colons or spaces")
        return value

    @model_validator(mode="after")
    def _needs_data(self) -> TrainerSettings:
        if self.train_data is None:
            raise ValueError("train_data is required: a JSONL or Parquet file of prompts (--train-data PATH)")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        if self.weights_token is None:
            self.weights_token = self.token
        check_broadcast(self)
        if self.reward_clip is not None and self.reward_clip[0] > self.reward_clip[1]:
            raise ValueError(f"reward_clip={list(self.reward_clip)} must be [lo, hi] with lo <= hi")
        if self.sampler_exact and self.precision == "bf16":
            raise ValueError(
                "precision bf16 with sampler_exact: the sampler's fp32 log-probs are exact only against an fp32 "
                "forward; set precision fp32 (or auto), or drop sampler_exact"
            )
        if self.step_check is not None:
            check_step_check(self.step_check)
        if self.clip_low is not None and self.clip_low >= 1:
            raise ValueError(f"clip_low={self.clip_low} must be < 1 (the ratio is clipped to [1 - clip_low, ...])")
        if self.mode == "grpo":
            check_algorithm(self)
        elif self.probe_size:
            raise ValueError(f"probe_size (adaptive group size) samples GRPO groups; mode {self.mode} samples none: "
                             "leave it 0")  # fmt: skip
        check_data_settings(self)
        check_rejection_sampling(self)
        check_buckets(self)
        check_colocate(self)
        if self.stages:
            from grpo.trainer.stages import plan_stages

            plan_stages(self)  # a bad stage (or a reference to a stage) fails at start-up, naming it
        return self

    def episode_tokens(self) -> int:
        """The length budget of one sample in tokens after the prompt: an episode's (max_episode_tokens, or
        max_turns × max_new_tokens), or one completion's max_new_tokens without tools."""
        if not self.tools:
            return self.max_new_tokens
        return self.max_episode_tokens or self.max_turns * self.max_new_tokens

    def tool_call_limit(self) -> int:
        """Tool calls per episode at most (max_tool_calls, else max_turns - 1: the last turn answers)."""
        return self.max_tool_calls if self.max_tool_calls is not None else self.max_turns - 1

    def run_record(self) -> dict[str, Any]:
        """The settings as a run's record (W&B's config, a third party's store): no tokens, and the Redis URL
        without its password."""
        from grpo.common.queue import redacted

        return {
            **self.model_dump(mode="json", exclude={"token", "weights_token"}),
            "redis_url": redacted(self.redis_url),
        }

    def algo_overrides(self) -> dict[str, object]:
        """The algorithm settings given explicitly (not None): they win over the preset's values."""
        return {name: getattr(self, name) for name in ALGO_FIELDS if getattr(self, name) is not None}


def _check_algo_fields() -> None:
    """Every LossConfig knob is a setting defaulting to None: another default here would be a second definition."""
    fields = TrainerSettings.model_fields
    missing = [name for name in ALGO_FIELDS if name not in fields]
    defaulted = [name for name in ALGO_FIELDS if name in fields and fields[name].default is not None]
    if missing or defaulted:
        raise TypeError(
            f"TrainerSettings: LossConfig knobs without a setting {missing}, settings with a default of their own "
            f"{defaulted}; each needs a field `<name>: <type> | None = None` (None: the preset's value)"
        )


_check_algo_fields()


def parse_settings(argv: list[str] | None = None) -> TrainerSettings:
    """Settings from defaults, `--config`/GRPO_TRAINER_CONFIG file, GRPO_TRAINER_* env and CLI flags."""
    # `--run` as well: the rollout's name for the same run (both take either).
    return load_settings(TrainerSettings, argv, env_file_var="GRPO_TRAINER_CONFIG", flag_aliases={"--run-id": "--run"})
