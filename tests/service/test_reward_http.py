"""The reward service over HTTP: every endpoint's happy path, bad input as 4xx, health, metrics, docs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.readme_examples import mismatches, verifier_examples

BLOWUP = "\\boxed{\\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}}"
# Two weights of 1e308 on an item that passes both checks summed to infinity: a null reward with no reason.
HUGE_WEIGHTS = {
    "id": "a",
    "completion": "<think>t</think><answer>4</answer>",
    "checks": {"math": {"gold": "4"}, "format": {}},
    "weights": {"math": 1e308, "format": 1e308},
}


def post(service: Any, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{service.http_url}{path}", json=body, timeout=60, **kwargs)


def test_health_docs_openapi(live_reward: Any) -> None:
    health = httpx.get(f"{live_reward.http_url}/healthz", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["workers"] == 2
    assert httpx.get(f"{live_reward.http_url}/docs", timeout=5).status_code == 200
    paths = httpx.get(f"{live_reward.http_url}/openapi.json", timeout=5).json()["paths"]
    assert {"/v1/verify/math", "/v1/execute", "/v1/verify/code", "/v1/score"} <= set(paths)


def test_the_readme_examples_answer_as_documented(live_reward: Any) -> None:
    examples = verifier_examples()
    assert [path for path, _, _ in examples] == ["/v1/verify/math", "/v1/execute", "/v1/verify/code", "/v1/score"]
    for path, body, expected in examples:
        assert len(expected) >= 2, (path, expected)  # the README shows what comes back
        reply = post(live_reward, path, body)
        assert reply.status_code == 200, reply.text
        assert not mismatches(reply.json(), expected), (path, reply.json(), expected)


@pytest.mark.parametrize(
    ("answer", "gold", "status", "correct"),
    [
        ("so the answer is \\boxed{\\frac12}", "0.5", "correct", True),
        ("<think>hmm</think><answer>7</answer>", "6", "incorrect", False),
        ("\\boxed{\\frac{1}{2^{98}}}", "\\frac{1}{2^{99}}", "incorrect", False),
        ("no answer here", "\\frac{1}{2}", "unparseable_answer", False),  # the model gave no answer: wrong
        ("\\boxed{1}", "", "unparseable_gold", None),
    ],
)
def test_verify_math(live_reward: Any, answer: str, gold: str, status: str, correct: bool | None) -> None:
    r = post(live_reward, "/v1/verify/math", {"answer": answer, "gold": gold})
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["correct"]) == (status, correct)


def test_math_blowup_is_stopped_at_its_limit_and_service_recovers(live_reward: Any) -> None:
    # timeout_s is the verification's own limit, from its start; the request's deadline leaves time to check the
    # gold alone, as in /v1/score: it verifies, so the blow-up is the answer's doing (a 0), whatever the load.
    r = post(live_reward, "/v1/verify/math", {"answer": BLOWUP, "gold": "5", "timeout_s": 1.0})
    assert r.status_code == 200 and (r.json()["status"], r.json()["correct"]) == ("incorrect", False), r.text
    assert "no result within 1s" in r.json()["detail"] and "the answer's doing" in r.json()["detail"], r.text
    assert r.json()["wall_s"] < 3.0
    ok = post(live_reward, "/v1/verify/math", {"answer": "\\boxed{5}", "gold": "5"})
    assert ok.json()["status"] == "correct"


def test_execute(live_reward: Any) -> None:
    r = post(live_reward, "/v1/execute", {"language": "python", "code": "print(input()[::-1])", "stdin": "abc"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ok" and r.json()["stdout"].strip() == "cba" and r.json()["exit_code"] == 0
    err = post(live_reward, "/v1/execute", {"code": "raise SystemExit(3)"})
    assert err.json()["status"] == "runtime_error" and err.json()["exit_code"] == 3
    slow = post(live_reward, "/v1/execute", {"code": "while True: pass", "timeout_s": 0.5})
    assert slow.json()["status"] == "timeout"


def test_verify_code(live_reward: Any) -> None:
    completion = (
        "Here you go:\n```python\nimport sys\n\ndef add(a, b):\n    return a + b\n\n"
        "args = sys.stdin.read().split()\nif args:\n    print(add(*map(int, args)))\n```"
    )
    body = {
        "code": completion,
        "tests": [
            {"stdin": "1 2", "expected_stdout": "3"},
            {"stdin": "2 2", "expected_stdout": "5\n"},
            {"assert": "assert add(2, 3) == 5"},
            {"assert": "import sys; sys.exit(0)\nassert add(1, 1) == 3"},
        ],
    }
    r = post(live_reward, "/v1/verify/code", body)
    assert r.status_code == 200, r.text
    verdicts = [t["verdict"] for t in r.json()["tests"]]
    assert verdicts[:3] == ["pass", "fail", "pass"]
    assert verdicts[3] != "pass", "exit(0) before the asserts must not pass"
    assert (r.json()["passed"], r.json()["total"]) == (2, 4)


def test_verify_code_judges_unittest_and_pytest_tests_as_those_tools_do(live_reward: Any) -> None:
    """Tests written for unittest (`unittest.main()`) or pytest (uncalled `def test_*`, KodCode's `from solution
    import`), through the API as a user sends them: the right function passes, a wrong one or an object that equals
    anything fails. Before, unittest.main() failed every answer and an uncalled pytest function passed every one."""
    unittest_tests = (
        "import unittest\n\nclass T(unittest.TestCase):\n    def test_add(self):\n"
        "        self.assertEqual(add(1, 2), 3)\n\nif __name__ == '__main__':\n    unittest.main()\n"
    )
    pytest_tests = "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    answers = {
        "right": "def add(a, b):\n    return a + b\n",
        "wrong": "def add(a, b):\n    return a - b\n",
        "always equal": "class E:\n    def __eq__(self, o):\n        return True\n\ndef add(a, b):\n    return E()\n",
    }
    verdicts = {}
    for name, code in answers.items():
        body = {"code": code, "tests": [{"assert": unittest_tests}, {"assert": pytest_tests}]}
        r = post(live_reward, "/v1/verify/code", body)
        assert r.status_code == 200, r.text
        verdicts[name] = [t["verdict"] for t in r.json()["tests"]]
    assert verdicts["right"] == ["pass", "pass"], verdicts
    assert "pass" not in verdicts["wrong"] + verdicts["always equal"], verdicts


CPP_SUM = (
    "```cpp\n#include <iostream>\nint main(){ long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }\n```"
)


