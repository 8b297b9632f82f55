"""What crosses from the service to a zygote, for real: built programs it holds between requests (named, not
sent again) and large stdins passed as sealed memfds instead of through the pipe (zygote_client.Held, zygote.stock)."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo.reward.sandbox import Limits, zygote_client
from grpo.reward.sandbox.languages import Launch, python_launch
from grpo.reward.sandbox.namespace import NamespaceSandbox
from grpo.reward.sandbox.zygote_client import Zygote

FAST = Limits(timeout_s=10.0, memory_mb=256)
DIGEST = "import hashlib, sys\nd = sys.stdin.buffer.read()\nprint(len(d), hashlib.sha256(d).hexdigest())"


@pytest.fixture
def one() -> Iterator[NamespaceSandbox]:
    """One worker, so every request goes to the same zygote."""
    box = NamespaceSandbox(workers=1)
    yield box
    box.close()


def written(zygote: Zygote) -> list[int]:
    """Record the size of every write the service makes to this zygote's pipe."""
    sizes: list[int] = []
    write = zygote._write

    def spy(data: bytes) -> None:
        sizes.append(len(data))
        write(data)

    zygote._write = spy  # type: ignore[method-assign]
    return sizes


def digest_launch(one: NamespaceSandbox, blobs: dict[str, bytes], held: frozenset[str] | None = None) -> Launch:
    """A bash run that prints the md5 of each binary file it was given, in name order; all of them holdable
    (as a built program is) unless `held` says which."""
    return Launch(
        files={"main.sh": "md5sum " + " ".join(sorted(blobs)) + " | cut -d' ' -f1"},
        argv=[one.languages["bash"]["bash"], "main.sh"], binary_files=blobs, memory_kind="as",
        held=frozenset(blobs) if held is None else held,
    )  # fmt: skip


def md5s(blobs: dict[str, bytes]) -> str:
    return "".join(hashlib.md5(blobs[name]).hexdigest() + "\n" for name in sorted(blobs))


def test_a_held_program_is_named_not_sent_again(one: NamespaceSandbox) -> None:
    (zygote,) = one._all
    sizes = written(zygote)
    blob = random.Random(1).randbytes(200_000)
    launch = digest_launch(one, {"prog.bin": blob})
    results = [one.execute(launch, "", FAST) for _ in range(3)]
    results += list(one.execute_many(launch, ["", ""], FAST))
    assert [r.stdout for r in results] == [md5s({"prog.bin": blob})] * 5, results
    assert sizes[0] > len(blob) and max(sizes[1:]) < 10_000, sizes
    assert one._all == [zygote]


def test_files_that_come_once_are_sent_not_held(one: NamespaceSandbox) -> None:
    """A checker's input.txt or a test's own files are new on every run: holding them would only evict the
    programs worth holding. Only the launch's `held` names are kept."""
    (zygote,) = one._all
    sizes = written(zygote)
    rng = random.Random(8)
    program = rng.randbytes(50_000)
    for _ in range(3):
        files = {"prog.bin": program, "input.txt": rng.randbytes(100_000)}
        result = one.execute(digest_launch(one, files, held=frozenset({"prog.bin"})), "", FAST)
        assert result.stdout == md5s(files), result
    assert list(zygote.held.blobs.values()) == [program]
    assert 100_000 < sizes[-1] < 150_000, sizes  # the input sent again, the program not


def test_held_programs_are_evicted_in_step_with_the_zygote(one: NamespaceSandbox, monkeypatch) -> None:
    """More programs than the zygote may hold, reused out of order: each run still gets its own bytes, the
    service's copy never passes the limits, and the zygote is never replaced (an unknown name would do that)."""
    monkeypatch.setattr(zygote_client, "HELD_BYTES", 100_000)
    monkeypatch.setattr(zygote_client, "HELD_FILES", 3)
    rng = random.Random(2)
    blobs = [rng.randbytes(30_000) for _ in range(6)]
    (zygote,) = one._all
    for i in [0, 1, 2, 3, 0, 4, 1, 5, 5, 2, 0, 3]:
        files = {"a.bin": blobs[i], "b.bin": blobs[(i + 1) % 6]}
        result = one.execute(digest_launch(one, files), "", FAST)
        assert result.status == "ok" and result.stdout == md5s(files), result
        assert zygote.held.size <= 100_000 and len(zygote.held.blobs) <= 3
        assert len(held_files(zygote)) == len(zygote.held.blobs)  # what we evicted, it deleted
    assert one._all == [zygote]


def held_files(zygote: Zygote) -> list[Path]:
    """The files in the zygote's /held, as its root shows them."""
    return list(Path(f"/proc/{zygote.pid}/root/held").iterdir())


def memfds(zygote: Zygote, name: str) -> int:
    """How many memfds of this name the zygote has open (it opens and closes pipes meanwhile: a link may go)."""
    count = 0
    for fd in Path(f"/proc/{zygote.pid}/fd").iterdir():
        try:
            count += str(fd.readlink()).startswith(f"/memfd:{name} ")
        except FileNotFoundError:
            pass
    return count


def test_a_zygote_out_of_step_is_a_sandbox_error_then_replaced(one: NamespaceSandbox) -> None:
    (zygote,) = one._all
    blob = random.Random(3).randbytes(20_000)
    zygote.held.blobs[f"{id(blob):x}"] = blob  # the service believes the zygote holds what it was never sent
    launch = digest_launch(one, {"prog.bin": blob})
    failed = one.execute(launch, "", FAST)
    assert failed.status == "sandbox_error" and "KeyError" in failed.stderr, failed
    assert zygote not in one._all
    assert one.execute(launch, "", FAST).stdout == md5s({"prog.bin": blob})


