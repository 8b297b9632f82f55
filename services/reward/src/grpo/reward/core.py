"""The reward core both edges share: limits, admission, deadlines, and the verifiers wired to the pools.

Its operations are coroutines awaited on the one asyncio loop that serves both edges
(uvicorn and grpc.aio), so both see the same queue and limits; the work itself runs in
the math worker processes and the sandbox threads.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from grpo.reward import metrics
from grpo.reward.admission import Admission, Ticket
from grpo.reward.cancellation import SandboxGate
from grpo.reward.components import GOLD_CHECK_S, ComponentRunner
from grpo.reward.errors import DeadlineExceeded, InputError
from grpo.reward.output import share
from grpo.reward.pool import WorkerPool
from grpo.reward.sandbox.build_cache import BuildCache, BuildCaches, compiled
from grpo.reward.sandbox.languages import BUILD_LIMITS, TOOLCHAINS, program_files
from grpo.reward.schemas import (
    CheckerProgram,
    CodeTestResult,
    ExecuteRequest,
    ExecuteResponse,
    Health,
    ScoreRequest,
    ScoreResult,
    VerifyCodeRequest,
    VerifyCodeResponse,
    VerifyMathRequest,
    VerifyMathResponse,
    code_test_dict,
)
from grpo.reward.scoring import error_result
from grpo.reward.settings import RewardSettings

log = logging.getLogger(__name__)
EXECUTE_SLACK_S = 1.0  # an execute request's deadline past its run's wall-clock limit (_execute_budget_s)
T = TypeVar("T")
TEST_DATA_FIELDS = ("stdin", "expected_stdout")  # a test's fields capped by max_test_chars, not max_code_chars


class RewardCore:
    """Verifier pools, sandbox, plug-ins and the admission of one service process."""

    def __init__(self, settings: RewardSettings) -> None:
        self.settings = settings
        workers = settings.sandbox_workers or settings.workers
        self.admission = Admission(
            settings.max_queue, settings.retry_after_s, settings.workers, workers, SandboxGate(workers)
        )
        self.pool = WorkerPool(
            settings.workers,
            max_queue=settings.max_queue,
            max_batch=settings.math_batch,
            preload=["grpo.reward.verifiers.math", "grpo.reward.math_warmup"],  # workers fork warm
            on_kill=lambda: metrics.SANDBOX_KILLS.labels("math_worker").inc(),
            on_item=self.admission.math.observe,
            on_cancel=metrics.CANCELLED.labels("math").inc,
        )
        metrics.QUEUE_DEPTH.set_function(self.pool.queue_depth)
        self.sandbox, self.sandbox_note = self._start_sandbox()
        self._code_threads = ThreadPoolExecutor(max_workers=workers * 2, thread_name_prefix="code")
        self._aux_threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="aux")
        self.components = ComponentRunner(settings, self.pool, self.sandbox, self._code_threads, self._aux_threads)

    def _start_sandbox(self) -> tuple[Any, str]:
        from grpo.reward.sandbox import SandboxUnavailable, make_sandbox

        if self.settings.sandbox == "off":
            log.info("sandbox off: code verification disabled")
            return None, "off (the sandbox setting)"
        try:
            sandbox = make_sandbox(
                self.settings.sandbox,
                workers=self.settings.sandbox_workers or self.settings.workers,
                languages=self.settings.languages,
                max_output_bytes=self.settings.max_output_bytes,
                mode=self.settings.sandbox_mode,
                user=self.settings.sandbox_user,
                idle_factor=self.settings.code_idle_factor,
            )
        except (SandboxUnavailable, OSError, ValueError) as exc:
            # The service still verifies math; code requests answer sandbox_error (never a 0).
            log.error("sandbox unavailable, code verification disabled: %s", exc)
            return None, f"unavailable: {exc}"
        log.info("sandbox: %s", sandbox.isolation)
        sandbox.build_caches = build_caches(self.settings)
        return sandbox, str(sandbox.isolation)

    # ---- plumbing ---------------------------------------------------------------------

    def deadline(self, timeout_s: float | None, remaining_s: float | None = None) -> float:
        """Absolute (monotonic) deadline: the request's timeout or the default, capped, and within `remaining_s`."""
        budget = min(timeout_s or self.settings.default_timeout_s, self.settings.max_timeout_s)
        if remaining_s is not None:
            # Finish a little before the caller's own deadline so it gets our answer, not DEADLINE_EXCEEDED.
            budget = min(budget, remaining_s * 0.95 - 0.05)
        return time.monotonic() + max(0.0, budget)

    @contextmanager
    def admit(self, items: int, deadline: float, *, math_units: int = 0, code_units: int = 0) -> Iterator[Ticket]:
        """Admit a request (admission.py: refused when it cannot finish by `deadline`); when the block exits, the
        request has ended and whatever of its work still runs stops at its next test."""
        with self.admission.admit(items, deadline, math_units=math_units, code_units=code_units) as ticket:
            yield ticket

    @property
    def _inflight(self) -> int:
        return self.admission.inflight

    def health(self) -> Health:
        return Health(
            status="ok",
            workers=self.pool.size,
            sandbox=self.sandbox_note,
            queue_depth=self.pool.queue_depth(),
            inflight=self._inflight,
            version=_version(),
            languages=self.languages(),
        )

    def readiness_problems(self) -> list[str]:
        """What keeps this server from doing its work: math workers, plug-ins whose every thread is stuck, the
        sandbox, its languages (empty: ready)."""
        problems: list[str] = []
        if (why := self.pool.problem()) is not None:
            problems.append(f"math: {why}")
        problems.extend(self.components.plugin_problems())
        if self.settings.sandbox == "off":  # a math-only server by choice
            return problems
        if self.sandbox is None:
            problems.append(f"sandbox: {self.sandbox_note}")
        elif (why := self.sandbox.problem()) is not None:
            problems.append(f"sandbox: {why}")
        elif not self.languages():
            problems.append("sandbox: no language toolchain found")
        return problems

    # ---- limits -----------------------------------------------------------------------

    def _check_text(self, name: str, text: str, limit: int, setting: str = "") -> None:
        """Refuse `text` past `limit`, naming the server `setting` that sets it where there is one."""
        if len(text) > limit:
            metrics.REJECTED.labels("too_large").inc()
            which = f" ({setting})" if setting else ""
            raise InputError(f"{name} has {len(text)} characters; the limit is {limit}{which}")

    def _check_tests(self, where: str, tests: list[Any]) -> None:
        if len(tests) > self.settings.max_tests:
            raise InputError(f"{where}: {len(tests)} tests; the limit is {self.settings.max_tests}")
        for i, test in enumerate(tests):
            for key, text in code_test_dict(test).items():
                if isinstance(text, str):
                    # A test's data (stdin, expected output) runs to megabytes; an assert test is a program.
                    setting = "max_test_chars" if key in TEST_DATA_FIELDS else "max_code_chars"
                    self._check_text(f"{where}[{i}].{key}", text, getattr(self.settings, setting), setting)

    def languages(self) -> list[str]:
        return sorted(self.components.sandbox.languages) if self.components.sandbox is not None else []

    def _check_installed(self, where: str, language: str) -> None:
        """A language this server serves: installed, and in its `languages` setting (without a sandbox, code
        answers sandbox_error instead)."""
        if self.components.sandbox is not None and language not in self.components.sandbox.languages:
            metrics.REJECTED.labels("invalid").inc()
            raise InputError(f"{where}: {language!r} is not served here; available: {self.languages()}")

    def _check_language(self, where: str, language: str, tests: Sequence[Any]) -> None:
        """A language whose toolchain this server has; assert tests only for Python (they are Python code)."""
        self._check_installed(where, language)
        if language != "python" and any(getattr(t, "assert_", None) is not None for t in tests):
            raise InputError(f"{where}: assert tests are Python code; give {language} stdin/expected_stdout tests")

    def _check_checker(self, where: str, checker: CheckerProgram | None) -> None:
        """A checker's language must be installed too: it defaults to cpp, which a Python-only server lacks,
        and the verifier would otherwise answer sandbox_error for every test."""
        if checker is not None:
            self._check_installed(where, checker.language)

    def check_score(self, req: ScoreRequest) -> None:
        """Server-side limits and names a schema cannot know (raises InputError)."""
        s = self.settings
        if len(req.items) > s.max_items:
            metrics.REJECTED.labels("too_large").inc()
            raise InputError(f"{len(req.items)} items; the limit per request is {s.max_items}")
        for i, item in enumerate(req.items):
            self._check_text(f"items[{i}].completion", item.completion, s.max_text_chars, "max_text_chars")
            self._check_text(f"items[{i}].prompt", item.prompt, s.max_text_chars, "max_text_chars")
            checks = item.checks
            if checks.math is not None:
                self._check_text(f"items[{i}].checks.math.gold", checks.math.gold, s.max_text_chars, "max_text_chars")
            if checks.code is not None:
                self._check_tests(f"items[{i}].checks.code.tests", checks.code.tests)
                self._check_language(f"items[{i}].checks.code.language", checks.code.language, checks.code.tests)
                self._check_checker(f"items[{i}].checks.code.checker.language", checks.code.checker)
            if checks.reward_model is not None and self.components.reward_model is None:
                raise InputError(
                    f"items[{i}]: the reward_model component is not enabled on this server: start it with "
                    "reward_model_path (--reward-model-path, GRPO_REWARD_REWARD_MODEL_PATH), or drop reward_model "
                    "from the checks"
                )
            if checks.steps is not None and checks.steps.source == "prm" and self.components.prm is None:
                raise InputError(f"items[{i}]: steps from a process reward model need the server's prm_path setting")
            unknown = sorted(set(checks.plugins) - set(self.components.plugins))
            if unknown:
                known = sorted(self.components.plugins) or "none"
                raise InputError(f"items[{i}]: unknown plug-in(s) {unknown}; configured: {known}")

    # ---- operations (coroutines for the core loop) ------------------------------------

    async def verify_math(self, req: VerifyMathRequest, remaining_s: float | None = None) -> VerifyMathResponse:
        self._check_text("answer", req.answer, self.settings.max_text_chars, "max_text_chars")
        self._check_text("gold", req.gold, self.settings.max_text_chars, "max_text_chars")
        s = self.settings
        limit = min(req.timeout_s or s.math_timeout_s, s.max_timeout_s)
        # timeout_s is the verification's own limit, from when a worker starts it (as math_timeout_s is for a
        # /v1/score item); the request's deadline is default_timeout_s, or the limit and the gold's own check when
        # that is more. It once was the limit counted from arrival: time spent waiting for a worker came off the
        # verification, and a backlog turned verdicts into errors.
        deadline = self.deadline(max(s.default_timeout_s, limit + GOLD_CHECK_S + 1.0), remaining_s)
        with self.admit(1, deadline, math_units=1):
            return await self.components.math(req.answer, req.gold, deadline, req.math_options(), limit_s=limit)

    async def execute(self, req: ExecuteRequest, remaining_s: float | None = None) -> ExecuteResponse:
        self._check_text("code", req.code, self.settings.max_code_chars, "max_code_chars")
        self._check_language("language", req.language, [])
        own = _own_file_names(req.language)
        reserved = sorted(n for n in req.files if any(fnmatch.fnmatchcase(n, p) for p in own))
        if reserved:
            raise InputError(
                f"files: {reserved} are the program's own file names in {req.language} ({', '.join(own)}); rename them"
            )
        for name, text in req.files.items():
            self._check_text(f"files[{name!r}]", text, self.settings.max_text_chars, "max_text_chars")
        self._check_text("stdin", req.stdin, self.settings.max_test_chars, "max_test_chars")
        # req.timeout_s limits the program; the request itself may take the default deadline, or what its build
        # and its run's wall-clock limit add up to when that is more.
        deadline = self.deadline(self._execute_budget_s(req), remaining_s)
        with self.admit(1, deadline, code_units=1):
            result = await self._within(self.components.execute(req, deadline), deadline + 1.0)
        return result

    async def verify_code(self, req: VerifyCodeRequest, remaining_s: float | None = None) -> VerifyCodeResponse:
        self._check_text("code", req.code, self.settings.max_code_chars, "max_code_chars")
        self._check_tests("tests", req.tests)
        self._check_language("language", req.language, req.tests)
        self._check_checker("checker.language", req.checker)
        deadline = self.deadline(self._code_budget_s(req), remaining_s)
        # Each test's stdout and stderr share the response's budget of returned output.
        keep = share(req.return_output_bytes, 2 * len(req.tests), self.settings.max_response_output_bytes)
        with self.admit(len(req.tests), deadline, code_units=len(req.tests)):
            tests = await self._within(
                self.components.code_tests(
                    req.code,
                    [code_test_dict(t) for t in req.tests],
                    req.language,
                    req.timeout_s,
                    req.memory_mb,
                    req.judge(),
                    keep,
                ),
                deadline,
            )
        return _code_response(tests)

    def _execute_budget_s(self, req: ExecuteRequest) -> float:
        """execute's deadline before the cap: default_timeout_s, or its build and its run's wall-clock limit
        (settings.code_wall_s of its time limit, which is CPU time) when that is more, with a second for the run's
        set-up and answer: a deadline no later than the wall-clock limit would cut every run that reaches it."""
        s = self.settings
        run = s.code_wall_s(min(req.timeout_s or s.code_timeout_s, s.max_code_timeout_s))
        build = BUILD_LIMITS.wall_limit_s(s.code_idle_factor) * compiled(req.language)
        return max(s.default_timeout_s, build + run + EXECUTE_SLACK_S)

    def _code_budget_s(self, req: VerifyCodeRequest) -> float:
        """verify_code's deadline before the cap: default_timeout_s, or what its builds and its tests' own
        wall-clock limits (settings.code_wall_s of their time limits, which are CPU time) add up to when that is more
        (seven tests of 9 s at a 10 s limit once hit a 60 s deadline no field moved)."""
        s = self.settings
        per_test = min(req.timeout_s or s.code_timeout_s, s.max_code_timeout_s)
        runs = sum(
            s.code_wall_s(min(code_test_dict(t).get("timeout_s", per_test), s.max_code_timeout_s)) for t in req.tests
        )
        # An interpreted language has no build: a phantom 30 s let admission queue Python tests that long.
        built = [req.language, *([req.checker.language] if req.checker is not None else [])]
        builds = BUILD_LIMITS.wall_limit_s(s.code_idle_factor) * sum(map(compiled, built))
        return max(s.default_timeout_s, builds + runs * (2 if req.checker is not None else 1))

    async def score_iter(self, req: ScoreRequest, remaining_s: float | None = None) -> AsyncIterator[ScoreResult]:
        """Yield each item's result as soon as it is done (any order)."""
        self.check_score(req)
        deadline = self.deadline(req.timeout_s, remaining_s)
        math_units = sum(item.checks.math is not None for item in req.items)
        code_units = sum(len(item.checks.code.tests) for item in req.items if item.checks.code is not None)
        with self.admit(len(req.items), deadline, math_units=math_units, code_units=code_units):
            batch = self.components.start_batch(req.items, deadline)
            pending = {
                asyncio.ensure_future(self._item_within(batch.score_item(item), item.id, deadline))
                for item in req.items
            }
            try:
                for next_done in asyncio.as_completed(pending):
                    result = await next_done
                    metrics.ITEMS.labels(result.status).inc()
                    yield result
            finally:
                for task in pending:
                    task.cancel()
                batch.cancel()

    async def score(self, req: ScoreRequest, remaining_s: float | None = None) -> list[ScoreResult]:
        """Every item's result, in request order."""
        by_id = {r.id: r async for r in self.score_iter(req, remaining_s)}
        return [by_id[item.id] for item in req.items]

    async def _within(self, aw: Awaitable[T], deadline: float) -> T:
        try:
            return await asyncio.wait_for(aw, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise DeadlineExceeded("request deadline exceeded") from None

    async def _item_within(self, aw: Awaitable[ScoreResult], item_id: str, deadline: float) -> ScoreResult:
        started = time.monotonic()
        try:
            return await asyncio.wait_for(aw, max(0.0, deadline - started))
        except TimeoutError:
            return error_result(
                item_id, "request deadline exceeded before this item finished", time.monotonic() - started
            )
        except Exception as exc:  # an item must never take the batch down; it is an error, not a 0
            log.exception("scoring item %s failed", item_id)
            return error_result(item_id, f"internal error: {type(exc).__name__}: {exc}", time.monotonic() - started)

    async def drain(self, grace_s: float) -> None:
        """Wait up to `grace_s` for admitted work to finish (shutdown)."""
        deadline = time.monotonic() + grace_s
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def close(self) -> None:
        """Stop the pools and the sandbox (work in flight ends as errors, answered)."""
        self.pool.close()
        if self.sandbox is not None:
            try:
                self.sandbox.close()
            except Exception:  # shutdown goes on: the loop and threads must still stop
                log.exception("sandbox close failed")
        self._code_threads.shutdown(wait=False, cancel_futures=True)
        self._aux_threads.shutdown(wait=False, cancel_futures=True)
        self.components.close()


def build_caches(settings: RewardSettings) -> BuildCaches:
    """This process's build caches for its sandbox, sized by the settings and counted in /metrics."""

    def cache(kind: str, entries: int, mb: int) -> BuildCache:
        made = BuildCache(
            entries, mb << 20, settings.build_error_cache_s,
            on_lookup=lambda outcome: metrics.BUILD_CACHE.labels(kind, outcome).inc(),
            on_evict=metrics.BUILD_CACHE_EVICTIONS.labels(kind).inc,
        )  # fmt: skip
        metrics.BUILD_CACHE_BYTES.labels(kind).set_function(lambda: made.size)
        return made

    return BuildCaches(
        checkers=cache("checker", settings.checker_cache_entries, settings.checker_cache_mb),
        programs=cache("program", settings.program_cache_entries, settings.program_cache_mb),
    )


def _own_file_names(language: str) -> list[str]:
    """The names (fnmatch patterns) a run of `language` writes itself: its source and what its build leaves,
    patterns included (Java's *.class, whose clash the sandbox would find only after the build)."""
    chain = TOOLCHAINS.get(language)
    patterns = {a for a in chain.artifacts if "*" in a} if chain else set()
    return sorted(program_files(language) | patterns)


def _code_response(tests: list[CodeTestResult]) -> VerifyCodeResponse:
    return VerifyCodeResponse(passed=sum(t.verdict == "pass" for t in tests), total=len(tests), tests=tests)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grpo-reward")
    except PackageNotFoundError:
        return "unknown"
