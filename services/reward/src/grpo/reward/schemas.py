"""The reward API's request and response models: the HTTP contract, also what the gRPC edge converts to.

Static bounds (positive timeouts, known languages, tag names) live here; limits that
depend on the server's settings (items per batch, code length) are checked by the core.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from grpo.reward.output import DEFAULT_RETURN_BYTES, MAX_RETURN_BYTES
from grpo.reward.sandbox.base import require_text


def _not_nan(value: Any) -> Any:
    """Refuse NaN by its name: it fails every bound, so pydantic named a bound ("less than or equal to 3600")."""
    number = value
    if isinstance(value, str):  # JSON from gRPC spells a double's NaN "NaN"; pydantic reads the string as one
        try:
            number = float(value)
        except ValueError:
            return value
    if isinstance(number, float) and math.isnan(number):
        raise ValueError("NaN is not a number")
    return value


NotNan = BeforeValidator(_not_nan)
Language = Literal["python", "c", "cpp", "java", "javascript", "typescript", "go", "rust", "bash"]
Timeout = Annotated[float, NotNan, Field(gt=0, le=3600, description="Seconds; capped by the server's limit.")]
MemoryMb = Annotated[int, Field(ge=16, le=65536)]
TagName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][\w\-]*$")]
# Bounded so a weighted sum stays finite: 1e308 times a score of 1 is fine alone, and two of them are infinity.
MAX_WEIGHT = 1e6
Weight = Annotated[float, Field(allow_inf_nan=False, ge=-MAX_WEIGHT, le=MAX_WEIGHT)]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Body(Model):
    """A request body, checked whole once (not again per nested model)."""

    @model_validator(mode="before")
    @classmethod
    def _text_is_unicode(cls, data: Any) -> Any:
        """JSON can spell a lone surrogate ("\\ud800"), which no UTF-8 text holds: a program or stdin with one
        cannot be written for a run, nor an answer echoed back. The caller's to fix, so a 422 that says where."""
        require_text(data)
        return data


# ---- math ------------------------------------------------------------------------------


class MathOptions(Model):
    """math-verify's comparison settings; the defaults are its own."""

    extraction: list[Literal["latex", "expr"]] = Field(
        default=["latex", "expr"], min_length=1, max_length=2, description="Parsers for the answer and the gold."
    )
    precision: int = Field(default=6, ge=0, le=30, description="Decimal places numbers are rounded to.")
    strict: bool = Field(default=True, description="false: variable and function names may differ (f(x) = f(y)).")
    allow_set_relation_comp: bool = Field(
        default=False, description="A gold set or interval may equal a relation (x ∈ [a, b] vs a ≤ x ≤ b)."
    )
    allow_unevaluated: bool = Field(
        default=False,
        description="An integer gold may be matched by an expression that evaluates to it (`586+47`, `2^{10}`), "
        "as math-verify pays it; by default such an answer restates the question and is incorrect.",
    )

    @field_validator("extraction")
    @classmethod
    def _no_repeats(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"extraction lists a parser twice: {value}")
        return value

    def math_options(self) -> Any:
        from grpo.reward.verifiers.math_types import MathOptions as Options

        return Options(
            tuple(self.extraction), self.precision, self.strict, self.allow_set_relation_comp, self.allow_unevaluated
        )


class VerifyMathRequest(MathOptions, Body):
    answer: str = Field(
        description="The model's answer; a whole completion is fine (its last <answer> block, else all)."
    )
    gold: str = Field(description="The reference answer.")
    timeout_s: Timeout | None = None


class VerifyMathResponse(Model):
    correct: bool | None = Field(default=None, description="null when the verifier cannot judge (see status).")
    status: Literal["correct", "incorrect", "unparseable_gold", "unparseable_answer", "timeout", "error"]
    extracted_answer: str = ""
    detail: str = ""
    wall_s: float = 0.0


# ---- code ------------------------------------------------------------------------------


class StdioTest(Model):
    stdin: str = ""
    expected_stdout: str
    timeout_s: Timeout | None = Field(default=None, description="This test's time limit (else the request's).")
    memory_mb: MemoryMb | None = Field(default=None, description="This test's memory limit (else the request's).")


class AssertTest(Model):
    """A program run after the candidate code (HumanEval: the test code + `check(entry_point)`)."""

    assert_: str = Field(alias="assert", min_length=1)


CodeTest = StdioTest | AssertTest


def code_test_dict(test: CodeTest) -> dict[str, Any]:
    """The plain dict form the code verifier takes (per-test limits only when given)."""
    if isinstance(test, AssertTest):
        return {"assert": test.assert_}
    limits = {k: v for k, v in (("timeout_s", test.timeout_s), ("memory_mb", test.memory_mb)) if v is not None}
    return {"stdin": test.stdin, "expected_stdout": test.expected_stdout, **limits}


