"""Tool-call parsing and the environment's exact answer texts (grpo.common.tool_formats)."""

from __future__ import annotations

from typing import Any

import pytest

from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.tool_formats import (
    CUT_MARK,
    QWEN_TOOL_MESSAGE,
    TAGGED_STOP,
    chat_tool_suffix,
    cut_result,
    error_text,
    parse_chat,
    parse_markdown,
    parse_tagged,
    render_chat_result,
    render_markdown_result,
    render_tagged_result,
    result_text,
    turn_stops,
    without_calls,
)
from grpo.v1 import reward_pb2


@pytest.mark.parametrize(
    ("turn", "code"),
    [
        ("<code>print(6*7)</code>", "print(6*7)"),
        ("I will compute it. <code>x = 6\nprint(x*7)</code>", "x = 6\nprint(x*7)"),
        ("<code>print(1)</code> then <code>print(2)</code>\n", "print(2)"),  # the last block, trailing space ok
        ("<code>```python\nprint(3)\n```</code>", "print(3)"),
        ("<code>```\nprint(4)\n```</code>", "print(4)"),
        ("<code>\n```py\nprint(5)```\n</code>", "print(5)"),
    ],
)
def test_tagged_call_is_the_last_code_block_that_ends_the_turn(turn: str, code: str) -> None:
    call = parse_tagged(turn)
    assert call is not None and call.error is None
    assert (call.name, call.arguments) == ("python", {"code": code})
    assert call.raw.startswith("<code>") and call.raw.endswith(TAGGED_STOP)


@pytest.mark.parametrize(
    "turn",
    ["<answer>42</answer>", "<code>print(1)</code> so the answer is <answer>1</answer>", "</code>", "", "<code>x"],
)
def test_a_turn_that_does_not_end_in_a_code_block_is_an_answer(turn: str) -> None:
    assert parse_tagged(turn) is None


@pytest.mark.parametrize("turn", ["<code></code>", "<code>  \n </code>", "<code>```python\n```</code>"])
def test_empty_code_is_a_malformed_call(turn: str) -> None:
    call = parse_tagged(turn)
    assert call is not None and call.error == "empty code block"


@pytest.mark.parametrize(
    ("turn", "fmt", "left"),
    [
        ("Check: <code>print(4821*317 - 1528257)</code>", "tagged", "Check: "),
        ("<answer>42</answer><code>print(1)</code>\n", "tagged", "<answer>42</answer>\n"),
        ("Computing: <code>\nans = 1528257\nprint(an", "tagged", "Computing: "),  # cut off by a limit
        ("It is 42.", "tagged", "It is 42."),
        ('Sure.\n<tool_call>{"name": "python", "arguments": {"code": "x = 1528257"}}</tool_call>', "chat", "Sure.\n"),
        ("<tool_call>{oops}</tool_call> The answer is 7.", "chat", " The answer is 7."),  # a malformed call too
        ('<tool_call>{"code": "x = 3"}</tool_call>a<tool_call>{"code": "x = 4"}</tool_call>b', "chat", "ab"),
        ('Let me compute.<tool_call>{"name": "python", "arguments": {"code": "x = 15282', "chat", "Let me compute."),
        ("Check:\n```python\nprint(4821*317 - 1528257)\n```\n```output", "markdown", "Check:\n"),
        ("Computing:\n```python\nans = 1528257\nprint(an", "markdown", "Computing:\n"),  # cut off by a limit
        ("The answer is 42.", "markdown", "The answer is 42."),
        # An answer between two blocks stays; the blocks and ```output go (each block ends at its closing fence).
        (
            "```python\nx = 2\n```\nSo the answer is \\boxed{2}.\nCheck:\n```python\nprint(x)\n```\n```output",
            "markdown",
            "\nSo the answer is \\boxed{2}.\nCheck:\n",
        ),
        (
            "```python\nx = 2\n```\nSo the answer is \\boxed{2}. Let me think",
            "markdown",
            "\nSo the answer is \\boxed{2}. Let me think",
        ),
        ("Let me check.\n```python\nprint(4821*317 - 1528257)\n```", "markdown", "Let me check.\n"),
        ("So:\n```Python\nprint(7)\n```\nDone.", "markdown", "So:\n\nDone."),
    ],
)
def test_a_turn_without_its_calls_keeps_everything_but_the_code(turn: str, fmt: str, left: str) -> None:
    """What an episode that ends on a turn other than an answer is scored on: the code of a call that was never
    run, or that a limit cut off, is no answer (its number was read as one and paid by the math check)."""
    assert without_calls(turn, fmt) == left


