"""The trainer settings' checks across fields: plain functions that raise ValueError with the message a user sees.

TrainerSettings' model validator (config.py) calls them, in order, at start-up; the fields and their docs stay there.
Like config.py this module loads no torch: what a check needs beyond the settings (the presets, the reward service's
Checks shape, the colocated replica's settings) is imported inside it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from grpo.trainer.sources import MODEL_REFERENCES, check_train_data

if TYPE_CHECKING:
    from grpo.algo.presets import LossConfig
    from grpo.trainer.config import TrainerSettings

PLUGIN_NAME = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def check_broadcast(settings: TrainerSettings) -> None:
    """The broadcast weight transport: unencrypted, so not beside TLS, and an address the replicas can reach."""
    if settings.weight_transport == "broadcast" and settings.rollout_tls_ca_file:
        raise ValueError("weight_transport=broadcast sends the weights unencrypted; with rollout_tls_ca_file use "
                         "data_port (it speaks TLS)")  # fmt: skip
    host, _, port = settings.broadcast_address.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535 or host.strip("[]") in ("0.0.0.0", "::"):
        raise ValueError(
            f"broadcast_address {settings.broadcast_address!r} must be host:port, a host the replicas reach"
        )


def check_step_check(step_check: dict[str, Any]) -> None:
    """step_check must be the reward service's StepsCheck, with a source it knows."""
    from google.protobuf import json_format

    from grpo.v1 import reward_pb2

    try:
        json_format.ParseDict(step_check, reward_pb2.StepsCheck())
    except json_format.ParseError as exc:
        raise ValueError(f"step_check: {exc} (the reward service's StepsCheck: source, rule, ...)") from None
    if step_check.get("source") not in ("rule", "prm", "cut"):
        raise ValueError(f"step_check.source must be rule, prm or cut, got {step_check.get('source')!r}")


def check_algorithm(settings: TrainerSettings) -> None:
    """A GRPO run's algorithm, the preset's values under the explicit ones: KL, group size, tools, probe, refill."""
    from grpo.algo import get_preset
    from grpo.algo.presets import check_kl_loss

    algo = get_preset(settings.preset).with_overrides(**settings.algo_overrides())
    check_kl_loss(algo.kl_kind, algo.beta)
    if algo.group_size < 2:  # every preset's baseline is the group's: one sample is its own baseline
        raise ValueError(
            f"group_size={algo.group_size}: a group needs at least 2 samples (its advantages are measured "
            "against the group's other rewards; one sample's advantage is always 0). R1 uses 16"
        )
    if settings.tools:
        check_tools(settings, algo.credit)
    if settings.python_session and "python" not in settings.tools:
        raise ValueError(f"python_session shares state between an episode's python calls; tools {settings.tools} "
                         "has no python: add python to tools, or drop python_session")  # fmt: skip
    check_probe(settings, algo)
    if algo.refill_zero_variance and not algo.skip_zero_variance:
        raise ValueError(
            f"refill_zero_variance (preset {settings.preset}) needs skip_zero_variance: a refill replaces a group "
            "the skip drops, and kept groups are never replaced; set skip_zero_variance true, or "
            "refill_zero_variance false"
        )


def check_probe(settings: TrainerSettings, algo: LossConfig) -> None:
    """Adaptive group size: a probe smaller than the group, whose flat groups the zero-variance filter drops."""
    if not settings.probe_size:
        if settings.probe_all:
            raise ValueError("probe_all sends every task's probe, but probe_size is 0 (no probe): set probe_size "
                             "(e.g. 4 of 8), or leave probe_all false")  # fmt: skip
        return
    if not 2 <= settings.probe_size < algo.group_size:
        raise ValueError(f"probe_size={settings.probe_size} with group_size={algo.group_size}: a probe samples part "
                         "of a group to see whether its answers disagree; it needs 2 <= probe_size < group_size "
                         "(e.g. 4 of 8), or 0 for whole groups")  # fmt: skip
    if not algo.skip_zero_variance:
        raise ValueError(f"probe_size (preset {settings.preset}) needs skip_zero_variance: a probe whose answers "
                         "agree comes back as a group of probe_size samples, which only the zero-variance filter "
                         "may drop; set skip_zero_variance true, or probe_size 0")  # fmt: skip
    if algo.credit != "outcome":
        raise ValueError(f"probe_size with credit {algo.credit!r}: step credit trains groups whose rewards agree "
                         "(their step scores differ), but a probe judges the rewards only; use credit outcome, "
                         "or probe_size 0")  # fmt: skip


def check_tools(settings: TrainerSettings, credit: str) -> None:
    """What an episode run cannot do, said at start-up."""
    if credit in ("process", "vineppo"):
        raise ValueError(
            f"process credit over multi-turn episodes is not supported: credit {credit!r} (preset {settings.preset}) "
            "places step scores on completion tokens, and an episode's tokens include tool output the model did "
            "not write; use credit outcome (presets grpo, dapo, dr_grpo, gspo, ...) with tools, or drop `tools`"
        )
    if any(not name.strip() for name in settings.tools) or len(set(settings.tools)) != len(settings.tools):
        raise ValueError(f"tools {settings.tools}: each must be a non-empty tool name, listed once")
    if settings.tool_format == "chat" and not settings.apply_chat_template:
        raise ValueError(
            "tool_format chat renders tool calls and results with the chat template: set apply_chat_template "
            "true, or use tool_format tagged"
        )


