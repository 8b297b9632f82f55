from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VerifyMathRequest(_message.Message):
    __slots__ = ("answer", "gold", "timeout_s", "extraction", "precision", "strict", "allow_set_relation_comp", "allow_unevaluated")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    GOLD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    EXTRACTION_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SET_RELATION_COMP_FIELD_NUMBER: _ClassVar[int]
    ALLOW_UNEVALUATED_FIELD_NUMBER: _ClassVar[int]
    answer: str
    gold: str
    timeout_s: float
    extraction: _containers.RepeatedScalarFieldContainer[str]
    precision: int
    strict: bool
    allow_set_relation_comp: bool
    allow_unevaluated: bool
    def __init__(self, answer: _Optional[str] = ..., gold: _Optional[str] = ..., timeout_s: _Optional[float] = ..., extraction: _Optional[_Iterable[str]] = ..., precision: _Optional[int] = ..., strict: _Optional[bool] = ..., allow_set_relation_comp: _Optional[bool] = ..., allow_unevaluated: _Optional[bool] = ...) -> None: ...

class VerifyMathResponse(_message.Message):
    __slots__ = ("correct", "status", "extracted_answer", "detail", "wall_s")
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXTRACTED_ANSWER_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    correct: bool
    status: str
    extracted_answer: str
    detail: str
    wall_s: float
    def __init__(self, correct: _Optional[bool] = ..., status: _Optional[str] = ..., extracted_answer: _Optional[str] = ..., detail: _Optional[str] = ..., wall_s: _Optional[float] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("language", "code", "stdin", "timeout_s", "memory_mb", "files", "read_back", "return_output_bytes")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    READ_BACK_FIELD_NUMBER: _ClassVar[int]
    RETURN_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    language: str
    code: str
    stdin: str
    timeout_s: float
    memory_mb: int
    files: _containers.ScalarMap[str, str]
    read_back: _containers.RepeatedScalarFieldContainer[str]
    return_output_bytes: int
    def __init__(self, language: _Optional[str] = ..., code: _Optional[str] = ..., stdin: _Optional[str] = ..., timeout_s: _Optional[float] = ..., memory_mb: _Optional[int] = ..., files: _Optional[_Mapping[str, str]] = ..., read_back: _Optional[_Iterable[str]] = ..., return_output_bytes: _Optional[int] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("status", "exit_code", "stdout", "stderr", "wall_s", "cpu_s", "peak_memory_mb", "files", "file_encodings", "stdout_encoding", "stdout_bytes", "stdout_truncated", "stderr_bytes", "stderr_truncated")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class FileEncodingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    FILE_ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    STDOUT_ENCODING_FIELD_NUMBER: _ClassVar[int]
    STDOUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDERR_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    status: str
    exit_code: int
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float
    peak_memory_mb: float
    files: _containers.ScalarMap[str, str]
    file_encodings: _containers.ScalarMap[str, str]
    stdout_encoding: str
    stdout_bytes: int
    stdout_truncated: bool
    stderr_bytes: int
    stderr_truncated: bool
    def __init__(self, status: _Optional[str] = ..., exit_code: _Optional[int] = ..., stdout: _Optional[str] = ..., stderr: _Optional[str] = ..., wall_s: _Optional[float] = ..., cpu_s: _Optional[float] = ..., peak_memory_mb: _Optional[float] = ..., files: _Optional[_Mapping[str, str]] = ..., file_encodings: _Optional[_Mapping[str, str]] = ..., stdout_encoding: _Optional[str] = ..., stdout_bytes: _Optional[int] = ..., stdout_truncated: _Optional[bool] = ..., stderr_bytes: _Optional[int] = ..., stderr_truncated: _Optional[bool] = ...) -> None: ...

class CodeTest(_message.Message):
    __slots__ = ("stdio",)
    STDIO_FIELD_NUMBER: _ClassVar[int]
    ASSERT_FIELD_NUMBER: _ClassVar[int]
    stdio: StdioTest
    def __init__(self, stdio: _Optional[_Union[StdioTest, _Mapping]] = ..., **kwargs) -> None: ...

class StdioTest(_message.Message):
    __slots__ = ("stdin", "expected_stdout", "timeout_s", "memory_mb")
    STDIN_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_STDOUT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    stdin: str
    expected_stdout: str
    timeout_s: float
    memory_mb: int
    def __init__(self, stdin: _Optional[str] = ..., expected_stdout: _Optional[str] = ..., timeout_s: _Optional[float] = ..., memory_mb: _Optional[int] = ...) -> None: ...

class VerifyCodeRequest(_message.Message):
    __slots__ = ("language", "code", "tests", "timeout_s", "memory_mb", "compare", "abs_tol", "rel_tol", "stop_on_first_failure", "checker", "return_output_bytes")
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    COMPARE_FIELD_NUMBER: _ClassVar[int]
    ABS_TOL_FIELD_NUMBER: _ClassVar[int]
    REL_TOL_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_FIRST_FAILURE_FIELD_NUMBER: _ClassVar[int]
    CHECKER_FIELD_NUMBER: _ClassVar[int]
    RETURN_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    language: str
    code: str
    tests: _containers.RepeatedCompositeFieldContainer[CodeTest]
    timeout_s: float
    memory_mb: int
    compare: str
    abs_tol: float
    rel_tol: float
    stop_on_first_failure: bool
    checker: CheckerProgram
    return_output_bytes: int
    def __init__(self, language: _Optional[str] = ..., code: _Optional[str] = ..., tests: _Optional[_Iterable[_Union[CodeTest, _Mapping]]] = ..., timeout_s: _Optional[float] = ..., memory_mb: _Optional[int] = ..., compare: _Optional[str] = ..., abs_tol: _Optional[float] = ..., rel_tol: _Optional[float] = ..., stop_on_first_failure: _Optional[bool] = ..., checker: _Optional[_Union[CheckerProgram, _Mapping]] = ..., return_output_bytes: _Optional[int] = ...) -> None: ...

class CheckerProgram(_message.Message):
    __slots__ = ("language", "code")
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    language: str
    code: str
    def __init__(self, language: _Optional[str] = ..., code: _Optional[str] = ...) -> None: ...

class CodeTestResult(_message.Message):
    __slots__ = ("verdict", "exit_code", "stdout", "stderr", "wall_s", "detail", "cpu_s", "peak_memory_mb", "stdout_encoding", "stdout_bytes", "stdout_truncated", "stderr_bytes", "stderr_truncated")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    STDOUT_ENCODING_FIELD_NUMBER: _ClassVar[int]
    STDOUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDERR_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    verdict: str
    exit_code: int
    stdout: str
    stderr: str
    wall_s: float
    detail: str
    cpu_s: float
    peak_memory_mb: float
    stdout_encoding: str
    stdout_bytes: int
    stdout_truncated: bool
    stderr_bytes: int
    stderr_truncated: bool
    def __init__(self, verdict: _Optional[str] = ..., exit_code: _Optional[int] = ..., stdout: _Optional[str] = ..., stderr: _Optional[str] = ..., wall_s: _Optional[float] = ..., detail: _Optional[str] = ..., cpu_s: _Optional[float] = ..., peak_memory_mb: _Optional[float] = ..., stdout_encoding: _Optional[str] = ..., stdout_bytes: _Optional[int] = ..., stdout_truncated: _Optional[bool] = ..., stderr_bytes: _Optional[int] = ..., stderr_truncated: _Optional[bool] = ...) -> None: ...

class VerifyCodeResponse(_message.Message):
    __slots__ = ("passed", "total", "tests")
    PASSED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    passed: int
    total: int
    tests: _containers.RepeatedCompositeFieldContainer[CodeTestResult]
    def __init__(self, passed: _Optional[int] = ..., total: _Optional[int] = ..., tests: _Optional[_Iterable[_Union[CodeTestResult, _Mapping]]] = ...) -> None: ...

class MathCheck(_message.Message):
    __slots__ = ("gold", "extraction", "precision", "strict", "allow_set_relation_comp", "allow_unevaluated")
    GOLD_FIELD_NUMBER: _ClassVar[int]
    EXTRACTION_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SET_RELATION_COMP_FIELD_NUMBER: _ClassVar[int]
    ALLOW_UNEVALUATED_FIELD_NUMBER: _ClassVar[int]
    gold: str
    extraction: _containers.RepeatedScalarFieldContainer[str]
    precision: int
    strict: bool
    allow_set_relation_comp: bool
    allow_unevaluated: bool
    def __init__(self, gold: _Optional[str] = ..., extraction: _Optional[_Iterable[str]] = ..., precision: _Optional[int] = ..., strict: _Optional[bool] = ..., allow_set_relation_comp: _Optional[bool] = ..., allow_unevaluated: _Optional[bool] = ...) -> None: ...

class CodeCheck(_message.Message):
    __slots__ = ("tests", "language", "timeout_s", "compare", "abs_tol", "rel_tol", "stop_on_first_failure", "partial_credit", "checker")
    TESTS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    COMPARE_FIELD_NUMBER: _ClassVar[int]
    ABS_TOL_FIELD_NUMBER: _ClassVar[int]
    REL_TOL_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_FIRST_FAILURE_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_CREDIT_FIELD_NUMBER: _ClassVar[int]
    CHECKER_FIELD_NUMBER: _ClassVar[int]
    tests: _containers.RepeatedCompositeFieldContainer[CodeTest]
    language: str
    timeout_s: float
    compare: str
    abs_tol: float
    rel_tol: float
    stop_on_first_failure: bool
    partial_credit: bool
    checker: CheckerProgram
    def __init__(self, tests: _Optional[_Iterable[_Union[CodeTest, _Mapping]]] = ..., language: _Optional[str] = ..., timeout_s: _Optional[float] = ..., compare: _Optional[str] = ..., abs_tol: _Optional[float] = ..., rel_tol: _Optional[float] = ..., stop_on_first_failure: _Optional[bool] = ..., partial_credit: _Optional[bool] = ..., checker: _Optional[_Union[CheckerProgram, _Mapping]] = ...) -> None: ...

class FormatCheck(_message.Message):
    __slots__ = ("think_tag", "answer_tag", "think_prefilled")
    THINK_TAG_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TAG_FIELD_NUMBER: _ClassVar[int]
    THINK_PREFILLED_FIELD_NUMBER: _ClassVar[int]
    think_tag: str
    answer_tag: str
    think_prefilled: bool
    def __init__(self, think_tag: _Optional[str] = ..., answer_tag: _Optional[str] = ..., think_prefilled: _Optional[bool] = ...) -> None: ...

class LanguageCheck(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: str
    def __init__(self, target: _Optional[str] = ...) -> None: ...

class OverlongCheck(_message.Message):
    __slots__ = ("max_tokens", "buffer_tokens", "completion_tokens")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    buffer_tokens: int
    completion_tokens: int
    def __init__(self, max_tokens: _Optional[int] = ..., buffer_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class RewardModelCheck(_message.Message):
    __slots__ = ("normalize", "shift", "scale")
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    normalize: str
    shift: float
    scale: float
    def __init__(self, normalize: _Optional[str] = ..., shift: _Optional[float] = ..., scale: _Optional[float] = ...) -> None: ...

class PluginCheck(_message.Message):
    __slots__ = ("kwargs_json",)
    KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    kwargs_json: str
    def __init__(self, kwargs_json: _Optional[str] = ...) -> None: ...

class StepsCheck(_message.Message):
    __slots__ = ("source", "rule", "delimiter", "spans")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    DELIMITER_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    source: str
    rule: str
    delimiter: str
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    def __init__(self, source: _Optional[str] = ..., rule: _Optional[str] = ..., delimiter: _Optional[str] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class StepScore(_message.Message):
    __slots__ = ("start", "end", "score", "status", "detail")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    score: float
    status: str
    detail: str
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., score: _Optional[float] = ..., status: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class Checks(_message.Message):
    __slots__ = ("math", "code", "format", "language", "overlong", "reward_model", "plugins", "steps")
    class PluginsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PluginCheck
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PluginCheck, _Mapping]] = ...) -> None: ...
    MATH_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    OVERLONG_FIELD_NUMBER: _ClassVar[int]
    REWARD_MODEL_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    math: MathCheck
    code: CodeCheck
    format: FormatCheck
    language: LanguageCheck
    overlong: OverlongCheck
    reward_model: RewardModelCheck
    plugins: _containers.MessageMap[str, PluginCheck]
    steps: StepsCheck
    def __init__(self, math: _Optional[_Union[MathCheck, _Mapping]] = ..., code: _Optional[_Union[CodeCheck, _Mapping]] = ..., format: _Optional[_Union[FormatCheck, _Mapping]] = ..., language: _Optional[_Union[LanguageCheck, _Mapping]] = ..., overlong: _Optional[_Union[OverlongCheck, _Mapping]] = ..., reward_model: _Optional[_Union[RewardModelCheck, _Mapping]] = ..., plugins: _Optional[_Mapping[str, PluginCheck]] = ..., steps: _Optional[_Union[StepsCheck, _Mapping]] = ...) -> None: ...

class ScoreItem(_message.Message):
    __slots__ = ("id", "prompt", "completion", "checks", "weights")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    prompt: str
    completion: str
    checks: Checks
    weights: _containers.ScalarMap[str, float]
    def __init__(self, id: _Optional[str] = ..., prompt: _Optional[str] = ..., completion: _Optional[str] = ..., checks: _Optional[_Union[Checks, _Mapping]] = ..., weights: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items", "timeout_s")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    timeout_s: float
    def __init__(self, items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class ComponentResult(_message.Message):
    __slots__ = ("score", "status", "detail")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    score: float
    status: str
    detail: str
    def __init__(self, score: _Optional[float] = ..., status: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class ScoreResult(_message.Message):
    __slots__ = ("id", "reward", "status", "error", "components", "steps")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ComponentResult
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ComponentResult, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    id: str
    reward: float
    status: str
    error: str
    components: _containers.MessageMap[str, ComponentResult]
    steps: _containers.RepeatedCompositeFieldContainer[StepScore]
    def __init__(self, id: _Optional[str] = ..., reward: _Optional[float] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., components: _Optional[_Mapping[str, ComponentResult]] = ..., steps: _Optional[_Iterable[_Union[StepScore, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScoreResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ScoreResult, _Mapping]]] = ...) -> None: ...