@pytest.mark.parametrize(
    ("turn", "code"),
    [
        ("```python\nprint(6*7)\n```\n```output", "print(6*7)\n"),
        ("Let me check.\n```python\nx = 6*7\nprint(x)\n```\n```output\n  ", "x = 6*7\nprint(x)\n"),
        ("```py\nprint(1)\n```\n```output", "print(1)\n"),
        ("```python\nprint(1)\n```output", "print(1)"),  # the block's closing fence left out
        ("```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\n```output", "print(2)\n"),  # the last block
        ("```python\nprint(1)\n```\nNow run it:\n```output", "print(1)\n"),  # words after the block: no code
        ("1. First:\n   ```python\n   x = 1\n   print(x)\n   ```\n```output", "x = 1\nprint(x)\n"),  # indented
        ("```python\r\nprint(1)\r\n```\r\n```output", "print(1)\n"),  # CRLF
        ("```Python\nprint(1)\n```\n```output", "print(1)\n"),
        ("``` python\nprint(1)\n```\n```output", "print(1)\n"),
    ],
)
def test_markdown_call_is_the_last_python_block_before_output(turn: str, code: str) -> None:
    call = parse_markdown(turn)
    assert call is not None and call.error is None and call.name == "python"
    assert call.arguments == {"code": code}
    assert turn_stops("markdown") == ("```output",)


@pytest.mark.parametrize(
    ("turn", "result"),
    [
        ("The answer is 42.", None),
        ("```python\nprint(1)\n```\nSo 1.", None),  # code the model never asked to run: part of its answer
        ("So:\n```output", "no ```python block before ```output"),
        ("```python\n  \n```\n```output", "empty code block"),
    ],
)
def test_markdown_turns_that_are_answers_or_malformed(turn: str, result: str | None) -> None:
    call = parse_markdown(turn)
    assert (call.error if call is not None else None) == result
    assert (call is None) == (result is None)


def test_markdown_result_closes_the_output_block() -> None:
    assert render_markdown_result("42") == "\n42\n```\n"


def test_tagged_result_is_exactly_output_tags() -> None:
    assert render_tagged_result("42") == "<output>42</output>"
    assert render_tagged_result("") == "<output></output>"
    assert error_text("unknown tool 'calc'") == "Error: unknown tool 'calc'"


def test_chat_call_parses_name_and_arguments() -> None:
    turn = 'Let me run it.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'
    call = parse_chat(turn)
    assert call is not None and call.error is None
    assert (call.name, call.arguments) == ("python", {"code": "print(6*7)"})
    # Arguments given as a JSON string holding an object, as some models write them.
    call = parse_chat('<tool_call>{"name": "calc", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert call is not None and (call.name, call.arguments, call.error) == ("calc", {"x": 1}, None)
    assert parse_chat("no call here, <answer>4</answer>") is None


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("{oops}", "tool call is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ('["python"]', "tool call must be a JSON object, got list"),
        ('{"arguments": {}}', 'tool call has no "name" (a non-empty string)'),
        ('{"name": 3}', 'tool call has no "name" (a non-empty string)'),
        ('{"name": "python", "arguments": [1]}', 'tool call "arguments" must be a JSON object'),
    ],
)
def test_malformed_chat_calls_say_what_is_wrong(body: str, error: str) -> None:
    call = parse_chat(f"<tool_call>{body}</tool_call>")
    assert call is not None and call.error == error
    assert call.raw == f"<tool_call>{body}</tool_call>"