def check_data_settings(settings: TrainerSettings) -> None:
    """train_data's list form, model and data references, task_weights and default_checks."""
    if settings.model in MODEL_REFERENCES:
        raise ValueError(f"model: {settings.model} names a stage's model; it is only known inside `stages` (a "
                         "stage's `model`), not for the whole run")  # fmt: skip
    sources = check_train_data(settings.train_data)
    if any(source.weight is not None for source in sources) and settings.task_weights:
        raise ValueError("task_weights and a weighted train_data list both set the sampling shares: set one "
                         "(weights on the train_data items, or task_weights by task_type)")  # fmt: skip
    for task_type, weight in settings.task_weights.items():
        if not task_type or not weight > 0 or weight == float("inf"):
            raise ValueError(f"task_weights {{{task_type!r}: {weight}}}: each must name a task_type and weigh a "
                             "finite number > 0")  # fmt: skip
    if settings.default_checks is not None:
        check_default_checks(settings.default_checks)


def check_default_checks(checks: dict[str, Any]) -> None:
    """default_checks must be checks the reward service can score (its Checks shape, each with its required
    fields), as a row's own checks must."""
    from google.protobuf import json_format

    from grpo.trainer.data import DataError, check_required
    from grpo.v1 import reward_pb2

    if not checks:
        raise ValueError("default_checks is empty: give the checks that score rows without their own, e.g. "
                         "{reward_model: {}}, or leave it unset")  # fmt: skip
    try:
        json_format.ParseDict(checks, reward_pb2.Checks())
        check_required(checks, "default_checks")
    except json_format.ParseError as exc:
        raise ValueError(f"default_checks: {exc} (the reward service's Checks: math, code, format, reward_model, "
                         "...)") from None  # fmt: skip
    except DataError as exc:
        raise ValueError(str(exc)) from None


def check_rejection_sampling(settings: TrainerSettings) -> None:
    """The rs_* settings: known filters (the overlong one with its limit) and the components an answer must pass."""
    from grpo.trainer.rejection import BUILTIN_FILTERS  # the filters themselves live there

    for name in settings.rs_filters:
        if name not in BUILTIN_FILTERS and not PLUGIN_NAME.fullmatch(name):
            raise ValueError(f"rs_filters: {name!r} is neither a built-in filter {list(BUILTIN_FILTERS)} nor a plug-in "
                             "`package.module:function`")  # fmt: skip
    if "overlong" in settings.rs_filters and settings.rs_max_tokens == 0:
        raise ValueError("rs_filters names overlong, which rejects answers longer than rs_max_tokens: set "
                         "rs_max_tokens (> 0)")  # fmt: skip
    if settings.rs_require is not None and (not settings.rs_require or not all(c.strip() for c in settings.rs_require)):
        raise ValueError(f"rs_require {settings.rs_require}: name the components an answer must pass, e.g. [math, "
                         "format], or leave it unset (every pass/fail component of the row's checks)")  # fmt: skip


def check_buckets(settings: TrainerSettings) -> None:
    """Difficulty buckets: GRPO only, weights in [0, 1], and each weighed bucket one a rule can fill."""
    if settings.mode != "grpo" and (
        settings.skip_solved_after or settings.set_aside_after or settings.skip_flat_above or settings.bucket_weights
    ):
        raise ValueError(f"skip_solved_after / set_aside_after / skip_flat_above / bucket_weights (difficulty "
                         f"buckets) choose GRPO "
                         f"prompts by their groups' pass rate; mode {settings.mode} samples no groups to judge: "
                         "leave them unset")  # fmt: skip
    for bucket, weight in settings.bucket_weights.items():
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"bucket_weights {{{bucket}: {weight}}}: a weight is the share of the bucket's draws "
                             "taken, in [0, 1]")  # fmt: skip
    for bucket, rule in (("easy", "skip_solved_after"), ("hard", "set_aside_after")):
        if bucket in settings.bucket_weights and not getattr(settings, rule):
            raise ValueError(f"bucket_weights names {bucket}, but {rule} is 0, so no row is ever {bucket}: set "
                             f"{rule} (> 0) or leave {bucket} out")  # fmt: skip
    if settings.bucket_weights.get("unseen", 1.0) == 0:
        raise ValueError("bucket_weights gives unseen rows weight 0: every row starts unseen, so none would ever "
                         "be drawn and judged; give unseen a weight > 0")  # fmt: skip


def check_colocate(settings: TrainerSettings) -> None:
    """Colocated mode's limits, and its replica's settings, at start-up."""
    if settings.colocate is None:
        return
    modes = [str(stage.get("mode", settings.mode)) for stage in settings.stages] or [settings.mode]
    backends = [str(stage.get("backend", settings.backend)) for stage in settings.stages] or [settings.backend]
    if "deepspeed" in backends:
        raise ValueError("colocate: the replica generates from the learner's own module, which DeepSpeed "
                         "partitions or wraps; use backend torch, or separate replicas")  # fmt: skip
    if "rejection_sampling" in modes:
        raise ValueError("colocate: a rejection_sampling run holds no trainable policy to share; run it with "
                         "separate replicas")  # fmt: skip
    from grpo.trainer.colocated_settings import replica_settings

    replica_settings(settings, settings.model)  # ValueError naming the bad rollout setting
