"""Every language the sandbox runs, for real: a build once per request, every verdict, and the attacks each can express.

The toolchains come from the machine (Debian packages: gcc, g++, default-jdk-headless, nodejs, node-typescript,
golang-go, rustc, bash); `make toolchains` installs what is missing. A language missing here is a failure, not a skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo.reward.sandbox import Limits, Sandbox
from grpo.reward.verifiers.code import run_code_tests

LANGUAGES = ("c", "cpp", "java", "javascript", "typescript", "go", "rust", "bash")
REPO = Path(__file__).resolve().parents[3]
FAST = Limits(timeout_s=5.0, memory_mb=256)

# Reverse the word on stdin: the same task in every language (and a wrong answer: the word unchanged).
REVERSE = {
    "c": '#include <stdio.h>\n#include <string.h>\nint main(){char s[256];scanf("%255s",s);'
    "for(int i=strlen(s)-1;i>=0;i--)putchar(s[i]);putchar(10);return 0;}",
    "cpp": "#include <bits/stdc++.h>\nint main(){std::string s;std::cin>>s;std::reverse(s.begin(),s.end());"
    'std::cout<<s<<"\\n";}',
    "java": "import java.util.*;\npublic class Main{public static void main(String[] a){"
    "System.out.println(new StringBuilder(new Scanner(System.in).next()).reverse());}}",
    "javascript": 'const s=require("fs").readFileSync(0,"utf8").trim();console.log([...s].reverse().join(""));',
    "bash": 'read s; echo "$s" | rev',
    "typescript": 'const s: string = require("fs").readFileSync(0, "utf8").trim();console.log([...s].reverse().join(""));',
    "go": 'package main\nimport "fmt"\nfunc main(){ var s string; fmt.Scan(&s); r := []rune(s);'
    " for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 { r[i], r[j] = r[j], r[i] }; fmt.Println(string(r)) }",
    "rust": "use std::io::*;\nfn main(){ let mut s = String::new(); stdin().read_line(&mut s).unwrap();"
    ' println!("{}", s.trim().chars().rev().collect::<String>()); }',
}
ECHO = {
    "c": '#include <stdio.h>\nint main(){char s[256];scanf("%255s",s);puts(s);return 0;}',
    "cpp": "#include <iostream>\nint main(){std::string s;std::cin>>s;std::cout<<s<<std::endl;}",
    "java": "public class Main{public static void main(String[] a){System.out.println(new java.util.Scanner(System.in).next());}}",
    "javascript": 'console.log(require("fs").readFileSync(0,"utf8").trim());',
    "bash": 'read s; echo "$s"',
    "typescript": 'console.log(require("fs").readFileSync(0, "utf8").trim() as string);',
    "go": 'package main\nimport "fmt"\nfunc main(){ var s string; fmt.Scan(&s); fmt.Println(s) }',
    "rust": 'fn main(){ let mut s = String::new(); std::io::stdin().read_line(&mut s).unwrap(); println!("{}", s.trim()); }',
}
SYNTAX_ERROR = {
    "c": "int main(){ return 0 }",
    "cpp": "int main(){ undeclared(); }",
    "java": "public class Main{ void f( }",
    "typescript": "const x: number = ;",
    "go": "package main\nfunc main(){ x := }",
    "rust": 'fn main(){ let x: i32 = "no"; }',
}
CRASH = {
    "c": "int main(){ volatile int *p = 0; *p = 1; return 0; }",
    "cpp": '#include <stdexcept>\nint main(){ throw std::runtime_error("boom"); }',
    "java": 'public class Main{public static void main(String[] a){throw new RuntimeException("boom");}}',
    "javascript": 'throw new Error("boom");',
    "bash": "exit 3",
    "typescript": 'throw new Error("boom");',
    "go": 'package main\nfunc main(){ panic("boom") }',
    "rust": 'fn main(){ panic!("boom"); }',
}
SPIN = {
    "c": "int main(){ volatile unsigned long i = 0; for(;;) i++; }",
    "cpp": "int main(){ volatile unsigned long i = 0; for(;;) i++; }",
    "java": "public class Main{public static void main(String[] a){long i=0; while(true) i++;}}",
    "javascript": "for(;;){}",
    "bash": "while :; do :; done",
    "typescript": "for(;;){}",
    "go": "package main\nfunc main(){ i := 0; for { i++ } }",
    "rust": 'fn main(){ let mut i: u64 = 1; loop { i = i.wrapping_mul(3); if i == 0 { println!("never"); } } }',
}
HOG = {  # allocate and touch memory until it runs out
    "c": "#include <stdlib.h>\n#include <string.h>\nint main(){ for(;;){ char *p = malloc(1 << 20); memset(p, 1, 1 << 20); } }",
    "cpp": "#include <vector>\nint main(){ std::vector<std::vector<char>> v; for(;;) v.emplace_back(1 << 20, 1); }",
    "java": "import java.util.*;\npublic class Main{public static void main(String[] a){"
    "List<long[]> l=new ArrayList<>(); while(true) l.add(new long[1<<17]);}}",
    "javascript": "const a=[]; for(;;) a.push(new Array(1 << 17).fill(1.5));",
    "bash": "x=a; while :; do x=$x$x; done",
    "typescript": "const a: number[][] = []; for(;;) a.push(new Array(1 << 17).fill(1.5));",
    "go": "package main\nfunc main(){ var l [][]byte; for { b := make([]byte, 1<<20); for i := range b { b[i] = 1 }; l = append(l, b) } }",
    "rust": "fn main(){ let mut v: Vec<Vec<u8>> = Vec::new(); loop { v.push(vec![1u8; 1 << 20]); } }",
}
READ_REPO = {  # the host's files are not in the sandbox root
    "c": f'#include <stdio.h>\nint main(){{ FILE *f = fopen("{REPO}/README.md", "r"); puts(f ? "visible" : "hidden"); }}',
    "cpp": f'#include <fstream>\n#include <iostream>\nint main(){{ std::ifstream f("{REPO}/README.md"); '
    'std::cout << (f.good() ? "visible" : "hidden") << "\\n"; }',
    "java": "public class Main{public static void main(String[] a){"
    f'System.out.println(new java.io.File("{REPO}/README.md").exists() ? "visible" : "hidden");}}}}',
    "javascript": f'console.log(require("fs").existsSync("{REPO}/README.md") ? "visible" : "hidden");',
    "bash": f'[ -e "{REPO}/README.md" ] && echo visible || echo hidden',
    "typescript": f'console.log(require("fs").existsSync("{REPO}/README.md") ? "visible" : "hidden");',
    "go": f'package main\nimport ("fmt"; "os")\nfunc main(){{ if _, e := os.Stat("{REPO}/README.md"); e == nil'
    ' { fmt.Println("visible") } else { fmt.Println("hidden") } }',
    "rust": f'fn main(){{ println!("{{}}", if std::path::Path::new("{REPO}/README.md").exists() {{ "visible" }}'
    ' else { "hidden" }); }',
}
WRITE_USR = {  # the root is read-only
    "c": '#include <stdio.h>\nint main(){ FILE *f = fopen("/usr/grpo-attack", "w"); puts(f ? "written" : "refused"); }',
    "cpp": '#include <fstream>\n#include <iostream>\nint main(){ std::ofstream f("/usr/grpo-attack"); '
    'std::cout << (f.good() ? "written" : "refused") << "\\n"; }',
    "java": 'public class Main{public static void main(String[] a){try{new java.io.FileWriter("/usr/grpo-attack");'
    'System.out.println("written");}catch(Exception e){System.out.println("refused");}}}',
    "javascript": 'try{require("fs").writeFileSync("/usr/grpo-attack","x");console.log("written")}'
    'catch(e){console.log("refused")}',
    "bash": "(echo x > /usr/grpo-attack) 2>/dev/null && echo written || echo refused",
    "typescript": 'try{require("fs").writeFileSync("/usr/grpo-attack","x");console.log("written")}'
    'catch(e){console.log("refused")}',
    "go": 'package main\nimport ("fmt"; "os")\nfunc main(){ if e := os.WriteFile("/usr/grpo-attack", nil, 0644);'
    ' e == nil { fmt.Println("written") } else { fmt.Println("refused") } }',
    "rust": 'fn main(){ println!("{}", if std::fs::write("/usr/grpo-attack", "x").is_ok() { "written" }'
    ' else { "refused" }); }',
}


def connect_program(language: str, port: int) -> str:
    return {
        "c": "#include <stdio.h>\n#include <arpa/inet.h>\n#include <sys/socket.h>\nint main(){"
        "int s = socket(AF_INET, SOCK_STREAM, 0); struct sockaddr_in a = {0}; a.sin_family = AF_INET;"
        f"a.sin_port = htons({port}); a.sin_addr.s_addr = htonl(0x7f000001);"
        'puts(connect(s, (struct sockaddr*)&a, sizeof a) == 0 ? "connected" : "refused"); }',
        "cpp": "#include <cstdio>\n#include <arpa/inet.h>\n#include <sys/socket.h>\nint main(){"
        "int s = socket(AF_INET, SOCK_STREAM, 0); sockaddr_in a{}; a.sin_family = AF_INET;"
        f"a.sin_port = htons({port}); a.sin_addr.s_addr = htonl(0x7f000001);"
        'std::puts(connect(s, (sockaddr*)&a, sizeof a) == 0 ? "connected" : "refused"); }',
        "java": 'public class Main{public static void main(String[] a){try{new java.net.Socket("127.0.0.1",'
        f'{port});System.out.println("connected");}}catch(Exception e){{System.out.println("refused");}}}}}}',
        "javascript": f'require("net").connect({port},"127.0.0.1").on("connect",()=>{{console.log("connected");'
        'process.exit(0)}).on("error",()=>console.log("refused"));',
        "bash": f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo connected || echo refused",
        "typescript": f'require("net").connect({port},"127.0.0.1").on("connect",()=>{{console.log("connected");'
        'process.exit(0)}).on("error",()=>console.log("refused"));',
        "go": f'package main\nimport ("fmt"; "net")\nfunc main(){{ if _, e := net.Dial("tcp", "127.0.0.1:{port}");'
        ' e == nil { fmt.Println("connected") } else { fmt.Println("refused") } }',
        "rust": f'fn main(){{ println!("{{}}", if std::net::TcpStream::connect("127.0.0.1:{port}").is_ok()'
        ' { "connected" } else { "refused" }); }',
    }[language]


def test_every_language_is_installed(sandbox: Sandbox) -> None:
    assert set(LANGUAGES) | {"python"} <= set(sandbox.languages), sandbox.languages


@pytest.mark.parametrize("language", LANGUAGES)
def test_pass_and_wrong_answer(sandbox: Sandbox, language: str) -> None:
    tests = [{"stdin": "abc\n", "expected_stdout": "cba\n"}, {"stdin": "grpo\n", "expected_stdout": "oprg"}]
    right = run_code_tests(sandbox, REVERSE[language], tests, language, timeout_s=10.0, memory_mb=256)
    assert [r.verdict for r in right] == ["pass", "pass"], [r.stderr for r in right]
    assert all(r.cpu_s > 0 and r.peak_memory_mb > 0 for r in right)
    wrong = run_code_tests(sandbox, ECHO[language], tests, language, timeout_s=10.0, memory_mb=256)
    assert [r.verdict for r in wrong] == ["fail", "fail"], [r.stderr for r in wrong]


def test_a_build_output_too_large_to_keep_is_a_compile_error(sandbox: Sandbox) -> None:
    """40 MB of initialised data in the binary: it once filled each run's scratch (ENOSPC in the worker: every
    test a sandbox_error, a worker restarted), and at 200 MB timed the worker out copying it back."""
    big = 'char data[40 << 20] = {1};\n#include <stdio.h>\nint main(){ puts("hi"); return data[0] - 1; }'
    tests = [{"stdin": "", "expected_stdout": "hi"}] * 2
    results = run_code_tests(sandbox, big, tests, "c", timeout_s=10.0)
    assert [r.verdict for r in results] == ["compile_error"] * 2, [(r.verdict, r.stderr[-200:]) for r in results]
    assert "the build's output is over 32 MiB" in results[0].stderr
    small = run_code_tests(sandbox, big.replace("40 << 20", "1 << 20"), tests, "c", timeout_s=10.0)
    assert [r.verdict for r in small] == ["pass", "pass"], [r.stderr for r in small]


@pytest.mark.parametrize("language", sorted(SYNTAX_ERROR))
def test_compile_error_carries_the_compilers_message(sandbox: Sandbox, language: str) -> None:
    tests = [{"stdin": "", "expected_stdout": ""}] * 3
    results = run_code_tests(sandbox, SYNTAX_ERROR[language], tests, language, timeout_s=10.0)
    assert [r.verdict for r in results] == ["compile_error"] * 3
    assert "error" in results[0].stderr and results[0].detail == "the program did not compile"


@pytest.mark.parametrize("language", LANGUAGES)
def test_runtime_error_timeout_and_memory_limit(sandbox: Sandbox, language: str) -> None:
    crash = sandbox.run(CRASH[language], limits=FAST, language=language)
    assert crash.status == "runtime_error" and crash.exit_code != 0, crash
    spin = sandbox.run(SPIN[language], limits=Limits(timeout_s=1.5), language=language)
    assert spin.status == "timeout", spin
    hog = sandbox.run(HOG[language], limits=Limits(timeout_s=20.0, memory_mb=128), language=language)
    assert hog.status == "memory_limit", (hog.status, hog.exit_code, hog.peak_memory_mb, hog.stderr[-500:])


SHARED_HOG = (  # 256 MiB in a shared mapping, every page touched, then a clean exit
    "#define _GNU_SOURCE\n#include <stdio.h>\n#include <string.h>\n#include <sys/mman.h>\n"
    "int main(){ size_t n = 256u << 20; char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,"
    ' -1, 0); if (p == MAP_FAILED) { puts("refused"); return 0; } memset(p, 1, n); puts("held"); return 0; }'
)


def test_memory_outside_the_rlimits_is_still_a_memory_limit(sandbox: Sandbox) -> None:
    """RLIMIT_DATA (native code, the JVM, V8) does not count shared mappings, and no rlimit counts a memfd: a
    C program held 1 GiB under a 128 MiB limit and passed, Python 960 MiB in memfds under 64 MiB."""
    shared = sandbox.run(SHARED_HOG, limits=Limits(timeout_s=10.0, memory_mb=64), language="c")
    assert shared.status == "memory_limit" and shared.peak_memory_mb > 256, shared
    memfd = sandbox.run("import os\nos.memfd_create('x')", limits=FAST)
    assert memfd.status == "runtime_error" and "PermissionError" in memfd.stderr, memfd


@pytest.mark.parametrize("language", LANGUAGES)
def test_attacks_are_contained(sandbox: Sandbox, language: str, listener: int) -> None:
    for program, expected in (
        (connect_program(language, listener), "refused"),
        (READ_REPO[language], "hidden"),
        (WRITE_USR[language], "refused"),
    ):
        result = sandbox.run(program, limits=FAST, language=language)
        assert (result.status, result.stdout.strip()) == ("ok", expected), (program, result)
    assert not Path("/usr/grpo-attack").exists()


@pytest.mark.parametrize("language", ["c", "bash"])
def test_fork_bomb_and_background_processes_die_with_the_run(sandbox: Sandbox, language: str) -> None:
    bomb = {"c": "#include <unistd.h>\nint main(){ for(;;) fork(); }", "bash": "b(){ b | b & }; b"}[language]
    result = sandbox.run(bomb, limits=Limits(timeout_s=2.0), language=language)
    assert result.status in ("timeout", "runtime_error", "ok"), result
    leftover = {"c": "#include <unistd.h>\nint main(){ if(fork()==0){ setsid(); sleep(100); } return 0; }",
                "bash": "setsid sleep 100 & sleep 100 & echo started"}[language]  # fmt: skip
    result = sandbox.run(leftover, limits=Limits(timeout_s=5.0), language=language)
    assert result.status == "ok" and result.wall_s < 3.0, result  # the run ends with its init, orphans and all
    after = sandbox.run(REVERSE[language], "ok\n", FAST, language)
    assert after.stdout == "ko\n"  # the sandbox still serves


# Any two non-negative numbers that sum to n: many right answers, so a checker decides.
TWO_SUMMANDS = {"python": "n = int(input())\nprint(n // 2, n - n // 2)", "c": ECHO["c"]}
CHECKERS = {
    "cpp": "#include <fstream>\n#include <iostream>\nint main(int argc, char** argv){"
    " std::ifstream in(argv[1]), out(argv[2]); long n, a, b;"
    ' if (!(in >> n)) return 3; if (!(out >> a >> b)) { std::cerr << "no two numbers"; return 2; }'
    ' if (a < 0 || b < 0 || a + b != n) { std::cerr << a << "+" << b << " != " << n; return 1; } return 0; }',
    "python": "import sys\nn = int(open(sys.argv[1]).read())\ntry:\n    a, b = map(int, open(sys.argv[2]).read().split())\n"
    "except ValueError:\n    sys.exit('no two numbers')\n"
    "if a < 0 or b < 0 or a + b != n:\n    print(f'{a}+{b} != {n}', file=sys.stderr)\n    sys.exit(1)\n",
}


@pytest.mark.parametrize("checker_language", sorted(CHECKERS))
def test_checker_programs_decide(sandbox: Sandbox, checker_language: str) -> None:
    """A special judge in C++ and in Python: accepts any right answer, rejects a wrong one with its message."""
    from grpo.reward.verifiers.code import Checker, Judge

    judge = Judge(checker=Checker(checker_language, CHECKERS[checker_language]))
    tests = [{"stdin": f"{n}\n", "expected_stdout": f"0 {n}"} for n in (7, 10)]
    right = run_code_tests(sandbox, TWO_SUMMANDS["python"], tests, "python", timeout_s=10.0, judge=judge)
    assert [r.verdict for r in right] == ["pass", "pass"], [r.detail for r in right]  # "3 4" is not "0 7", yet right
    wrong = run_code_tests(sandbox, "print(1, 1)", tests, "python", timeout_s=10.0, judge=judge)
    assert [r.verdict for r in wrong] == ["fail", "fail"] and "1+1 != 7" in wrong[0].detail
    broken = Judge(checker=Checker(checker_language, "this is not a program {"))
    [result] = run_code_tests(sandbox, "print(3, 4)", tests[:1], "python", timeout_s=10.0, judge=broken)
    assert result.verdict == "checker_error"  # the judge failed: never a verdict on the program


CRASHING_CHECKERS = {  # each dies of an uncaught error, with its runtime's reject-looking exit code (1 or 2)
    "javascript": 'const fs = require("fs"); JSON.parse(fs.readFileSync(process.argv[3], "utf8"));',
    "java": "public class Main { public static void main(String[] a) { Object o = null; o.hashCode(); } }",
    "go": 'package main\nimport "os"\nfunc main() { var xs []int; _ = os.Args; println(xs[5]) }',
    "python": "import json, sys\njson.loads(open(sys.argv[2]).read())",
}


@pytest.mark.parametrize("checker_language", sorted(CRASHING_CHECKERS))
def test_a_checker_that_crashes_is_a_checker_error_not_a_rejection(sandbox: Sandbox, checker_language: str) -> None:
    """node and Java exit 1 on an uncaught error, Go 2 on a panic: testlib's reject codes. Read as rejections,
    a broken judge failed right answers."""
    from grpo.reward.verifiers.code import Checker, Judge

    judge = Judge(checker=Checker(checker_language, CRASHING_CHECKERS[checker_language]))
    tests = [{"stdin": "hello\n", "expected_stdout": '{"v": 1}'}]
    [result] = run_code_tests(sandbox, "print(input())", tests, "python", timeout_s=10.0, judge=judge)
    assert result.verdict == "checker_error", (result.verdict, result.detail)


# The same judge written the Codeforces way: testlib's streams, ranges and verdicts (testlib.h ships with the sandbox).
TESTLIB_CHECKER = """#include "testlib.h"
int main(int argc, char* argv[]) {
    registerTestlibCmd(argc, argv);
    long long n = inf.readLong();
    long long want = ans.readLong();
    if (want < 0 || want > n) quitf(_fail, "the answer file is broken: %lld", want);
    long long a = ouf.readLong(0, n, "a"), b = ouf.readLong(0, n, "b");
    if (a + b != n) quitf(_wa, "%lld + %lld != %lld", a, b, n);
    quitf(_ok, "n = %lld", n);
}
"""


def test_a_testlib_checker_builds_and_decides(sandbox: Sandbox) -> None:
    """testlib's verdicts map to ours: _ok passes, _wa, a value out of range and a truncated output fail with
    testlib's message, _fail (the checker's own failure) is a checker_error. One request: one checker build."""
    from grpo.reward.verifiers.code import Checker, Judge

    program = "n = int(input())\nprint({7: '3 4', 10: '1 1', 5: '3', 6: '-1 7', 8: '4 4'}[n])"
    tests = [{"stdin": f"{n}\n", "expected_stdout": answer} for n, answer in
             ((7, "0 7"), (10, "10 0"), (5, "0 5"), (6, "0 6"), (8, "99"))]  # fmt: skip
    judge = Judge(checker=Checker("cpp", TESTLIB_CHECKER))
    results = run_code_tests(sandbox, program, tests, "python", timeout_s=10.0, judge=judge)
    verdicts = [(r.verdict, r.detail) for r in results]
    assert [v for v, _ in verdicts] == ["pass", "fail", "fail", "fail", "checker_error"], verdicts
    for (_, detail), said in zip(verdicts[1:], ("1 + 1 != 10", "Unexpected end of file", "violates the range [0, 6]",
                                                 "answer file is broken: 99"), strict=True):  # fmt: skip
        assert said in detail, (said, detail)