class TemplateTokenizer:
    """A tokenizer stand-in with only what chat rendering reads: a Jinja chat template and the EOS text."""

    eos_token = "<|im_end|>"

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        from jinja2 import Template

        return Template(self.chat_template).render(messages=messages, **kwargs)


# The tool-message part of Qwen2.5's template (consecutive tool messages share one user turn).
QWEN25 = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_chat_result_from_a_qwen25_template_equals_the_literal_rendering() -> None:
    rendered = render_chat_result("42", TemplateTokenizer(QWEN25))
    assert rendered == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert rendered == QWEN_TOOL_MESSAGE.format(result="42")


def test_chat_result_uses_the_tokenizers_own_template() -> None:
    path = ensure_tiny_model()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    assert chat_tool_suffix(tokenizer, "42") == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


def test_chat_result_falls_back_to_qwen_when_the_template_cannot_render_tools() -> None:
    plain = "{%- for m in messages %}{{- m.content }}{%- endfor %}"

    class Refusing(TemplateTokenizer):  # as transformers raises for a template's raise_exception("...")
        def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
            if any(m["role"] == "tool" for m in messages):
                raise ValueError("no tools")
            return super().apply_chat_template(messages, **kwargs)

    dropping = "{%- for m in messages %}{%- if m.role != 'tool' %}{{- m.content }}{%- endif %}{%- endfor %}"
    for tokenizer in (Refusing(plain), TemplateTokenizer(dropping), None):
        assert render_chat_result("7", tokenizer) == QWEN_TOOL_MESSAGE.format(result="7")


def test_cut_keeps_head_and_tail() -> None:
    assert cut_result("short", 10) == "short"
    assert cut_result("x" * 50, 0) == "x" * 50  # 0: no limit
    text = "".join(str(i % 10) for i in range(100))
    cut = cut_result(text, 23)
    assert len(cut) == 23 and CUT_MARK in cut
    head, tail = cut.split(CUT_MARK)
    assert (head, tail) == (text[:10], text[-10:])
    assert cut_result("abcdefghij", 7) == "ab...ij"
    assert cut_result("abcdefghij", 8) == "abc...ij"  # the head gets the odd character


def _response(status: str, stdout: str = "", stderr: str = "", exit_code: int | None = None) -> Any:
    response = reward_pb2.ExecuteResponse(status=status, stdout=stdout, stderr=stderr)
    if exit_code is not None:
        response.exit_code = exit_code
    return response


def test_result_text_of_each_status() -> None:
    assert result_text(_response("ok", "42\n")) == "42"
    assert result_text(_response("ok", "a\n\n")) == "a\n"  # one trailing newline only
    assert result_text(_response("ok", "")) == ""
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nZeroDivisionError: division by zero\n'
    assert result_text(_response("runtime_error", stderr=trace, exit_code=1)) == (
        "Error: ZeroDivisionError: division by zero"
    )
    assert result_text(_response("runtime_error", exit_code=3)) == "Error: exit code 3"
    assert result_text(_response("timeout"), timeout_s=5.0) == "Error: timed out after 5s"
    assert result_text(_response("timeout"), timeout_s=0.5) == "Error: timed out after 0.5s"
    assert result_text(_response("memory_limit")) == "Error: memory limit exceeded"
    assert result_text(_response("output_limit")) == "Error: output limit exceeded"
    assert result_text(_response("process_limit")) == "Error: process limit exceeded"
    binary = _response("ok", "AAE=")
    binary.stdout_encoding = "base64"
    assert result_text(binary) == "Error: output is not UTF-8 text"