FileName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")]


ReturnOutputBytes = Annotated[
    int,
    Field(
        ge=0,
        le=MAX_RETURN_BYTES,
        description=f"Bytes of each output stream (stdout, stderr) returned per run: its first and last halves, the "
        f"bytes between them cut (default {DEFAULT_RETURN_BYTES >> 10} KiB). The streams of one response share the "
        "server's max_response_output_bytes (8 MiB): each gets at most an equal share. The judge and a checker see "
        "the whole stdout either way.",
    ),
]


class ExecuteRequest(Body):
    language: Language = "python"
    code: str
    stdin: str = ""
    timeout_s: Timeout | None = None
    memory_mb: MemoryMb | None = None
    files: dict[FileName, str] = Field(
        default_factory=dict, max_length=64, description="Text files written into the working directory first."
    )
    read_back: list[Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^/]+$")]] = Field(
        default_factory=list, max_length=16, description="Patterns (fnmatch) of working-directory files to return."
    )
    return_output_bytes: ReturnOutputBytes | None = None


ExecStatus = Literal[
    "ok", "compile_error", "runtime_error", "timeout", "memory_limit", "process_limit", "output_limit", "sandbox_error"
]
Encoding = Literal["utf-8", "base64"]
STDOUT = (
    "What the program wrote to stdout: all of it, or when stdout_truncated its head and tail joined by a line "
    "`[... N bytes of stdout cut ...]` (return_output_bytes in all). Text when those bytes are UTF-8, else their "
    "base64 (stdout_encoding)."
)
STDOUT_ENCODING = "utf-8: stdout is text; base64: the program's bytes were not UTF-8 and stdout is their base64."
STDOUT_BYTES = "Bytes the program wrote to stdout (a run stopped as output_limit: the cap, max_output_bytes)."
STDERR = (
    "What the program wrote to stderr, as text (bytes that are not UTF-8 read as U+FFFD): all of it, or when "
    "stderr_truncated its head and tail joined by a line `[... N bytes of stderr cut ...]`."
)
STDERR_BYTES = "Bytes the program wrote to stderr (counted on its text)."
TRUNCATED = "Bytes between the head and the tail were cut from what is returned."


class ExecuteResponse(Model):
    status: ExecStatus
    exit_code: int | None = None
    stdout: str = Field(default="", description=STDOUT)
    stderr: str = Field(default="", description=STDERR)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_memory_mb: float = 0.0
    files: dict[str, str] = Field(
        default_factory=dict,
        description="The files asked for by read_back, whole: text when UTF-8, else base64 (file_encodings).",
    )
    file_encodings: dict[str, Encoding] = Field(
        default_factory=dict, description="Each returned file's encoding: utf-8 (text) or base64 (its bytes)."
    )
    stdout_encoding: Encoding = Field(default="utf-8", description=STDOUT_ENCODING)
    stdout_bytes: int = Field(default=0, description=STDOUT_BYTES)
    stdout_truncated: bool = Field(default=False, description=TRUNCATED)
    stderr_bytes: int = Field(default=0, description=STDERR_BYTES)
    stderr_truncated: bool = Field(default=False, description=TRUNCATED)


class CheckerProgram(Model):
    """testlib's convention: `checker input.txt output.txt answer.txt`; exit 0 accepts, 1 or 2 rejects."""

    language: Language = "cpp"
    code: str = Field(min_length=1)


class JudgeOptions(Model):
    """How stdio tests are judged (see grpo.reward.verifiers.code.Judge)."""

    compare: Literal["lines", "exact", "tokens", "case_insensitive", "float"] = Field(
        default="lines",
        description="lines: line by line, trailing spaces ignored; exact; tokens: whitespace-separated tokens; "
        "case_insensitive: tokens ignoring case; float: tokens, numbers within abs_tol or rel_tol.",
    )
    abs_tol: Annotated[float, NotNan] = Field(
        default=1e-6, ge=0, le=1e6, description="compare float: absolute tolerance."
    )
    rel_tol: Annotated[float, NotNan] = Field(
        default=1e-6, ge=0, le=1, description="compare float: relative tolerance."
    )
    stop_on_first_failure: bool = Field(
        default=False, description="Run the tests in order and skip the rest after the first that does not pass."
    )
    checker: CheckerProgram | None = Field(
        default=None, description="A special judge that decides each stdio test instead of `compare`."
    )

    def judge(self) -> Any:
        from grpo.reward.verifiers.code import Checker, Judge

        checker = Checker(self.checker.language, self.checker.code) if self.checker else None
        return Judge(self.compare, self.abs_tol, self.rel_tol, self.stop_on_first_failure, checker)


