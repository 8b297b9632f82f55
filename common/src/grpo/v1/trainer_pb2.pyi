from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetRunStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_id", "phase", "step", "total_steps", "policy_version", "tasks_published", "groups_trained", "dropped", "in_flight", "replicas", "metrics", "duplicates", "superseded", "error", "eval_history", "stage", "stages", "last_eval", "doctor")
    class DroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASKS_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_TRAINED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVAL_HISTORY_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    LAST_EVAL_FIELD_NUMBER: _ClassVar[int]
    DOCTOR_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    phase: str
    step: int
    total_steps: int
    policy_version: int
    tasks_published: int
    groups_trained: int
    dropped: _containers.ScalarMap[str, int]
    in_flight: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    metrics: _containers.ScalarMap[str, float]
    duplicates: int
    superseded: int
    error: str
    eval_history: _containers.RepeatedCompositeFieldContainer[EvalPoint]
    stage: str
    stages: _containers.RepeatedCompositeFieldContainer[StageOutcome]
    last_eval: EvalResult
    doctor: _containers.RepeatedCompositeFieldContainer[DoctorFinding]
    def __init__(self, run_id: _Optional[str] = ..., phase: _Optional[str] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., policy_version: _Optional[int] = ..., tasks_published: _Optional[int] = ..., groups_trained: _Optional[int] = ..., dropped: _Optional[_Mapping[str, int]] = ..., in_flight: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., duplicates: _Optional[int] = ..., superseded: _Optional[int] = ..., error: _Optional[str] = ..., eval_history: _Optional[_Iterable[_Union[EvalPoint, _Mapping]]] = ..., stage: _Optional[str] = ..., stages: _Optional[_Iterable[_Union[StageOutcome, _Mapping]]] = ..., last_eval: _Optional[_Union[EvalResult, _Mapping]] = ..., doctor: _Optional[_Iterable[_Union[DoctorFinding, _Mapping]]] = ...) -> None: ...

class DoctorFinding(_message.Message):
    __slots__ = ("rule", "symptom", "evidence", "remedy")
    RULE_FIELD_NUMBER: _ClassVar[int]
    SYMPTOM_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    REMEDY_FIELD_NUMBER: _ClassVar[int]
    rule: str
    symptom: str
    evidence: str
    remedy: str
    def __init__(self, rule: _Optional[str] = ..., symptom: _Optional[str] = ..., evidence: _Optional[str] = ..., remedy: _Optional[str] = ...) -> None: ...

class EvalResult(_message.Message):
    __slots__ = ("step", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    step: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class EvalPoint(_message.Message):
    __slots__ = ("step", "accuracy")
    STEP_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    step: int
    accuracy: float
    def __init__(self, step: _Optional[int] = ..., accuracy: _Optional[float] = ...) -> None: ...

class StageOutcome(_message.Message):
    __slots__ = ("index", "mode", "steps", "seconds", "folder", "outcome")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    FOLDER_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    index: int
    mode: str
    steps: int
    seconds: float
    folder: str
    outcome: str
    def __init__(self, index: _Optional[int] = ..., mode: _Optional[str] = ..., steps: _Optional[int] = ..., seconds: _Optional[float] = ..., folder: _Optional[str] = ..., outcome: _Optional[str] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("replica_id", "address", "weight_version", "last_seen_s")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_S_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    weight_version: int
    last_seen_s: float
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., weight_version: _Optional[int] = ..., last_seen_s: _Optional[float] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("path", "step")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    path: str
    step: int
    def __init__(self, path: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...
