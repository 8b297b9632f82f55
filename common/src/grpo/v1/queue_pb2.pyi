from grpo.v1 import reward_pb2 as _reward_pb2
from grpo.v1 import rollout_pb2 as _rollout_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PromptTask(_message.Message):
    __slots__ = ("task_id", "policy_version", "prompt", "checks", "weights", "sampling", "task_type", "attempt", "eval", "kind")
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
    def __init__(self, task_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., prompt: _Optional[_Union[_rollout_pb2.Prompt, _Mapping]] = ..., checks: _Optional[_Union[_reward_pb2.Checks, _Mapping]] = ..., weights: _Optional[_Mapping[str, float]] = ..., sampling: _Optional[_Union[_rollout_pb2.SamplingParams, _Mapping]] = ..., task_type: _Optional[str] = ..., attempt: _Optional[int] = ..., eval: _Optional[bool] = ..., kind: _Optional[str] = ...) -> None: ...

class SampleRecord(_message.Message):
    __slots__ = ("completion", "reward", "components", "steps", "step_token_ends")
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
    completion: _rollout_pb2.Completion
    reward: float
    components: _containers.MessageMap[str, _reward_pb2.ComponentResult]
    steps: _containers.RepeatedCompositeFieldContainer[_reward_pb2.StepScore]
    step_token_ends: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, completion: _Optional[_Union[_rollout_pb2.Completion, _Mapping]] = ..., reward: _Optional[float] = ..., components: _Optional[_Mapping[str, _reward_pb2.ComponentResult]] = ..., steps: _Optional[_Iterable[_Union[_reward_pb2.StepScore, _Mapping]]] = ..., step_token_ends: _Optional[_Iterable[int]] = ...) -> None: ...

class GroupRecord(_message.Message):
    __slots__ = ("group_id", "task_id", "policy_version", "weight_version", "weight_checksum", "prompt_token_ids", "samples", "status", "error", "replica_id", "generate_s", "score_s", "eval", "kind")
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
    def __init__(self, group_id: _Optional[str] = ..., task_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., weight_version: _Optional[int] = ..., weight_checksum: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., samples: _Optional[_Iterable[_Union[SampleRecord, _Mapping]]] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., replica_id: _Optional[str] = ..., generate_s: _Optional[float] = ..., score_s: _Optional[float] = ..., eval: _Optional[bool] = ..., kind: _Optional[str] = ...) -> None: ...