def test_compiled_languages_through_the_api(live_reward: Any) -> None:
    """C++ built once for three tests, a compile error with the compiler's words, Java and Bash through
    /v1/execute, C++ in /v1/score, and /healthz naming the installed languages."""
    health = httpx.get(f"{live_reward.http_url}/healthz", timeout=5).json()
    assert {"python", "c", "cpp", "java", "javascript", "typescript", "go", "rust", "bash"} <= set(health["languages"])
    tests = [{"stdin": "1 2", "expected_stdout": "3"}, {"stdin": "-5 5", "expected_stdout": "0"},
             {"stdin": "2 2", "expected_stdout": "5"}]  # fmt: skip
    r = post(live_reward, "/v1/verify/code", {"language": "cpp", "code": CPP_SUM, "tests": tests})
    assert r.status_code == 200, r.text
    assert [t["verdict"] for t in r.json()["tests"]] == ["pass", "pass", "fail"]
    assert all(t["cpu_s"] >= 0 and t["peak_memory_mb"] > 0 for t in r.json()["tests"])
    broken = post(live_reward, "/v1/verify/code", {"language": "c", "code": "int main(){ return 0 }", "tests": tests})
    assert {t["verdict"] for t in broken.json()["tests"]} == {"compile_error"}
    assert "expected" in broken.json()["tests"][0]["stderr"]  # gcc's "expected ';' before '}'"
    java = "public class Main{public static void main(String[] a){System.out.println(6*7);}}"
    run = post(live_reward, "/v1/execute", {"language": "java", "code": java})
    assert (run.json()["status"], run.json()["stdout"]) == ("ok", "42\n"), run.text
    bash = post(live_reward, "/v1/execute", {"language": "bash", "code": "read a; echo $((a * 2))", "stdin": "21"})
    assert bash.json()["stdout"] == "42\n"
    item = {"id": "cpp", "completion": CPP_SUM, "checks": {"code": {"language": "cpp", "tests": tests}}}
    scored = post(live_reward, "/v1/score", {"items": [item]}).json()["results"][0]
    assert scored["reward"] == pytest.approx(2 / 3), scored
    asserts = post(live_reward, "/v1/verify/code", {"language": "cpp", "code": CPP_SUM, "tests": [{"assert": "x"}]})
    assert asserts.status_code == 400 and "assert tests are Python code" in asserts.text