def text(seed: int, size: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("0123456789 \n") for _ in range(size))


def expected(stdin: str) -> str:
    data = stdin.encode()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


def test_a_large_stdin_is_passed_whole_not_piped(one: NamespaceSandbox) -> None:
    (zygote,) = one._all
    sizes = written(zygote)
    launch = python_launch(DIGEST, one.languages["python"]["python3"])
    big, other = text(4, 1_500_000), text(5, 300_000)
    assert one.execute(launch, big, FAST).stdout == expected(big)
    stdins = [big, "small\n", other, big, ""]
    assert [r.stdout for r in one.execute_many(launch, stdins, FAST)] == [expected(s) for s in stdins]
    assert max(sizes) < 20_000, sizes  # the megabytes went as memfds
    # and were closed after their request (all but the next run's own; a batch's after its end is written)
    deadline = time.monotonic() + 5.0
    while memfds(zygote, "stdin") > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert memfds(zygote, "stdin") <= 1


def test_a_passed_stdin_is_the_runs_fd_0_and_nothing_more(one: NamespaceSandbox) -> None:
    """The memfd rides to the run's PID 1 with its request; the program must see the same fds as with a small
    stdin written for it (0-4, and the one its own listing opens), and read its stdin from the start. Also when
    the prepared PID 1 was killed while it waited and the next is forked after the memfd came (it once leaked
    in as fd 8)."""
    program = "import os, sys\nprint(sorted(os.listdir('/proc/self/fd')), len(sys.stdin.read()))"
    launch = python_launch(program, one.languages["python"]["python3"])
    small, big = one.execute(launch, "x" * 10, FAST), one.execute(launch, "x" * 500_000, FAST)
    assert small.stdout == "['0', '1', '2', '3', '4', '5'] 10\n", small
    assert big.stdout == "['0', '1', '2', '3', '4', '5'] 500000\n", big
    (zygote,) = one._all
    pid, deadline = zygote.pid, time.monotonic() + 5
    while not (waiting := Path(f"/proc/{pid}/task/{pid}/children").read_text().split()):
        assert time.monotonic() < deadline, "no prepared run"
        time.sleep(0.01)
    os.kill(int(waiting[0]), signal.SIGKILL)
    while Path(f"/proc/{waiting[0]}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the prepared run did not die"
        time.sleep(0.01)
    after = one.execute(launch, "x" * 500_000, FAST)
    assert after.stdout == "['0', '1', '2', '3', '4', '5'] 500000\n", after


@pytest.mark.timeout(120)
def test_a_batch_with_more_passed_stdins_than_a_socket_holds(one: NamespaceSandbox) -> None:
    """A socket holds ~280 passed fds. Sent all before the request, the 281st blocked the service while the
    zygote waited for the request: a hang. Sent in the order the zygote reads, each waits only its turn."""
    bash = one.languages["bash"]["bash"]
    launch = Launch(
        files={"main.sh": 'read -r first; echo "$first $(wc -c)"'}, argv=[bash, "main.sh"], memory_kind="as"
    )
    stdins = [f"{i}\n" + "x" * (zygote_client.PASSED_MIN_BYTES + i) for i in range(400)]
    stdins[7] = "small\n"  # one through the pipe among them
    results = list(one.execute_many(launch, stdins, FAST))
    assert [r.stdout for r in results] == [f"{s.split(chr(10))[0]} {len(s) - s.index(chr(10)) - 1}\n" for s in stdins]


def test_a_batch_run_has_fds_0_to_4_and_nothing_more(one: NamespaceSandbox) -> None:
    """Each run's fds reach the supervisor over a socket; received inheritable (CPython 3.11's recv_fds ignores
    MSG_CMSG_CLOEXEC), they reached the run too, as extra copies of its own stdin, stdout and stderr."""
    program = "import os, sys\nprint(sorted(os.listdir('/proc/self/fd')), len(sys.stdin.read()))"
    launch = python_launch(program, one.languages["python"]["python3"])
    stdins = ["x" * 10, "x" * 100_000, "x" * 20]
    results = list(one.execute_many(launch, stdins, FAST))
    assert [r.stdout for r in results] == [f"['0', '1', '2', '3', '4', '5'] {len(s)}\n" for s in stdins], results


WRITE_BACK = """import hashlib, os, sys
d = sys.stdin.buffer.read()
if d.startswith(b"leave"):
    open("left.txt", "w").write("x")  # the next run gets a fresh namespace: the one queued is started again
    for attempt in (lambda: os.write(0, b"changed"), lambda: os.truncate(0, 0)):
        try:
            attempt()
            print("changed")
        except OSError as exc:
            print(exc.strerror)
print(len(d), hashlib.sha256(d).hexdigest())
"""


def test_a_passed_stdin_cannot_be_changed_and_a_requeued_run_reads_it_whole(one: NamespaceSandbox) -> None:
    launch = python_launch(WRITE_BACK, one.languages["python"]["python3"])
    leave, look = "leave\n" + text(6, 200_000), text(7, 200_000)
    results = list(one.execute_many(launch, [leave, look, leave, look], FAST))
    refused = "Operation not permitted\n" * 2
    assert [r.stdout for r in results] == [refused + expected(leave), expected(look)] * 2, results
