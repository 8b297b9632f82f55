"""Per-language sandbox cost: a hello-world run and a run with work (summing 200,000 numbers from stdin) against
the same built program run bare, each alone and as a batch of 50 (one namespace for all, as a submission's tests
are judged), and a contest-style problem built once and judged on 50 tests.

The bare reference builds and runs the same source with the same toolchain and flags outside the sandbox, in the
same process, interleaved with the sandboxed runs, each timed run started on a quiet machine (a zygote prepares
its next run after each reply). So is an A/B of a single run's PID 1, in a pass of its own (`*_python_init_ratio`:
a second sandbox whose runs start from the forked Python init, as where init.c cannot be built and as before
2026-12-04's third change). Writes bench/results/languages.json:
    .venv/bin/python bench/bench_languages.py [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo.reward.sandbox import Limits, Sandbox, make_sandbox, namespace
from grpo.reward.sandbox.base import ExecResult
from grpo.reward.sandbox.languages import TOOLCHAINS, Launch, argv_for, build, run_launch
from grpo.reward.sandbox.namespace import RUN_ENV
from grpo.reward.verifiers.code import run_code_tests

RESULTS = Path(__file__).parent / "results" / "languages.json"
log = logging.getLogger("bench_languages")
HELLO = {
    "c": '#include <stdio.h>\nint main(){ puts("hi"); return 0; }',
    "cpp": '#include <iostream>\nint main(){ std::cout << "hi" << std::endl; }',
    "java": 'public class Main{public static void main(String[] a){System.out.println("hi");}}',
    "javascript": 'console.log("hi");',
    "typescript": 'const greeting: string = "hi"; console.log(greeting);',
    "go": 'package main\nimport "fmt"\nfunc main(){ fmt.Println("hi") }',
    "rust": 'fn main(){ println!("hi"); }',
    "bash": "echo hi",
}
SUM = {  # read n numbers, print their sum
    "c": '#include <stdio.h>\nint main(){ long n, x, s = 0; scanf("%ld", &n); while (n--) { scanf("%ld", &x); s += x; }'
    ' printf("%ld\\n", s); }',
    "cpp": "#include <bits/stdc++.h>\nint main(){ long n, x, s = 0; std::cin >> n; while (n--) { std::cin >> x; s += x; }"
    " std::cout << s << std::endl; }",
    "java": "import java.util.*;\npublic class Main{public static void main(String[] a){Scanner sc=new Scanner(System.in);"
    "long n=sc.nextLong(), s=0; while(n-->0) s+=sc.nextLong(); System.out.println(s);}}",
    "javascript": 'const v=require("fs").readFileSync(0,"utf8").trim().split(/\\s+/).map(Number);'
    "console.log(v.slice(1).reduce((a,b)=>a+b,0));",
    "typescript": 'const v: number[] = require("fs").readFileSync(0,"utf8").trim().split(/\\s+/).map(Number);'
    "console.log(v.slice(1).reduce((a,b)=>a+b,0));",
    "go": 'package main\nimport ("bufio"; "fmt"; "os")\nfunc main(){ r := bufio.NewReader(os.Stdin); var n, x, s int64;'
    " fmt.Fscan(r, &n); for i := int64(0); i < n; i++ { fmt.Fscan(r, &x); s += x }; fmt.Println(s) }",
    "rust": "use std::io::*;\nfn main(){ let mut t = String::new(); stdin().read_to_string(&mut t).unwrap();"
    ' let v: Vec<i64> = t.split_whitespace().map(|x| x.parse().unwrap()).collect(); println!("{}", v[1..].iter().sum::<i64>()); }',
    "bash": "read n; s=0; for ((i=0;i<n;i++)); do read x; s=$((s+x)); done; echo $s",
}


def bare_argv(language: str, folder: Path, tools: dict[str, str]) -> list[str]:
    """Build `folder`'s source with the sandbox's own compile line, outside the sandbox; the argv that runs it."""
    chain = TOOLCHAINS[language]
    if chain.compile:
        subprocess.run(argv_for(chain.compile, tools, 256), cwd=folder, check=True, capture_output=True)
    argv = argv_for(chain.run, tools, 256)
    return [str(folder / argv[0][2:]) if argv[0].startswith("./") else argv[0], *argv[1:]]


N = 200_000


def python_init_sandbox() -> Sandbox:
    """A sandbox whose single runs start from the forked Python init (no init.c): the A/B reference."""
    found = namespace.init_program
    namespace.init_program = lambda: None
    try:
        return make_sandbox(workers=1)
    finally:
        namespace.init_program = found


QUIET_S = 0.003  # before each timed run: a zygote prepares its next run after a reply, and that must not load the next


def interleaved(
    runs: int, argv: list[str], folder: Path, sandbox: Sandbox, launch: Launch, stdin: str
) -> tuple[list[float], list[float]]:
    """Bare runs and runs in `sandbox` in turn, so the machine's noise hits both alike, each started on a quiet
    machine; the bare ones get the sandbox's env."""
    limits = Limits(timeout_s=10.0, memory_mb=256)
    bare_ms: list[float] = []
    boxed_ms: list[float] = []
    for _ in range(runs):
        time.sleep(QUIET_S)
        started = time.perf_counter()
        subprocess.run(argv, cwd=folder, input=stdin, env=RUN_ENV, capture_output=True, text=True, check=True)
        bare_ms.append((time.perf_counter() - started) * 1000)
        time.sleep(QUIET_S)
        started = time.perf_counter()
        result: ExecResult = sandbox.execute(launch, stdin, limits)
        boxed_ms.append((time.perf_counter() - started) * 1000)
        assert result.status == "ok", result
    return bare_ms, boxed_ms