class VerifyCodeRequest(JudgeOptions, Body):
    language: Language = "python"
    code: str = Field(description="Candidate code; a whole completion is fine (the last fenced block is taken).")
    tests: list[CodeTest] = Field(min_length=1)
    timeout_s: Timeout | None = Field(default=None, description="Per test.")
    memory_mb: MemoryMb | None = None
    return_output_bytes: ReturnOutputBytes | None = None


Verdict = Literal[
    "pass",
    "fail",
    "compile_error",
    "timeout",
    "runtime_error",
    "memory_limit",
    "process_limit",
    "output_limit",
    "skipped",
    "checker_error",
    "sandbox_error",
]


class CodeTestResult(Model):
    verdict: Verdict
    exit_code: int | None = None
    stdout: str = Field(default="", description=STDOUT)
    stderr: str = Field(default="", description=STDERR)
    wall_s: float = 0.0
    detail: str = Field(
        default="",
        description="Why the verdict is what it is (empty for a pass); a wrong answer names where it first differs.",
    )
    cpu_s: float = Field(default=0.0, description="CPU time of the run.")
    peak_memory_mb: float = Field(default=0.0, description="Peak resident memory of the program.")
    stdout_encoding: Encoding = Field(default="utf-8", description=STDOUT_ENCODING)
    stdout_bytes: int = Field(default=0, description=STDOUT_BYTES)
    stdout_truncated: bool = Field(default=False, description=TRUNCATED)
    stderr_bytes: int = Field(default=0, description=STDERR_BYTES)
    stderr_truncated: bool = Field(default=False, description=TRUNCATED)


class VerifyCodeResponse(Model):
    passed: int
    total: int
    tests: list[CodeTestResult]


# ---- scoring ---------------------------------------------------------------------------


class MathCheck(MathOptions):
    gold: str


class CodeCheck(JudgeOptions):
    tests: list[CodeTest] = Field(min_length=1)
    language: Language = "python"
    timeout_s: Timeout | None = None
    partial_credit: bool = Field(
        default=True, description="Score the fraction of tests passed; false: 1 only when every test passes."
    )


class FormatCheck(Model):
    think_tag: TagName = "think"
    answer_tag: TagName = "answer"
    think_prefilled: bool = Field(default=False, description="The chat template already opened <think>.")

    @model_validator(mode="after")
    def _distinct_tags(self) -> FormatCheck:
        # One tag for both blocks can never appear exactly once in each: every completion would score 0, silently.
        if self.think_tag == self.answer_tag:
            raise ValueError(f"think_tag and answer_tag are both {self.think_tag!r}: they must differ")
        return self


class LanguageCheck(Model):
    target: Literal["en", "zh", "auto"] = "auto"


class OverlongCheck(Model):
    max_tokens: int = Field(gt=0)
    buffer_tokens: int = Field(ge=0)
    completion_tokens: int | None = Field(default=None, ge=0, description="Characters / 4 when unset.")

    @model_validator(mode="after")
    def _buffer_fits(self) -> OverlongCheck:
        if self.buffer_tokens > self.max_tokens:
            raise ValueError("buffer_tokens must not exceed max_tokens")
        return self


class RewardModelCheck(Model):
    """How the reward model's first logit becomes the component's score (docs/reward.md "Hybrid reward")."""

    normalize: Literal["none", "sigmoid"] = Field(
        default="none",
        description="none: (logit - shift) / scale, unbounded (the raw logit with the defaults); "
        "sigmoid: sigmoid((logit - shift) / scale), in (0, 1) like the rule components.",
    )
    shift: Annotated[float, NotNan] = Field(default=0.0, allow_inf_nan=False, description="Subtracted from the logit.")
    scale: Annotated[float, NotNan] = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="The shifted logit is divided by it; > 0."
    )


