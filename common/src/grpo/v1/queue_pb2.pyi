from grpo.v1 import reward_pb2 as _reward_pb2
from grpo.v1 import rollout_pb2 as _rollout_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PromptTask(_message.Message):
    __slots__ = ("task_id", "policy_version", "prompt", "checks", "weights", "sampling", "task_type", "attempt", "eval", "kind", "episode", "probe")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    policy_version: int
    prompt: _rollout_pb2.Prompt
    checks: _reward_pb2.Checks
    weights: _containers.ScalarMap[str, float]
    sampling: _rollout_pb2.SamplingParams
    task_type: str
    attempt: int
    eval: bool
    kind: str
    episode: EpisodeSpec
    probe: ProbeSpec
    def __init__(self, task_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., prompt: _Optional[_Union[_rollout_pb2.Prompt, _Mapping]] = ..., checks: _Optional[_Union[_reward_pb2.Checks, _Mapping]] = ..., weights: _Optional[_Mapping[str, float]] = ..., sampling: _Optional[_Union[_rollout_pb2.SamplingParams, _Mapping]] = ..., task_type: _Optional[str] = ..., attempt: _Optional[int] = ..., eval: _Optional[bool] = ..., kind: _Optional[str] = ..., episode: _Optional[_Union[EpisodeSpec, _Mapping]] = ..., probe: _Optional[_Union[ProbeSpec, _Mapping]] = ...) -> None: ...

class ProbeSpec(_message.Message):
    __slots__ = ("size", "on")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ON_FIELD_NUMBER: _ClassVar[int]
    size: int
    on: str
    def __init__(self, size: _Optional[int] = ..., on: _Optional[str] = ...) -> None: ...

class EpisodeSpec(_message.Message):
    __slots__ = ("tools", "tool_format", "max_turns", "max_tool_calls", "max_total_tokens", "max_tool_output_chars", "tool_timeout_s", "tool_memory_mb", "python_session")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_OUTPUT_CHARS_FIELD_NUMBER: _ClassVar[int]
    TOOL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    TOOL_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    PYTHON_SESSION_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedScalarFieldContainer[str]
    tool_format: str
    max_turns: int
    max_tool_calls: int
    max_total_tokens: int
    max_tool_output_chars: int
    tool_timeout_s: float
    tool_memory_mb: int
    python_session: bool
    def __init__(self, tools: _Optional[_Iterable[str]] = ..., tool_format: _Optional[str] = ..., max_turns: _Optional[int] = ..., max_tool_calls: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., max_tool_output_chars: _Optional[int] = ..., tool_timeout_s: _Optional[float] = ..., tool_memory_mb: _Optional[int] = ..., python_session: _Optional[bool] = ...) -> None: ...

class EpisodeStats(_message.Message):
    __slots__ = ("turns", "tool_calls", "tool_errors", "tool_timeouts", "malformed_calls", "end", "tool_s")
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    TOOL_TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    MALFORMED_CALLS_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TOOL_S_FIELD_NUMBER: _ClassVar[int]
    turns: int
    tool_calls: int
    tool_errors: int
    tool_timeouts: int
    malformed_calls: int
    end: str
    tool_s: float
    def __init__(self, turns: _Optional[int] = ..., tool_calls: _Optional[int] = ..., tool_errors: _Optional[int] = ..., tool_timeouts: _Optional[int] = ..., malformed_calls: _Optional[int] = ..., end: _Optional[str] = ..., tool_s: _Optional[float] = ...) -> None: ...

class SampleRecord(_message.Message):
    __slots__ = ("completion", "reward", "components", "steps", "step_token_ends", "token_mask", "episode", "score_error")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _reward_pb2.ComponentResult
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_reward_pb2.ComponentResult, _Mapping]] = ...) -> None: ...
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_TOKEN_ENDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_MASK_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    SCORE_ERROR_FIELD_NUMBER: _ClassVar[int]
    completion: _rollout_pb2.Completion
    reward: float
    components: _containers.MessageMap[str, _reward_pb2.ComponentResult]
    steps: _containers.RepeatedCompositeFieldContainer[_reward_pb2.StepScore]
    step_token_ends: _containers.RepeatedScalarFieldContainer[int]
    token_mask: _containers.RepeatedScalarFieldContainer[int]
    episode: EpisodeStats
    score_error: str
    def __init__(self, completion: _Optional[_Union[_rollout_pb2.Completion, _Mapping]] = ..., reward: _Optional[float] = ..., components: _Optional[_Mapping[str, _reward_pb2.ComponentResult]] = ..., steps: _Optional[_Iterable[_Union[_reward_pb2.StepScore, _Mapping]]] = ..., step_token_ends: _Optional[_Iterable[int]] = ..., token_mask: _Optional[_Iterable[int]] = ..., episode: _Optional[_Union[EpisodeStats, _Mapping]] = ..., score_error: _Optional[str] = ...) -> None: ...

class GroupRecord(_message.Message):
    __slots__ = ("group_id", "task_id", "policy_version", "weight_version", "weight_checksum", "prompt_token_ids", "samples", "status", "error", "replica_id", "generate_s", "score_s", "eval", "kind", "discarded_samples", "discarded_tokens")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATE_S_FIELD_NUMBER: _ClassVar[int]
    SCORE_S_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    task_id: str
    policy_version: int
    weight_version: int
    weight_checksum: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    samples: _containers.RepeatedCompositeFieldContainer[SampleRecord]
    status: str
    error: str
    replica_id: str
    generate_s: float
    score_s: float
    eval: bool
    kind: str
    discarded_samples: int
    discarded_tokens: int
    def __init__(self, group_id: _Optional[str] = ..., task_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., weight_version: _Optional[int] = ..., weight_checksum: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., samples: _Optional[_Iterable[_Union[SampleRecord, _Mapping]]] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., replica_id: _Optional[str] = ..., generate_s: _Optional[float] = ..., score_s: _Optional[float] = ..., eval: _Optional[bool] = ..., kind: _Optional[str] = ..., discarded_samples: _Optional[int] = ..., discarded_tokens: _Optional[int] = ...) -> None: ...
