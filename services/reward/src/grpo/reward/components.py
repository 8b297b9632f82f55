"""Each component as a coroutine: math in the worker pool, code in the sandbox, the rest inline or batched.

Failures of the machinery become statuses (timeout, error, sandbox_error) here; the
scoring rules in grpo.reward.scoring decide what they mean for the reward.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from grpo.reward import metrics
from grpo.reward.cancellation import request_sandbox
from grpo.reward.errors import DeadlineExceeded
from grpo.reward.math_tasks import check_gold, verify_math
from grpo.reward.output import Returned, encode, returned_stderr, returned_stdout, share
from grpo.reward.plugin_threads import PluginThreads, PluginTimeout, contained
from grpo.reward.pool import DeadlinePassed, PoolFull, TaskTimeout, WorkerPool
from grpo.reward.schemas import (
    CodeTestResult,
    Encoding,
    ExecStatus,
    ExecuteRequest,
    ExecuteResponse,
    RewardModelCheck,
    ScoreItem,
    ScoreResult,
    Verdict,
    VerifyMathResponse,
    code_test_dict,
)
from grpo.reward.scoring import code_judgement, combine, math_judgement
from grpo.reward.settings import RewardSettings
from grpo.reward.verifiers.format import format_reward
from grpo.reward.verifiers.language import language_reward
from grpo.reward.verifiers.overlong import overlong_reward
from grpo.reward.verifiers.plugins import RewardFn, load_plugins, run_plugin
from grpo.reward.verifiers.result import Judgement
from grpo.reward.verifiers.reward_model import normalized
from grpo.reward.verifiers.steps import STEP_RULES, StepJudgement, cut_at

log = logging.getLogger(__name__)

# A verification that times out is the answer's doing when its gold alone parses and verifies within this.
GOLD_CHECK_S = 2.0
# What a score keeps of each test's output: it returns none, and quotes 200 characters of a failure's reason.
SCORE_KEEP_BYTES = 1 << 10
_GOLD_CACHE_SIZE = 4096  # golds whose own check has been decided (a data set has few; each GRPO group shares one)


def _observe(verifier: str, status: str, started: float) -> float:
    wall = time.monotonic() - started
    metrics.VERIFIER_SECONDS.labels(verifier).observe(wall)
    metrics.VERDICTS.labels(verifier, status).inc()
    return wall


class ComponentRunner:
    """Runs verifiers on the right executor with the right deadline."""

    def __init__(
        self,
        settings: RewardSettings,
        pool: WorkerPool,
        sandbox: Any,
        code_threads: ThreadPoolExecutor,
        aux_threads: ThreadPoolExecutor,
    ) -> None:
        self.settings, self.pool, self.sandbox = settings, pool, sandbox
        self.code_threads, self.aux_threads = code_threads, aux_threads
        self.plugins: dict[str, RewardFn] = load_plugins(settings.plugins)
        # Each plug-in on threads of its own: a hung one cannot stall the others, the reward model or the PRM.
        self.plugin_threads = {name: PluginThreads(name, settings.plugin_timeout_s) for name in self.plugins}
        self.reward_model: Any = None
        self.prm: Any = None
        self._gold_quick: OrderedDict[tuple[str, Any], bool] = OrderedDict()  # (gold, options) -> checks in time
        if settings.prm_path:
            from grpo.reward.verifiers.prm import ProcessRewardModel

            self.prm = ProcessRewardModel(
                settings.prm_path, settings.prm_step_token, settings.prm_max_length, settings.prm_trust_remote_code
            )
        if settings.reward_model_path:
            from grpo.reward.verifiers.reward_model import RewardModel

            self.reward_model = RewardModel(
                settings.reward_model_path, settings.reward_model_batch_size, settings.reward_model_max_length
            )

    async def math(
        self, answer: str, gold: str, deadline: float, options: Any = None, limit_s: float | None = None
    ) -> VerifyMathResponse:
        """One verification in a worker process, killed at min(its limit, deadline).

        Its limit is `limit_s` (default math_timeout_s), from its start. Reaching it is a timeout (cannot judge:
        the expression blew sympy up); the request's deadline stopping it first, or leaving it no time, is an
        error (the service ran out of time, the item said nothing wrong).
        """
        started = time.monotonic()
        limit = limit_s or self.settings.math_timeout_s
        # A kill and its answer take a few ms: leave them inside the request deadline.
        last = deadline - 0.05
        if last - started <= 0:
            _observe("math", "error", started)
            detail = "request deadline: no time was left for the verification"
            return VerifyMathResponse(correct=None, status="error", detail=detail)
        try:  # the limit is the verification's own, from its start; waiting for a worker spends the request's
            # The pool tells its own limit (TaskTimeout) from the deadline cutting it short (DeadlinePassed).
            future = self.pool.submit(verify_math, answer, gold, options, timeout_s=limit, deadline=last)
            verdict = await asyncio.wrap_future(future)
        except TaskTimeout as exc:  # the verification itself ran out (a sympy blow-up): whose?
            quick = await self._gold_checks_in_time(gold, options, last, limit)
            if quick:  # the gold alone is fine: the answer blew sympy up, and a null would let it dodge its 0
                wall = _observe("math", "incorrect", started)
                detail = f"{exc}; the gold alone verifies within {min(GOLD_CHECK_S, limit):g}s: the answer's doing"
                return VerifyMathResponse(correct=False, status="incorrect", detail=detail, wall_s=wall)
            why = "the gold itself does not verify in time" if quick is False else "no time was left to check the gold"
            wall = _observe("math", "timeout", started)
            return VerifyMathResponse(correct=None, status="timeout", detail=f"{exc}; {why}", wall_s=wall)
        except DeadlinePassed as exc:  # the service ran out: too little capacity for the request's items in time
            wall = _observe("math", "error", started)
            waiting = f"{self.pool.queue_depth()} math items waiting for {self.pool.size} workers"
            detail = f"request deadline: {exc} ({waiting})"
            return VerifyMathResponse(correct=None, status="error", detail=detail, wall_s=wall)
        except (PoolFull, Exception) as exc:  # worker crash, pool closed, full queue: infrastructure
            wall = _observe("math", "error", started)
            log.warning("math verification failed: %s", exc)
            return VerifyMathResponse(correct=None, status="error", detail=f"{type(exc).__name__}: {exc}", wall_s=wall)
        wall = _observe("math", verdict.status, started)
        return VerifyMathResponse(
            correct=verdict.correct,
            status=verdict.status,
            extracted_answer=verdict.extracted_answer,
            detail=verdict.detail,
            wall_s=wall,
        )

    async def _gold_checks_in_time(self, gold: str, options: Any, last: float, limit: float) -> bool | None:
        """Whether the gold alone parses and verifies against itself within GOLD_CHECK_S (cached per gold), in a
        worker of its own killed at that limit; None when that could not be found out (the request's deadline, a
        full queue, a crash): the timeout then stays a timeout."""
        key = (gold, options)
        if key in self._gold_quick:
            self._gold_quick.move_to_end(key)
            return self._gold_quick[key]
        try:
            # Urgent: behind a backlog it waited past the deadline and the verdict became a null.
            future = self.pool.submit(
                check_gold, gold, options, timeout_s=min(GOLD_CHECK_S, limit), deadline=last, urgent=True
            )
            await asyncio.wrap_future(future)
            quick = True
        except TaskTimeout:
            quick = False
        except Exception as exc:  # DeadlinePassed, PoolFull, a crash: undecided, and not cached
            log.info("could not check the gold of a timed-out verification: %s", exc)
            return None
        self._gold_quick[key] = quick
        if len(self._gold_quick) > _GOLD_CACHE_SIZE:
            self._gold_quick.popitem(last=False)
        return quick

    def _limits(self, timeout_s: float | None, memory_mb: int | None, deadline: float | None = None) -> Any:
        from grpo.reward.sandbox import Limits

        s = self.settings
        timeout = min(timeout_s or s.code_timeout_s, s.max_code_timeout_s)
        wall = s.code_wall_s(timeout)  # timeout_s is CPU time; this, its wall-clock limit
        if deadline is not None:  # a run the request's deadline would cut short is stopped by it
            wall = max(0.05, min(wall, deadline - time.monotonic()))
            timeout = min(timeout, wall)
        memory = min(memory_mb or s.code_memory_mb, s.max_code_memory_mb)
        return Limits(timeout_s=timeout, wall_s=wall, memory_mb=memory)

    async def execute(self, req: ExecuteRequest, deadline: float) -> ExecuteResponse:
        """One sandboxed run; its output comes back as a head and tail of each stream, files exactly."""
        started = time.monotonic()
        if self.sandbox is None:
            _observe("execute", "sandbox_error", started)
            return _failed_run("no sandbox available on this server")
        limits = self._limits(req.timeout_s, req.memory_mb, deadline)
        loop = asyncio.get_running_loop()
        sandbox = request_sandbox(self.sandbox)  # starts nothing once the request has ended
        try:
            res = await loop.run_in_executor(
                self.code_threads,
                lambda: sandbox.run(
                    req.code,
                    req.stdin,
                    limits,
                    req.language,
                    {k: v.encode() for k, v in req.files.items()},
                    tuple(req.read_back),
                ),
            )
        except Exception as exc:
            log.exception("sandbox run failed")
            _observe("execute", "sandbox_error", started)
            return _failed_run(f"{type(exc).__name__}: {exc}")
        if res.status == "timeout":
            metrics.SANDBOX_KILLS.labels("sandbox").inc()
            asked = self._limits(req.timeout_s, req.memory_mb)
            if _cut_by_deadline(res, limits, asked):
                _observe("execute", "deadline", started)
                raise DeadlineExceeded(
                    f"request deadline exceeded: the program was stopped after {res.wall_s:.2f}s, the time left "
                    f"before the call's deadline, short of its own {asked.timeout_s:g}s limit"
                )
        _observe("execute", res.status, started)
        keep = share(req.return_output_bytes, 2, self.settings.max_response_output_bytes)
        files = {name: encode(data) for name, data in res.files.items()}
        return ExecuteResponse(
            status=cast(ExecStatus, res.status), exit_code=res.exit_code, wall_s=res.wall_s, cpu_s=res.cpu_s,
            peak_memory_mb=res.peak_memory_mb,
            files={name: text for name, (text, _) in files.items()},
            file_encodings={name: encoding for name, (_, encoding) in files.items()},
            **_streams(returned_stdout(res.stdout, res.stdout_raw, keep), returned_stderr(res.stderr, keep)),
        )  # fmt: skip

    async def code_tests(
        self,
        code: str,
        tests: list[dict[str, Any]],
        language: str,
        timeout_s: float | None,
        memory_mb: int | None,
        judge: Any = None,
        keep_bytes: int = SCORE_KEEP_BYTES,
    ) -> list[CodeTestResult]:
        """Every test of one candidate (the last fenced block of a completion) in the sandbox; each result keeps
        `keep_bytes` of each output stream (its head and tail), the judge having seen the whole stdout."""
        from grpo.reward.verifiers.code import extract_code, run_code_tests

        started = time.monotonic()
        if self.sandbox is None:
            return [_failed_test("no sandbox available on this server", keep_bytes)] * len(tests)
        limits = self._limits(timeout_s, memory_mb)
        for test in tests:  # a test's own limits are capped by the server's, as the request's are
            if "timeout_s" in test or "memory_mb" in test:
                own = self._limits(test.get("timeout_s", limits.timeout_s), test.get("memory_mb", limits.memory_mb))
                test.update(timeout_s=own.timeout_s, memory_mb=own.memory_mb)
        program = extract_code(code, language)
        loop = asyncio.get_running_loop()
        sandbox = request_sandbox(self.sandbox)  # starts no test once the request has ended
        try:
            raw = await loop.run_in_executor(
                self.code_threads,
                lambda: run_code_tests(
                    sandbox, program, tests, language, limits.timeout_s, limits.memory_mb, judge, keep_bytes
                ),
            )
        except Exception as exc:
            log.exception("code tests failed in the sandbox machinery")
            return [_failed_test(f"{type(exc).__name__}: {exc}", keep_bytes)] * len(tests)
        results = [
            CodeTestResult(
                verdict=cast(Verdict, r.verdict),
                exit_code=r.exit_code,
                stdout=r.stdout,
                stderr=r.stderr,
                wall_s=r.wall_s,
                detail=r.detail,
                cpu_s=r.cpu_s,
                peak_memory_mb=r.peak_memory_mb,
                stdout_encoding=cast(Encoding, r.stdout_encoding),
                stdout_bytes=r.stdout_bytes,
                stdout_truncated=r.stdout_truncated,
                stderr_bytes=r.stderr_bytes,
                stderr_truncated=r.stderr_truncated,
            )
            for r in raw
        ]
        for r in results:
            metrics.VERDICTS.labels("code", r.verdict).inc()
            if r.verdict == "timeout":
                metrics.SANDBOX_KILLS.labels("sandbox").inc()
        metrics.VERIFIER_SECONDS.labels("code").observe(time.monotonic() - started)
        return results

    def start_batch(self, items: Sequence[ScoreItem], deadline: float) -> ScoreBatch:
        return ScoreBatch(self, items, deadline)

    def plugin_problems(self) -> list[str]:
        """Plug-ins whose every thread is stuck in a call past plugin_timeout_s (they can take no call)."""
        return [why for threads in self.plugin_threads.values() if (why := threads.problem()) is not None]

    def close(self) -> None:
        for threads in self.plugin_threads.values():
            threads.close()


class ScoreBatch:
    """One /v1/score request: batched components (plug-ins, reward model) start once, items await them."""

    def __init__(self, runner: ComponentRunner, items: Sequence[ScoreItem], deadline: float) -> None:
        self.runner, self.deadline = runner, deadline
        self._batched: dict[str, asyncio.Task[dict[str, Judgement]]] = {}
        names = {name for item in items for name in item.checks.plugins}
        for name in names:
            chosen = [item for item in items if name in item.checks.plugins]
            self._batched[name] = asyncio.ensure_future(self._plugin(name, chosen))
        rm_items = [item for item in items if item.checks.reward_model is not None]
        if rm_items:
            self._batched["reward_model"] = asyncio.ensure_future(self._reward_model(rm_items))
        prm_items = [i for i in items if i.checks.steps is not None and i.checks.steps.source == "prm"]
        self._prm_batch: asyncio.Future[dict[str, list[StepJudgement]]] | None = None
        if prm_items:
            self._prm_batch = asyncio.ensure_future(self._prm(prm_items))

    async def _in_thread(self, name: str, fn: Any, ids: list[str], timeout: float) -> dict[str, Judgement]:
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            run = loop.run_in_executor(self.runner.aux_threads, contained(fn))
            judged: list[Judgement] = await asyncio.wait_for(run, timeout)
        except TimeoutError:
            judged = [Judgement(None, "error", f"{name} gave no answer within {timeout:.1f}s")] * len(ids)
        except Exception as exc:  # `contained` made SystemExit and the like Exceptions; our own cancel passes
            judged = [Judgement(None, "error", f"{name} raised {type(exc).__name__}: {exc}")] * len(ids)
        self._count(name, judged, started)
        return dict(zip(ids, judged, strict=True))

    @staticmethod
    def _count(name: str, judged: list[Judgement], started: float) -> None:
        for j in judged:
            metrics.VERDICTS.labels(name, j.status).inc()
        metrics.VERIFIER_SECONDS.labels(name).observe(time.monotonic() - started)

    async def _plugin(self, name: str, items: list[ScoreItem]) -> dict[str, Judgement]:
        """One call for every item that asked for the plug-in, timed from when one of its threads starts it."""
        fn, started = self.runner.plugins[name], time.monotonic()
        prompts, completions = [i.prompt for i in items], [i.completion for i in items]
        kwargs = [i.checks.plugins[name].kwargs for i in items]
        try:
            # Its answer a little before the item's own deadline, so the item reports the plug-in's reason.
            judged = await self.runner.plugin_threads[name].call(
                lambda: run_plugin(fn, prompts, completions, kwargs), self.deadline - 0.05
            )
        except PluginTimeout as exc:
            judged = [Judgement(None, "error", str(exc))] * len(items)
        except Exception as exc:  # run_plugin answers the plug-in's own failures; this is the machinery's
            log.exception("plug-in %s could not be called", name)
            judged = [Judgement(None, "error", f"{name} failed: {type(exc).__name__}: {exc}")] * len(items)
        self._count(name, judged, started)
        return dict(zip([i.id for i in items], judged, strict=True))

    async def _reward_model(self, items: list[ScoreItem]) -> dict[str, Judgement]:
        model = self.runner.reward_model

        def run() -> list[Judgement]:
            scores = model.score([i.prompt for i in items], [i.completion for i in items])
            return [_model_judgement(s, i.checks.reward_model) for s, i in zip(scores, items, strict=True)]

        timeout = self.deadline - time.monotonic()
        return await self._in_thread("reward_model", run, [i.id for i in items], timeout)

    async def _prm(self, items: list[ScoreItem]) -> dict[str, list[StepJudgement]]:
        """Every PRM item of the request in one thread; a failure makes each of its steps an error, never a 0."""
        model, started = self.runner.prm, time.monotonic()
        cuts = {item.id: prm_spans(item) for item in items}

        def run() -> dict[str, list[StepJudgement]]:
            return {item.id: model.score(item.prompt, item.completion, cuts[item.id]) for item in items}

        loop = asyncio.get_running_loop()
        try:
            timeout = self.deadline - time.monotonic()
            judged = await asyncio.wait_for(loop.run_in_executor(self.runner.aux_threads, contained(run)), timeout)
        except TimeoutError:
            why = "the PRM gave no answer before the request's deadline"
        except Exception as exc:
            why = f"the PRM failed: {type(exc).__name__}: {exc}"
        else:
            metrics.VERIFIER_SECONDS.labels("prm").observe(time.monotonic() - started)
            return judged
        metrics.VERIFIER_SECONDS.labels("prm").observe(time.monotonic() - started)
        return {i: [StepJudgement(s, e, None, "error", why) for s, e in cut] for i, cut in cuts.items()}

    async def score_item(self, item: ScoreItem) -> ScoreResult:
        """All of one item's components, combined by the scoring rules."""
        started = time.monotonic()
        checks, runner = item.checks, self.runner
        judged: dict[str, Judgement] = {}
        waits: dict[str, Any] = {}
        if checks.math is not None:
            options = checks.math.math_options()
            if checks.format is not None:  # the answer is in the format's answer block, renamed or not
                options = dataclasses.replace(options, answer_tag=checks.format.answer_tag)
            waits["math"] = runner.math(item.completion, checks.math.gold, self.deadline, options)
        if checks.code is not None:
            tests = [code_test_dict(t) for t in checks.code.tests]
            code = checks.code
            waits["code"] = runner.code_tests(item.completion, tests, code.language, code.timeout_s, None, code.judge())
        if checks.format is not None:
            f = checks.format
            judged["format"] = format_reward(item.completion, f.think_tag, f.answer_tag, f.think_prefilled)
        if checks.language is not None:
            think_tag = checks.format.think_tag if checks.format else "think"
            judged["language"] = language_reward(item.completion, checks.language.target, item.prompt, think_tag)
        if checks.overlong is not None:
            o = checks.overlong
            judged["overlong"] = overlong_reward(item.completion, o.max_tokens, o.buffer_tokens, o.completion_tokens)
        for name in [*checks.plugins, *(["reward_model"] if checks.reward_model is not None else [])]:
            waits[name] = self._batched[name]
        done = await asyncio.gather(*waits.values())
        for name, value in zip(waits, done, strict=True):
            if name == "math":
                judged[name] = math_judgement(value)
            elif name == "code":
                judged[name] = code_judgement(value, checks.code.partial_credit if checks.code else True)
            else:
                judged[name] = value[item.id]
        for name in ("format", "language", "overlong"):
            if name in judged:
                metrics.VERDICTS.labels(name, judged[name].status).inc()
        ordered = {name: judged[name] for name in checks.names()}
        steps = await self._steps(item) if checks.steps is not None else None
        return combine(item.id, ordered, item.weights, time.monotonic() - started, steps)

    async def _steps(self, item: ScoreItem) -> list[StepJudgement]:
        """The item's step scores: a rule inline (pure and fast), the PRM in its batch."""
        steps = item.checks.steps
        assert steps is not None
        if steps.source == "rule":
            try:
                judged = STEP_RULES[steps.rule](item.prompt, item.completion)
            except Exception as exc:  # a bug in a rule is the machinery's failure, never a 0
                log.exception("step rule %s failed", steps.rule)
                judged = [StepJudgement(0, len(item.completion), None, "error", f"{type(exc).__name__}: {exc}")]
        elif steps.source == "cut":  # boundaries only (VinePPO estimates values at them)
            judged = [StepJudgement(start, end, None, "cut") for start, end in prm_spans(item)]
        else:
            assert self._prm_batch is not None
            judged = (await self._prm_batch)[item.id]
        for j in judged:
            metrics.VERDICTS.labels("steps", j.status).inc()
        return judged

    def cancel(self) -> None:
        for task in self._batched.values():
            task.cancel()
        if self._prm_batch is not None:
            self._prm_batch.cancel()