class PluginCheck(Model):
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for the plug-in.")

    @field_validator("kwargs")
    @classmethod
    def _not_reserved(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        from grpo.reward.verifiers.plugins import RESERVED_KWARGS

        # The call passes these itself: one item's `prompts` would fail every item of the batch with a TypeError.
        taken = sorted(RESERVED_KWARGS & set(kwargs))
        if taken:
            raise ValueError(f"kwargs {taken} are passed by the service itself (the batch's texts); rename them")
        return kwargs


class Span(Model):
    start: int = Field(ge=0, description="First character of the step in the completion.")
    end: int = Field(ge=0, description="One past its last character.")


class StepsCheck(Model):
    """Step scores next to the outcome components (process supervision); see docs/reward.md "Step scores"."""

    source: Literal["rule", "prm", "cut"] = Field(
        description="rule: a built-in step verifier; prm: the server's PRM; cut: the steps only, unscored (VinePPO)."
    )
    rule: str = Field(default="", description="source rule: the step verifier's name, e.g. column_addition.")
    delimiter: str | None = Field(
        default=None, min_length=1, description='prm and cut: cut the completion at this string (default "\n").'
    )
    spans: list[Span] | None = Field(default=None, min_length=1, description="prm and cut: explicit step spans.")

    @model_validator(mode="after")
    def _consistent(self) -> StepsCheck:
        from grpo.reward.verifiers.steps import STEP_RULES

        if self.source == "rule":
            if self.rule not in STEP_RULES:
                raise ValueError(f"unknown step rule {self.rule!r}; available: {sorted(STEP_RULES)}")
            if self.delimiter is not None or self.spans is not None:
                raise ValueError(
                    "a step rule cuts the completion itself: delimiter and spans are for source prm or cut"
                )
        elif self.rule:
            raise ValueError(f"rule is for source rule, not {self.source}")
        if self.delimiter is not None and self.spans is not None:
            raise ValueError("give delimiter or spans, not both")
        return self


class StepScore(Model):
    start: int
    end: int
    score: float | None = Field(default=None, description="null when the step cannot be judged (see status).")
    status: str
    detail: str = ""


class Checks(Model):
    math: MathCheck | None = None
    code: CodeCheck | None = None
    format: FormatCheck | None = None
    language: LanguageCheck | None = None
    overlong: OverlongCheck | None = None
    reward_model: RewardModelCheck | None = None
    plugins: dict[str, PluginCheck] = Field(default_factory=dict, description="Plug-in reward functions by name.")
    steps: StepsCheck | None = Field(default=None, description="Step scores, reported beside the reward.")

    def names(self) -> list[str]:
        """The component names this item asked for (plug-ins by their own name)."""
        fixed = ["math", "code", "format", "language", "overlong", "reward_model"]
        return [n for n in fixed if getattr(self, n) is not None] + list(self.plugins)


class ScoreItem(Model):
    id: str = Field(max_length=256)
    prompt: str = ""
    completion: str
    checks: Checks
    weights: dict[str, Weight] = Field(
        default_factory=dict,
        description="Weights by component name, within ±1e6; 1 when absent; 0 makes a component optional.",
    )

    @model_validator(mode="after")
    def _known_weights(self) -> ScoreItem:
        names = self.checks.names()
        if not names:
            raise ValueError("checks must ask for at least one component (steps alone give no reward)")
        unknown = sorted(set(self.weights) - set(names))
        if unknown:
            raise ValueError(f"weights name components not in checks: {unknown}; checks: {names}")
        if self.checks.steps is not None and self.checks.steps.spans is not None:
            from grpo.reward.verifiers.steps import check_spans

            check_spans([(span.start, span.end) for span in self.checks.steps.spans], self.completion)
        return self


class ScoreRequest(Body):
    items: list[ScoreItem] = Field(min_length=1)
    timeout_s: Timeout | None = Field(default=None, description="Whole-request deadline.")

    @field_validator("items")
    @classmethod
    def _unique_ids(cls, items: list[ScoreItem]) -> list[ScoreItem]:
        seen: set[str] = set()
        for item in items:
            if item.id in seen:
                raise ValueError(f"duplicate item id {item.id!r}")
            seen.add(item.id)
        return items


class ComponentResult(Model):
    score: float | None = Field(default=None, description="null when the component cannot judge or failed.")
    status: str
    detail: str = ""


class ScoreResult(Model):
    id: str
    reward: float | None = Field(
        default=None, description="Weighted sum of the components; null when one cannot judge or failed."
    )
    status: Literal["ok", "error"]
    error: str = Field(default="", description="Why reward is null (cannot judge, or the infrastructure error).")
    components: dict[str, ComponentResult] = Field(default_factory=dict)
    steps: list[StepScore] = Field(default_factory=list, description="When checks.steps asked for them.")
    wall_s: float = 0.0


class ScoreResponse(Model):
    results: list[ScoreResult]


class Health(Model):
    status: str = "ok"
    workers: int = 0
    sandbox: str = ""
    queue_depth: int = 0
    inflight: int = 0
    version: str = ""
    languages: list[str] = Field(default_factory=list, description="Languages whose toolchains the sandbox has.")


class Readiness(Model):
    ready: bool
    missing: list[str] = Field(
        default_factory=list, description="What keeps the server from its work; empty when ready."
    )
    sandbox: str = ""
    languages: list[str] = Field(default_factory=list)
