from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("text", "messages", "apply_chat_template", "prefix_token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    APPLY_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    messages: Messages
    apply_chat_template: bool
    prefix_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[str] = ..., messages: _Optional[_Union[Messages, _Mapping]] = ..., apply_chat_template: _Optional[bool] = ..., prefix_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Messages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("n", "temperature", "top_p", "top_k", "max_new_tokens", "stop", "seed")
    N_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    def __init__(self, n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "sampling")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    sampling: SamplingParams
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("text", "token_ids", "logprobs", "finish_reason")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class PromptResult(_message.Message):
    __slots__ = ("prompt_token_ids", "completions")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("results", "weight_version", "weight_checksum", "wall_s")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PromptResult]
    weight_version: int
    weight_checksum: str
    wall_s: float
    def __init__(self, results: _Optional[_Iterable[_Union[PromptResult, _Mapping]]] = ..., weight_version: _Optional[int] = ..., weight_checksum: _Optional[str] = ..., wall_s: _Optional[float] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class WeightHeader(_message.Message):
    __slots__ = ("version", "tensors", "sha256", "total_bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    sha256: str
    total_bytes: int
    def __init__(self, version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., sha256: _Optional[str] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: WeightHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[WeightHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("version", "checksum", "receive_s", "apply_s", "relayed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_S_FIELD_NUMBER: _ClassVar[int]
    APPLY_S_FIELD_NUMBER: _ClassVar[int]
    RELAYED_FIELD_NUMBER: _ClassVar[int]
    version: int
    checksum: str
    receive_s: float
    apply_s: float
    relayed: _containers.RepeatedCompositeFieldContainer[RelayResult]
    def __init__(self, version: _Optional[int] = ..., checksum: _Optional[str] = ..., receive_s: _Optional[float] = ..., apply_s: _Optional[float] = ..., relayed: _Optional[_Iterable[_Union[RelayResult, _Mapping]]] = ...) -> None: ...

class RelayHop(_message.Message):
    __slots__ = ("replica_id", "address", "data_port", "children")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    data_port: int
    children: _containers.RepeatedCompositeFieldContainer[RelayHop]
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., data_port: _Optional[int] = ..., children: _Optional[_Iterable[_Union[RelayHop, _Mapping]]] = ...) -> None: ...

class RelayPlan(_message.Message):
    __slots__ = ("hops",)
    HOPS_FIELD_NUMBER: _ClassVar[int]
    hops: _containers.RepeatedCompositeFieldContainer[RelayHop]
    def __init__(self, hops: _Optional[_Iterable[_Union[RelayHop, _Mapping]]] = ...) -> None: ...

class RelayResult(_message.Message):
    __slots__ = ("replica_id", "address", "ok", "version", "checksum", "error", "seconds", "sender", "rerouted_around")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    REROUTED_AROUND_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    ok: bool
    version: int
    checksum: str
    error: str
    seconds: float
    sender: str
    rerouted_around: str
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., ok: _Optional[bool] = ..., version: _Optional[int] = ..., checksum: _Optional[str] = ..., error: _Optional[str] = ..., seconds: _Optional[float] = ..., sender: _Optional[str] = ..., rerouted_around: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("replica_id", "model", "engine", "weight_version", "weight_checksum", "tasks_done", "tasks_failed", "tokens_generated", "tokens_per_s", "busy", "weights_data_port")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TASKS_DONE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FAILED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    model: str
    engine: str
    weight_version: int
    weight_checksum: str
    tasks_done: int
    tasks_failed: int
    tokens_generated: int
    tokens_per_s: float
    busy: int
    weights_data_port: int
    def __init__(self, replica_id: _Optional[str] = ..., model: _Optional[str] = ..., engine: _Optional[str] = ..., weight_version: _Optional[int] = ..., weight_checksum: _Optional[str] = ..., tasks_done: _Optional[int] = ..., tasks_failed: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., busy: _Optional[int] = ..., weights_data_port: _Optional[int] = ...) -> None: ...
