"""Builds kept between requests (sandbox/build_cache.py): one build per (language, source, toolchain), one at a
time per key however many requests want it, bounded by count and bytes, and compile errors kept only briefly.

A fake builder counts builds: no compiler runs here (tests/service/test_reward_checker_cache.py builds a real
testlib checker through the service)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo.reward.sandbox import ExecResult, Limits, Sandbox
from grpo.reward.sandbox.build_cache import BuildCache, BuildCaches, Outcome, keep_for
from grpo.reward.sandbox.languages import Launch
from grpo.reward.verifiers.code import Checker, Judge, run_code_tests

CHECKER = '#include "testlib.h"\nint main(int c, char** v){ registerTestlibCmd(c, v); quitf(_ok, "ok"); }\n'


class Box:
    """What a cache reads of a sandbox: its toolchains' paths."""

    def __init__(self, tools: dict[str, dict[str, str]]) -> None:
        self.languages = tools


class Builder:
    """A build that takes `delay_s` and answers `outcome` (by default a fresh artifact per build)."""

    def __init__(self, delay_s: float = 0.0, outcome: Outcome | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.delay_s, self.outcome = delay_s, outcome
        self._lock = threading.Lock()

    def __call__(self, sandbox: Any, language: str, code: str) -> Outcome:
        with self._lock:
            self.calls.append((language, code))
        time.sleep(self.delay_s)
        return self.outcome or (None, {"main": bytes(1000) + code.encode()})


@pytest.fixture
def compiler(tmp_path: Path) -> Path:
    tool = tmp_path / "g++"
    tool.write_text("#!/bin/sh\n")
    return tool


@pytest.fixture
def box(compiler: Path) -> Any:  # what the cache reads of a Sandbox
    return Box({"cpp": {"g++": str(compiler)}, "python": {"python3": "/usr/bin/python3"}})


def counted(cache_kw: dict[str, Any] | None = None, **builder_kw: Any) -> tuple[BuildCache, Builder, list[str]]:
    seen: list[str] = []
    builder = Builder(**builder_kw)
    kw = {"max_entries": 8, "max_bytes": 1 << 20, **(cache_kw or {})}
    return BuildCache(builder=builder, on_lookup=seen.append, **kw), builder, seen


def test_concurrent_requests_for_a_new_checker_build_it_once(box: Any) -> None:
    """Eight requests with the same checker at once: one build, and all share its very artifacts (the same bytes
    objects, which the workers' Held then keeps instead of receiving again)."""
    cache, builder, seen = counted(delay_s=0.3)
    start = threading.Barrier(8)
    got: list[Outcome] = []

    def request() -> None:
        start.wait()
        got.append(cache.build(box, "cpp", CHECKER))

    threads = [threading.Thread(target=request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builder.calls) == 1 and cache.builds == 1
    assert seen.count("miss") == 1 and seen.count("shared") + seen.count("hit") == 7, seen
    assert all(outcome[1]["main"] is got[0][1]["main"] for outcome in got)
    assert cache.build(box, "cpp", CHECKER)[1]["main"] is got[0][1]["main"]
    assert seen[-1] == "hit" and len(builder.calls) == 1


def test_another_source_or_toolchain_is_another_build(box: Any, compiler: Path, tmp_path: Path) -> None:
    cache, builder, _ = counted()
    cache.build(box, "cpp", CHECKER)
    cache.build(box, "cpp", CHECKER)
    assert len(builder.calls) == 1
    cache.build(box, "cpp", CHECKER + "// another\n")
    assert len(builder.calls) == 2
    # The compiler upgraded in place, under the same path: its mtime (and size) changed.
    compiler.write_text("#!/bin/sh\n# 13.2\n")
    os.utime(compiler, ns=(time.time_ns(), time.time_ns() + 10**9))
    cache.build(box, "cpp", CHECKER)
    assert len(builder.calls) == 3
    cache.build(box, "cpp", CHECKER)
    assert len(builder.calls) == 3
    # Another compiler's path (a sandbox configured with another toolchain).
    other = tmp_path / "g++-13"
    other.write_bytes(compiler.read_bytes())
    cache.build(Box({"cpp": {"g++": str(other)}}), "cpp", CHECKER)
    assert len(builder.calls) == 4


def test_the_lru_evicts_by_count_and_by_bytes(box: Any) -> None:
    evicted: list[None] = []
    cache = BuildCache(3, 10_000, builder=Builder(), on_evict=lambda: evicted.append(None))
    for i in range(3):
        cache.build(box, "cpp", f"// {i}")
    cache.build(box, "cpp", "// 0")  # 0 is now the most recent: 1 goes next
    cache.build(box, "cpp", "// 3")
    assert len(cache) == 3 and len(evicted) == 1
    builds = cache.builds
    cache.build(box, "cpp", "// 0")
    assert cache.builds == builds  # kept
    cache.build(box, "cpp", "// 1")
    assert cache.builds == builds + 1  # evicted, built again
    # By bytes: ~1 KB each, 2.5 KB allowed.
    small = BuildCache(100, 2500, builder=Builder())
    for i in range(5):
        small.build(box, "cpp", f"// {i}")
    assert len(small) == 2 and small.size <= 2500
    # An artifact larger than the whole budget is returned, never kept.
    huge = BuildCache(100, 500, builder=Builder())
    assert huge.build(box, "cpp", "// big")[1]
    assert len(huge) == 0 and huge.size == 0


def test_a_compile_error_is_kept_briefly_and_a_killed_build_not_at_all(box: Any) -> None:
    now = [1000.0]
    rejected = ExecResult("compile_error", 1, "", "main.cpp:1: error: 'x' was not declared", 0.1)
    builder = Builder(outcome=(rejected, {}))
    cache = BuildCache(8, 1 << 20, error_ttl_s=60.0, builder=builder, clock=lambda: now[0])
    assert cache.build(box, "cpp", "x")[0] is rejected
    now[0] += 59
    assert cache.build(box, "cpp", "x")[0] is rejected
    assert len(builder.calls) == 1
    now[0] += 2
    cache.build(box, "cpp", "x")
    assert len(builder.calls) == 2  # expired: built again
    for failure in (
        ExecResult("compile_error", None, "", "the build hit timeout", 30.0),  # killed at the deadline
        ExecResult("compile_error", -9, "", "", 3.0),  # a signal
        ExecResult("compile_error", 1, "", "g++: fatal error: Killed signal terminated program cc1plus", 9.0),
        ExecResult("sandbox_error", None, "", "sandbox failure: zygote exited", 0.0),
    ):
        assert keep_for((failure, {}), 60.0) is None, failure
    assert keep_for((rejected, {}), 0.0) is None  # build_error_cache_s 0: not kept
    assert keep_for((None, {}), 60.0) is None  # a build that produced nothing


def test_a_build_that_raises_is_shared_then_forgotten(box: Any) -> None:
    calls: list[int] = []
    release = threading.Event()

    def failing(sandbox: Any, language: str, code: str) -> Outcome:
        calls.append(1)
        release.wait(5)
        raise ValueError("the code holds a lone surrogate")

    cache = BuildCache(8, 1 << 20, builder=failing)
    errors: list[BaseException] = []

    def request() -> None:
        try:
            cache.build(box, "cpp", "x")
        except ValueError as exc:
            errors.append(exc)

    first = threading.Thread(target=request)
    first.start()
    while not calls:
        time.sleep(0.01)
    second = threading.Thread(target=request)
    second.start()
    time.sleep(0.1)
    release.set()
    first.join()
    second.join()
    assert len(errors) == 2 and len(calls) == 1
    with pytest.raises(ValueError):
        cache.build(box, "cpp", "x")
    assert len(calls) == 2  # not kept: built (tried) again


def test_interpreted_languages_and_zero_entries_keep_nothing(box: Any) -> None:
    cache, builder, seen = counted()
    cache.build(box, "python", "print(1)")
    assert seen == [] and len(cache) == 0 and len(builder.calls) == 1  # passed through: nothing kept, not counted
    off, off_builder, _ = counted({"max_entries": 0})
    off.build(box, "cpp", CHECKER)
    off.build(box, "cpp", CHECKER)
    assert len(off_builder.calls) == 2 and len(off) == 0


class FakeSandbox(Sandbox):
    """Builds answer an artifact, runs print 3, checkers accept: run_code_tests without a compiler."""

    def __init__(self) -> None:
        self.languages = {"python": {"python3": "/usr/bin/python3"}, "cpp": {"g++": "/usr/bin/g++"}}
        self.compiles = 0

    def execute(
        self, launch: Launch, stdin: str = "", limits: Limits | None = None, cancel: threading.Event | None = None
    ) -> ExecResult:
        if launch.collect:
            self.compiles += 1
            return ExecResult("ok", 0, "", "", 1.0, files={"main": bytes(20_000)})
        return ExecResult("ok", 0, "3\n", "", 0.01)

    def close(self) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[FakeSandbox]:
    box = FakeSandbox()
    box.build_caches = BuildCaches(BuildCache(8, 1 << 20), BuildCache(8, 1 << 20))
    yield box


def test_run_code_tests_builds_a_checker_and_a_program_once_across_requests(fake: FakeSandbox) -> None:
    judge = Judge(checker=Checker("cpp", CHECKER))
    tests = [{"stdin": "1 2", "expected_stdout": "3"}] * 3
    for _ in range(3):
        results = run_code_tests(fake, "print(3)", tests, "python", judge=judge)
        assert [r.verdict for r in results] == ["pass"] * 3
    assert fake.compiles == 1  # the checker, once for the three requests
    program = '#include <cstdio>\nint main(){ puts("3"); }'
    for _ in range(2):
        run_code_tests(fake, program, tests, "cpp", judge=judge)
    assert fake.compiles == 2  # the C++ program once; the checker still kept
    fake.build_caches = None
    run_code_tests(fake, program, tests, "cpp", judge=judge)
    assert fake.compiles == 4  # a sandbox without caches builds each time, as before
