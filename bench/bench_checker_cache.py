"""A testlib checker sent again: what the second /v1/verify/code request with the same C++ checker costs against the
first, through a real reward service (build_cache.py keeps built checkers and programs between requests).

For each of `--variants` distinct checkers (the same testlib checker with a different trailing comment, so each is
a new build), one request (a new checker: built) then another with the same checker and another Python
submission (kept: not built), timed by the client. The same pairs go to a second service started with
`--checker-cache-entries 0 --program-cache-entries 0` (every request builds, as before the cache), in the same
run, so that the ratio is read against the old cost on the same machine at the same time. Then a C++ submission
sent twice with a kept checker (the program cache). /metrics confirms how many builds each service made.
Writes bench/results/checker_cache.json. Target: warm / cold < 0.25.
Run: .venv/bin/python bench/bench_checker_cache.py [--variants 3] [--tests 10]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from grpo.local.services import ServiceProc, start_reward

RESULTS = Path(__file__).parent / "results" / "checker_cache.json"
log = logging.getLogger("bench_checker_cache")
CHECKER = """#include "testlib.h"
int main(int argc, char* argv[]) {
    registerTestlibCmd(argc, argv);
    long long n = inf.readLong();
    long long a = ouf.readLong(0, n, "a"), b = ouf.readLong(0, n, "b");
    if (a + b != n) quitf(_wa, "%lld + %lld != %lld", a, b, n);
    quitf(_ok, "n = %lld", n);
}
"""
PYTHON = ["n = int(input())\nprint(n // 2, n - n // 2)", "n = int(input())\nprint(0, n)"]
CPP = "#include <bits/stdc++.h>\nint main(){ long long n; std::cin >> n; std::cout << n / 2 << ' ' << n - n / 2; }"


def timed(url: str, code: str, checker: str, tests: int, language: str = "python") -> float:
    """Seconds of one /v1/verify/code request (every test must pass)."""
    body = {
        "code": code, "language": language, "checker": {"language": "cpp", "code": checker},
        "tests": [{"stdin": f"{n}\n", "expected_stdout": f"0 {n}"} for n in range(10, 10 + tests)],
    }  # fmt: skip
    started = time.perf_counter()
    reply = httpx.post(f"{url}/v1/verify/code", json=body, timeout=300)
    elapsed = time.perf_counter() - started
    reply.raise_for_status()
    passed = reply.json()["passed"]
    if passed != tests:
        raise RuntimeError(f"{passed} of {tests} passed: {reply.text[:500]}")
    return elapsed


def build_counts(url: str) -> dict[str, float]:
    """grpo_reward_build_cache_total by "kind/outcome"."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    line = re.compile(r'^grpo_reward_build_cache_total\{kind="(\w+)",outcome="(\w+)"\} (\S+)$', re.MULTILINE)
    return {f"{kind}/{outcome}": float(value) for kind, outcome, value in line.findall(text)}


def pairs(service: ServiceProc, variants: int, tests: int, tag: str) -> list[dict[str, float]]:
    """(cold, warm) seconds per checker variant: a new checker, then the same with another submission."""
    out = []
    for i in range(variants):
        checker = f"{CHECKER}// {tag} variant {i} {time.time_ns()}\n"
        cold = timed(service.http_url, PYTHON[0], checker, tests)
        warm = timed(service.http_url, PYTHON[1], checker, tests)
        log.info("%s variant %d: first %.2f s, second %.2f s", tag, i, cold, warm)
        out.append({"first_s": round(cold, 3), "second_s": round(warm, 3), "ratio": round(warm / cold, 4)})
    return out


def program_pair(service: ServiceProc, tests: int) -> dict[str, float]:
    """A C++ submission sent twice with an already-kept checker: the program's own build, then none."""
    checker = f"{CHECKER}// program-cache {time.time_ns()}\n"
    timed(service.http_url, PYTHON[0], checker, tests)  # the checker is kept from here on
    code = f"{CPP}\n// {time.time_ns()}\n"
    first = timed(service.http_url, code, checker, tests, "cpp")
    second = timed(service.http_url, code, checker, tests, "cpp")
    return {"first_s": round(first, 3), "second_s": round(second, 3), "ratio": round(second / first, 4)}


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    return {
        "first_median_s": round(statistics.median(r["first_s"] for r in rows), 3),
        "second_median_s": round(statistics.median(r["second_s"] for r in rows), 3),
        "ratio_median": round(statistics.median(r["ratio"] for r in rows), 4),
        "ratio_max": round(max(r["ratio"] for r in rows), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", type=int, default=3, help="distinct checkers (each one cold + one warm request)")
    parser.add_argument("--tests", type=int, default=10, help="tests per request")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    report: dict[str, Any] = {"benchmark": "second request with the same testlib checker vs the first"}
    for name, flags in (("cached", ()), ("uncached", ("--checker-cache-entries", "0", "--program-cache-entries", "0"))):
        service = start_reward("--log-level", "WARNING", *flags, workers=args.workers)
        try:
            rows = pairs(service, args.variants, args.tests, name)
            section: dict[str, Any] = {"flags": list(flags), "pairs": rows, **summary(rows)}
            if name == "cached":
                section["cpp_program_twice"] = program_pair(service, args.tests)
            section["builds"] = build_counts(service.http_url)
        finally:
            service.stop()
            service.log_path.unlink(missing_ok=True)
        report[name] = section
    cached, uncached = report["cached"], report["uncached"]
    report.update(
        ratio_second_vs_first=cached["ratio_median"],
        ratio_second_vs_first_without_cache=uncached["ratio_median"],
        target_ratio=0.25,
        tests_per_request=args.tests,
        workers=args.workers,
        cpu_count=os.cpu_count(),
        load_avg_1m=round(os.getloadavg()[0], 2),
        python=platform.python_version(),
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if cached["ratio_max"] < 0.25 else 1


if __name__ == "__main__":
    sys.exit(main())