def test_files_in_and_out(live_reward: Any) -> None:
    """Files written into the working directory before the run; files the run writes, read back after it."""
    code = (
        '#include <fstream>\nint main(){ std::ifstream in("data.txt"); long a, b; in >> a >> b;'
        ' std::ofstream("sum.txt") << a + b; std::ofstream("note.log") << "done"; }'
    )
    body = {"language": "cpp", "code": code, "files": {"data.txt": "40 2"}, "read_back": ["*.txt"]}
    r = post(live_reward, "/v1/execute", body)
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    assert r.json()["files"] == {"data.txt": "40 2", "sum.txt": "42"}  # note.log does not match the pattern
    clash = post(live_reward, "/v1/execute", {**body, "files": {"main.cpp": "x"}})
    assert clash.status_code == 400 and "the program's own file names" in clash.text
    bad = post(live_reward, "/v1/execute", {**body, "files": {"../escape": "x"}})
    assert bad.status_code == 422


def test_a_file_named_like_a_build_artifact_is_400(live_reward: Any) -> None:
    """Java's build leaves *.class files: a user file matching that pattern would replace the built program."""
    body = {"language": "java", "code": "public class Main { public static void main(String[] a) {} }"}
    clash = post(live_reward, "/v1/execute", {**body, "files": {"Main.class": "junk", "data.txt": "1"}})
    assert clash.status_code == 400, clash.text
    assert "['Main.class'] are the program's own file names in java (*.class, Main.java)" in clash.text
    fine = post(live_reward, "/v1/execute", {**body, "files": {"Main.txt": "1"}})
    assert fine.status_code == 200 and fine.json()["status"] == "ok", fine.text


def test_a_tests_own_limits_are_capped_by_the_server(live_reward: Any) -> None:
    spin = {"code": "while True: pass", "tests": [{"stdin": "", "expected_stdout": "", "timeout_s": 0.5}]}
    r = post(live_reward, "/v1/verify/code", spin)
    assert r.status_code == 200 and r.json()["tests"][0]["verdict"] == "timeout"
    assert r.json()["tests"][0]["wall_s"] < 2.0  # its own 0.5 s, not the request's default
    bad = post(live_reward, "/v1/verify/code", {**spin, "tests": [{"expected_stdout": "", "memory_mb": 1}]})
    assert bad.status_code == 422 and "memory_mb" in bad.text


def test_judge_options_through_the_api(live_reward: Any) -> None:
    """Float tolerance, stop at the first failure, and all-or-nothing scoring, in verify/code and in a score item."""
    code = "```python\nk = int(input())\nprint(1 / k if k != 4 else 0)\n```"
    tests = [{"stdin": str(k), "expected_stdout": f"{1 / k:.9f}"} for k in (2, 3, 4, 5, 6)]
    body = {"code": code, "tests": tests, "compare": "float", "abs_tol": 1e-6, "stop_on_first_failure": True}
    r = post(live_reward, "/v1/verify/code", body)
    assert r.status_code == 200, r.text
    assert [t["verdict"] for t in r.json()["tests"]] == ["pass", "pass", "fail", "skipped", "skipped"]
    bad = post(live_reward, "/v1/verify/code", {**body, "compare": "fuzzy"})
    assert bad.status_code == 422 and "compare" in bad.text
    items = [{"id": f"p{flag}", "completion": code,
              "checks": {"code": {"tests": tests, "compare": "float", "partial_credit": flag}}} for flag in (True, False)]  # fmt: skip
    scores = [res["reward"] for res in post(live_reward, "/v1/score", {"items": items}).json()["results"]]
    assert scores == [pytest.approx(0.8), 0.0]
    # a C++ special judge: any two numbers summing to n are right
    checker = {"language": "cpp", "code": (
        "#include <fstream>\nint main(int c, char** v){ std::ifstream in(v[1]), out(v[2]); long n, a, b;"
        " in >> n; if (!(out >> a >> b)) return 2; return a + b == n ? 0 : 1; }")}  # fmt: skip
    two = {"code": "n = int(input())\nprint(1, n - 1)", "checker": checker,
           "tests": [{"stdin": "5", "expected_stdout": "0 5"}, {"stdin": "9", "expected_stdout": "4 5"}]}  # fmt: skip
    judged = post(live_reward, "/v1/verify/code", two)
    assert [t["verdict"] for t in judged.json()["tests"]] == ["pass", "pass"], judged.text
    wrong = post(live_reward, "/v1/verify/code", {**two, "code": "print(0, 0)"})
    assert [t["verdict"] for t in wrong.json()["tests"]] == ["fail", "fail"]