def _streams(out: Returned, err: Returned) -> dict[str, Any]:
    """A response's output fields from the two streams as returned."""
    return {
        "stdout": out.text, "stdout_encoding": out.encoding, "stdout_bytes": out.total,
        "stdout_truncated": out.truncated, "stderr": err.text, "stderr_bytes": err.total,
        "stderr_truncated": err.truncated,
    }  # fmt: skip


def _cut_by_deadline(res: Any, limits: Any, asked: Any) -> bool:
    """A run that timed out under `limits` was stopped by the request's deadline, not by its own `asked` limits:
    the deadline had shortened its wall-clock limit, and it did not use up the CPU time it asked for."""
    return limits.wall_s < asked.wall_s and (limits.timeout_s < asked.timeout_s or res.cpu_s < limits.timeout_s)


def _failed_run(why: str) -> ExecuteResponse:
    """A run the sandbox could not make, with why on stderr."""
    return ExecuteResponse(
        status="sandbox_error", **_streams(returned_stdout("", None, 0), returned_stderr(why, 1 << 20))
    )


def _failed_test(why: str, keep: int) -> CodeTestResult:
    """A test the sandbox could not run, with why on stderr."""
    err = returned_stderr(why, keep)
    return CodeTestResult(
        verdict="sandbox_error", stderr=err.text, stderr_bytes=err.total, stderr_truncated=err.truncated
    )


def _model_judgement(logit: float, check: RewardModelCheck | None) -> Judgement:
    """A reward model's logit, normalised as the item's check asks (the detail keeps the logit); nan or ±inf (a
    broken forward pass) fails that item, never reaches the sum."""
    if not math.isfinite(logit):
        return Judgement(None, "error", f"reward model returned {logit}")
    check = check or RewardModelCheck()
    score = normalized(logit, check.normalize, check.shift, check.scale)
    if not math.isfinite(score):  # a finite logit over a tiny scale: the item's settings, said as such
        return Judgement(None, "error", f"(logit {logit:.9g} - shift) / scale {check.scale:g} is {score}")
    return Judgement(score, "ok", f"logit {logit:.9g}")


def prm_spans(item: ScoreItem) -> list[tuple[int, int]]:
    """The steps a PRM scores (or a plain cut gives): the item's spans, else its delimiter's cut (default: lines)."""
    steps = item.checks.steps
    assert steps is not None
    if steps.spans is not None:
        return [(span.start, span.end) for span in steps.spans]
    return cut_at(item.completion, steps.delimiter or "\n")
