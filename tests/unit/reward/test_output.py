"""What a reply returns of a run's output (grpo.reward.output): head and tail, counts, encodings, shares."""

from __future__ import annotations

import base64

import pytest

from grpo.reward.output import DEFAULT_RETURN_BYTES, Returned, encode, returned_stderr, returned_stdout, share
from grpo.reward.sandbox import ExecResult
from grpo.reward.sandbox.run_output import STDERR_KEEP_BYTES, Output, wire_text


def test_share_is_the_request_or_the_default_within_an_equal_share_of_the_budget() -> None:
    assert share(None, 8, 8 << 20) == DEFAULT_RETURN_BYTES == 64 << 10
    assert share(1000, 8, 8 << 20) == 1000
    assert share(None, 2 * 512, 8 << 20) == 8 << 10  # 512 tests: 8 KiB a stream
    assert share(16 << 20, 2, 8 << 20) == 4 << 20
    assert share(0, 2, 8 << 20) == 0 and share(None, 2, 0) == 0


def test_short_output_comes_back_whole() -> None:
    assert returned_stdout("42\n", None, 64) == Returned("42\n", "utf-8", 3, False)
    assert returned_stdout("héllo", None, 64) == Returned("héllo", "utf-8", 6, False)
    assert returned_stderr("", 64) == Returned("", "utf-8", 0, False)


def test_long_output_keeps_its_head_and_tail_and_says_how_much_was_cut() -> None:
    text = "HEAD" + "x" * 1000 + "TAIL"
    assert returned_stdout(text, None, 10) == Returned(
        "HEADx\n[... 998 bytes of stdout cut ...]\nxTAIL", "utf-8", 1008, True
    )
    assert returned_stdout(text, None, 0) == Returned("", "utf-8", 1008, True)


def test_a_cut_falls_between_characters() -> None:
    text = "é" * 100  # two bytes each: the head's 5 bytes end inside one, which is left out
    kept = returned_stdout(text, None, 11)
    assert kept.encoding == "utf-8" and kept.text == "éé\n[... 190 bytes of stdout cut ...]\nééé"
    assert kept.total == 200 and kept.truncated
    assert returned_stdout(text, None, 10).text == "éé\n[... 192 bytes of stdout cut ...]\néé"  # the tail's too


def test_bytes_that_are_not_utf8_come_back_as_base64() -> None:
    raw = bytes(range(256))
    assert encode(raw) == (base64.b64encode(raw).decode(), "base64")
    assert returned_stdout(raw.decode("utf-8", "replace"), raw, 1024) == Returned(
        base64.b64encode(raw).decode(), "base64", 256, False
    )
    cut = returned_stdout("", raw, 8)
    assert cut.encoding == "base64" and cut.truncated and cut.total == 256
    assert base64.b64decode(cut.text) == raw[:4] + b"\n[... 248 bytes of stdout cut ...]\n" + raw[-4:]


def test_the_sandboxs_cut_of_stderr_is_read_back_into_its_count() -> None:
    """The sandbox keeps stderr's first and last 32 KiB with its own cut line: the reply counts what was written."""
    kept = Output("err")
    written = b"E" + b"e" * 999_998 + b"T"
    for at in range(0, len(written), 65536):
        kept.add(written[at : at + 65536])
    stderr = kept.data().decode()
    whole = returned_stderr(stderr, DEFAULT_RETURN_BYTES)
    assert (whole.total, whole.truncated) == (1_000_000, True)
    assert whole.text == stderr  # 64 KiB: what the sandbox kept, as it kept it
    small = returned_stderr(stderr, 10)
    assert small.text == "Eeeee\n[... 999990 bytes of stderr cut ...]\neeeeT" and small.total == 1_000_000


@pytest.mark.parametrize("size", [2 * STDERR_KEEP_BYTES, 100])
def test_a_program_cannot_fake_the_sandboxs_cut_line(size: int) -> None:
    fake = "\n[... 5 bytes of stderr cut ...]\n"
    stderr = "e" * (size - len(fake)) + fake if size > STDERR_KEEP_BYTES else fake
    assert returned_stderr(stderr, 1 << 20) == Returned(stderr, "utf-8", len(stderr), False)


def test_the_zygotes_reply_carries_binary_stdout_exactly() -> None:
    """JSON text cannot hold bytes that are not UTF-8: the reply carries them as base64 and ExecResult reads both."""
    assert wire_text(b"42\n") == "42\n"
    wire = wire_text(b"\xff\x00ok")
    assert wire == {"base64": base64.b64encode(b"\xff\x00ok").decode()}
    result = ExecResult("ok", 0, wire, "", 0.1)  # type: ignore[arg-type] - the reply's form, as namespace.py passes it
    assert (result.stdout, result.stdout_raw) == ("\ufffd\x00ok", b"\xff\x00ok")
    assert ExecResult("ok", 0, "42\n", "", 0.1).stdout_raw is None