def ratio(pair: tuple[list[float], list[float]]) -> float:
    """Median sandboxed over median bare."""
    return round(statistics.median(pair[1]) / statistics.median(pair[0]), 3)


BATCH = 50


def batched(
    rounds: int, argv: list[str], folder: Path, sandbox: Sandbox, launch: Launch, stdin: str
) -> tuple[list[float], list[float]]:
    """Per-run ms of BATCH bare runs in a row and of one batch of BATCH sandboxed runs, `rounds` times in turn."""
    limits = Limits(timeout_s=10.0, memory_mb=256)
    bare_ms, boxed_ms = [], []
    for _ in range(rounds):
        time.sleep(QUIET_S)
        started = time.perf_counter()
        for _ in range(BATCH):
            subprocess.run(argv, cwd=folder, input=stdin, env=RUN_ENV, capture_output=True, text=True, check=True)
        bare_ms.append((time.perf_counter() - started) * 1000 / BATCH)
        time.sleep(QUIET_S)
        started = time.perf_counter()
        results = list(sandbox.execute_many(launch, [stdin] * BATCH, limits))
        boxed_ms.append((time.perf_counter() - started) * 1000 / BATCH)
        assert all(r.status == "ok" for r in results), results[0]
    return bare_ms, boxed_ms


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sandbox, python_init = make_sandbox(workers=1), python_init_sandbox()
    limits = Limits(timeout_s=10.0, memory_mb=256)
    out: dict[str, Any] = {"runs": args.runs, "languages": {}}
    try:
        for language, source in HELLO.items():
            tools = sandbox.languages[language]
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                (folder / TOOLCHAINS[language].source).write_text(source)
                argv = bare_argv(language, folder, tools)
                build_ms = timed(lambda: build(sandbox, language, source))  # noqa: B023 - used at once
                _, built = build(sandbox, language, source)
                launch = run_launch(language, source, tools, limits.memory_mb, built)
                bare_ms, boxed_ms = interleaved(args.runs, argv, folder, sandbox, launch, "")
                old = interleaved(args.runs, argv, folder, python_init, launch, "")
                batch_bare, batch_boxed = batched(max(3, args.runs // 6), argv, folder, sandbox, launch, "")
                (folder / TOOLCHAINS[language].source).write_text(SUM[language])
                argv = bare_argv(language, folder, tools)
                _, built = build(sandbox, language, SUM[language])
                work = run_launch(language, SUM[language], tools, limits.memory_mb, built)
                big = f"{N}\n" + "\n".join(str(i) for i in range(N)) + "\n"
                work_bare, work_boxed = interleaved(max(5, args.runs // 3), argv, folder, sandbox, work, big)
                work_old = interleaved(max(5, args.runs // 3), argv, folder, python_init, work, big)
                small = f"{N // 100}\n" + "\n".join(str(i) for i in range(N // 100)) + "\n"
                small_bare, small_boxed = batched(max(3, args.runs // 6), argv, folder, sandbox, work, small)
            tests = [{"stdin": f"{k}\n" + "\n".join(str(i) for i in range(k)), "expected_stdout": str(k * (k - 1) // 2)}
                     for k in range(1, 51)]  # fmt: skip
            started = time.perf_counter()
            results = run_code_tests(sandbox, SUM[language], tests, language, timeout_s=10.0, memory_mb=256)
            judge_s = time.perf_counter() - started
            bare_med, boxed_med = statistics.median(bare_ms), statistics.median(boxed_ms)
            out["languages"][language] = {
                "hello_bare_ms": round(bare_med, 2),
                "hello_sandbox_ms": round(boxed_med, 2),
                "hello_overhead_ms": round(boxed_med - bare_med, 2),
                "hello_ratio": round(boxed_med / bare_med, 3),
                "hello_python_init_ratio": ratio(old),
                "hello_batch_bare_ms": round(statistics.median(batch_bare), 3),
                "hello_batch_sandbox_ms": round(statistics.median(batch_boxed), 3),
                "hello_batch_ratio": round(statistics.median(batch_boxed) / statistics.median(batch_bare), 3),
                "small_batch_bare_ms": round(statistics.median(small_bare), 3),
                "small_batch_sandbox_ms": round(statistics.median(small_boxed), 3),
                "small_batch_ratio": round(statistics.median(small_boxed) / statistics.median(small_bare), 3),
                "work_bare_ms": round(statistics.median(work_bare), 1),
                "work_sandbox_ms": round(statistics.median(work_boxed), 1),
                "work_ratio": round(statistics.median(work_boxed) / statistics.median(work_bare), 3),
                "work_python_init_ratio": ratio(work_old),
                "build_ms": round(build_ms, 1),
                "build_plus_50_tests_s": round(judge_s, 3),
                "tests_passed": sum(r.verdict == "pass" for r in results),
            }
            log.info("%s %s", language, json.dumps(out["languages"][language]))
    finally:
        sandbox.close()
        python_init.close()
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