def test_score_combines_components(live_reward: Any) -> None:
    items = [
        {
            "id": "math-right",
            "prompt": "What is 2+2?",
            "completion": "<think>two and two make four</think><answer>4</answer>",
            "checks": {"math": {"gold": "4"}, "format": {}, "language": {"target": "auto"}},
            "weights": {"format": 0.5},
        },
        {"id": "math-wrong", "completion": "\\boxed{5}", "checks": {"math": {"gold": "4"}}},
        {  # a renamed answer block is where math reads the answer too (it read the whole text: the box in <think>)
            "id": "math-own-tags",
            "completion": "<reason>first \\boxed{5}, then 4</reason><final>4</final>",
            "checks": {"math": {"gold": "4"}, "format": {"think_tag": "reason", "answer_tag": "final"}},
        },
        {"id": "bad-gold", "completion": "\\boxed{5}", "checks": {"math": {"gold": ""}, "format": {}}},
        {
            "id": "code-half",
            "completion": "```python\nprint(int(input()) * 2)\n```",
            "checks": {
                "code": {"tests": [{"stdin": "2", "expected_stdout": "4"}, {"stdin": "3", "expected_stdout": "7"}]}
            },
        },
        {
            "id": "long",
            "completion": "x" * 400,
            "checks": {"overlong": {"max_tokens": 100, "buffer_tokens": 20, "completion_tokens": 90}},
        },
    ]
    r = post(live_reward, "/v1/score", {"items": items})
    assert r.status_code == 200, r.text
    results = {res["id"]: res for res in r.json()["results"]}
    assert [res["id"] for res in r.json()["results"]] == [i["id"] for i in items]
    assert results["math-right"]["reward"] == pytest.approx(1.0 + 0.5 + 1.0)
    assert results["math-wrong"]["reward"] == 0.0
    assert results["math-own-tags"]["reward"] == 2.0, results["math-own-tags"]
    assert results["bad-gold"]["reward"] is None and results["bad-gold"]["status"] == "ok"
    assert "unparseable_gold" in results["bad-gold"]["error"]
    assert results["code-half"]["reward"] == pytest.approx(0.5)
    assert results["long"]["reward"] == pytest.approx(-0.5)


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/verify/math", {"gold": "1"}, 422, "answer"),
        ("/v1/verify/math", {"answer": 1, "gold": "1"}, 422, "answer"),
        ("/v1/verify/math", {"answer": "1", "gold": "1", "timeout_s": -1}, 422, "timeout_s"),
        ("/v1/execute", {"language": "cobol", "code": "x"}, 422, "language"),
        ("/v1/execute", {"code": "x", "memory_mb": "lots"}, 422, "memory_mb"),
        ("/v1/verify/code", {"code": "x", "tests": []}, 422, "tests"),
        ("/v1/verify/code", {"code": "x", "tests": [{"stdin": "1"}]}, 422, "expected_stdout"),
        ("/v1/score", {"items": []}, 422, "items"),
        ("/v1/score", {"items": [{"id": "a", "completion": "c", "checks": {}}]}, 422, "at least one component"),
        (
            "/v1/score",
            {"items": [{"id": "a", "completion": "c", "checks": {"language": {"target": "xx"}}}]},
            422,
            "target",
        ),
        ("/v1/score", {"items": [{"id": "a", "completion": "c", "checks": {"reward_model": {}}}]}, 400, "not enabled"),
        (
            "/v1/score",
            {"items": [{"id": "a", "completion": "c", "checks": {"plugins": {"nope": {}}}}]},
            400,
            "unknown plug-in",
        ),
        ("/v1/score", "not json at all", 422, "JSON"),
        ("/v1/score", {"items": [HUGE_WEIGHTS]}, 422, "less than or equal to 1000000"),
    ],
)
def test_bad_input_is_4xx_with_a_message(live_reward: Any, path: str, body: Any, status: int, needle: str) -> None:
    if isinstance(body, str):
        r = httpx.post(f"{live_reward.http_url}{path}", content=body, headers={"content-type": "application/json"})
    else:
        r = post(live_reward, path, body)
    assert r.status_code == status, r.text
    assert needle.lower() in r.text.lower()


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/v1/execute", {"language": "python", "code": 'print("hi")  # \ud800'}, "code at character 15"),
        (
            "/v1/verify/code",
            {"code": "print(input())", "tests": [{"stdin": "\udc80", "expected_stdout": "x"}]},
            "tests.0.stdin at character 0",
        ),
        ("/v1/verify/math", {"answer": "\\boxed{1}\ud800", "gold": "1"}, "answer at character 9"),
        (
            "/v1/score",
            {"items": [{"id": "a", "completion": "ok \udfff", "checks": {"format": {}}}]},
            "items.0.completion at character 3",
        ),
    ],
)
def test_a_lone_surrogate_is_422_saying_where(live_reward: Any, path: str, body: Any, where: str) -> None:
    """JSON can spell "\\ud800", which is no text: a program, stdin or answer holding one cannot be written for
    a run or echoed back. The caller's to fix, so a 422 that says where, not a sandbox failure that costs a
    worker (or a 500)."""
    raw = json.dumps(body).encode()  # ASCII escapes: the surrogate travels as JSON spells it
    r = httpx.post(
        f"{live_reward.http_url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=60
    )
    assert r.status_code == 422, r.text
    assert where in r.text and "surrogate" in r.text
    fine = post(live_reward, "/v1/execute", {"language": "python", "code": 'print("h\u00e9 \U0001f600")'})
    assert fine.status_code == 200 and fine.json()["stdout"] == "h\u00e9 \U0001f600\n", fine.text


def test_too_many_items_and_too_large_body(live_reward: Any) -> None:
    items = [{"id": str(i), "completion": "c", "checks": {"format": {}}} for i in range(1025)]
    r = post(live_reward, "/v1/score", {"items": items})
    assert r.status_code == 400 and "limit per request is 1024" in r.text
    huge = httpx.post(
        f"{live_reward.http_url}/v1/execute",
        content=b'{"code": "' + b"x" * (33 << 20) + b'"}',
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert huge.status_code == 413


def _too_large_count(service: Any) -> float:
    text = httpx.get(f"{service.http_url}/metrics", timeout=5).text
    line = 'grpo_reward_rejected_total{reason="too_large"} '
    return sum(float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line))


def test_a_chunked_body_over_the_limit_is_413(start_reward: Callable[..., Any]) -> None:
    """Without a Content-Length the body is counted as it streams in; over the limit is the documented 413 (FastAPI's
    body reader used to turn the refusal into 400 "There was an error parsing the body") and counted as too_large."""
    service = start_reward("--max-body-bytes", "65536")

    def chunks(size: int) -> Iterator[bytes]:  # a generator body: httpx sends it chunked
        yield b'{"code": "print(1)  # '
        for _ in range(size // 8192):
            yield b"x" * 8192
        yield b'"}'

    before = _too_large_count(service)
    url = f"{service.http_url}/v1/execute"
    huge = httpx.post(url, content=chunks(1 << 20), headers={"content-type": "application/json"}, timeout=60)
    assert huge.status_code == 413, huge.text
    assert huge.json() == {"detail": "request body exceeds 65536 bytes"}
    assert _too_large_count(service) == before + 1
    small = httpx.post(url, content=chunks(16384), headers={"content-type": "application/json"}, timeout=60)
    assert small.status_code == 200 and small.json()["stdout"] == "1\n", small.text


def test_metrics_count_requests_and_verdicts(live_reward: Any) -> None:
    post(live_reward, "/v1/verify/math", {"answer": "\\boxed{2}", "gold": "2"})
    text = httpx.get(f"{live_reward.http_url}/metrics", timeout=5).text
    for name in (
        "grpo_reward_requests_total",
        "grpo_reward_request_seconds_bucket",
        "grpo_reward_verifier_seconds_bucket",
        'grpo_reward_verdicts_total{status="correct",verifier="math"}',
        "grpo_reward_queue_depth",
        "grpo_reward_sandbox_kills_total",
    ):
        assert name in text, name
    assert 'grpo_reward_requests_total{code="200",endpoint="/v1/verify/math"}' in text
