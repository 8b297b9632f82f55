"""Tool-call syntax of multi-turn episodes: parsing a model turn, and the exact text the environment answers with.

Three formats (EpisodeSpec.tool_format, docs/multi-turn.md):

* ``tagged`` (the tiny model): the model writes ``<code>`` + python source + ``</code>``; the turn stops at
  ``</code>`` (TAGGED_STOP); the environment appends ``<output>`` + result + ``</output>``.
* ``chat`` (Hermes / Qwen2.5): the model writes ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  and ends its turn with its EOS token; the result goes back as the chat template's tool message, followed by the
  generation prompt of the next assistant turn.
* ``markdown`` (tool-integrated reasoning as Qwen2.5-Math-Instruct, ToRA and ToRL write it): the model writes a
  ```` ```python ```` block, closes it and opens ```` ```output ````; the turn stops there (MARKDOWN_STOP); the
  environment appends ``\\n`` + result + ``\\n```\\n``.

Pure: no torch; a tokenizer, where one is needed, is anything with ``apply_chat_template`` (transformers).

>>> parse_tagged("Let me compute. <code>print(6*7)</code>").arguments
{'code': 'print(6*7)'}
>>> render_tagged_result("42")
'<output>42</output>'
>>> cut_result("abcdefghij", 7)
'ab...ij'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TAGGED = "tagged"
CHAT = "chat"
MARKDOWN = "markdown"
FORMATS = (TAGGED, CHAT, MARKDOWN)

TAGGED_STOP = "</code>"
"""The stop string of a tagged turn: generation stops once the model closes its code block."""
CHAT_STOPS: tuple[str, ...] = ()
"""A chat turn stops at the model's EOS token (which the engines always stop at): no stop string."""
MARKDOWN_STOP = "```output"
"""The stop string of a markdown turn: the model has closed its python block and asks for the output."""
CUT_MARK = "..."
"""What stands for the middle of a result cut by `cut_result`. ASCII: a tokenizer without a token for "…" (the
demo's character tokenizer) would drop it, and the model would see the head and tail run together."""

# Qwen2.5's rendering of a tool message after an assistant turn, when the template cannot render role "tool".
# The assistant turn itself ended with "<|im_end|>" (sampled by the model); "\n" is the template's text after it.
QWEN_TOOL_MESSAGE = "\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

_CODE_OPEN = "<code>"
_FENCE = re.compile(r"\A\s*```[A-Za-z0-9_+-]*[ \t]*\n(?P<body>.*?)\n?[ \t]*```\s*\Z", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(?P<body>.*?)</tool_call>", re.DOTALL)
# A markdown python block opens with ```python (or ```py, ```python3, any case, indented in a list item) and closes
# at the first line holding only ```; CRLF line ends too.
_PYTHON_FENCE = re.compile(r"(?P<indent>[ \t]*)```[ \t]*(?:python3?|py)[ \t]*\r?\n", re.IGNORECASE)
_CLOSING_FENCE = re.compile(r"^[ \t]*```[ \t]*\r?$", re.MULTILINE)


@dataclass(frozen=True)
class ToolCall:
    """One tool call found in a model turn. `error` is set when the call is malformed (it is then answered with
    ``Error: `` + `error` and never run); `raw` is the call's text as the model wrote it."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    error: str | None = None


# ---- tagged -----------------------------------------------------------------------------------------------------


def parse_tagged(turn_text: str) -> ToolCall | None:
    """The ``python`` call of a tagged turn: the LAST ``<code>…</code>`` block, only when it ends the turn
    (trailing whitespace allowed); None when the turn ends otherwise (then the turn is the answer).

    A Markdown fence inside the block (```` ```python\\n…\\n``` ````) is stripped. Empty code is a malformed call
    with error ``empty code block``.

    >>> parse_tagged("<code>```python\\nprint(1)\\n```</code>").arguments["code"]
    'print(1)'
    >>> parse_tagged("<code> </code>").error
    'empty code block'
    >>> parse_tagged("<answer>42</answer>") is None
    True
    """
    body = turn_text.rstrip()
    if not body.endswith(TAGGED_STOP):
        return None
    start = body.rfind(_CODE_OPEN, 0, len(body) - len(TAGGED_STOP))
    if start < 0:
        return None
    raw = body[start:]
    code = body[start + len(_CODE_OPEN) : len(body) - len(TAGGED_STOP)]
    fenced = _FENCE.match(code)
    if fenced:
        code = fenced.group("body")
    if not code.strip():
        return ToolCall("python", {"code": code}, raw, error="empty code block")
    return ToolCall("python", {"code": code}, raw)


def render_tagged_result(result: str) -> str:
    """The environment's answer to a tagged call: exactly ``<output>`` + result + ``</output>``."""
    return f"<output>{result}</output>"


# ---- chat (Hermes / Qwen2.5) ------------------------------------------------------------------------------------


def parse_chat(turn_text: str) -> ToolCall | None:
    """The LAST ``<tool_call>{json}</tool_call>`` of a chat turn, or None when the turn has none (the answer).

    The JSON must be an object with a string ``name`` and an object ``arguments`` (a JSON string holding an object
    is accepted too, as some models write it). Otherwise the call is malformed, its error says why, e.g.
    ``tool call is not valid JSON: Expecting value at line 1 column 1`` or ``tool call has no "name"``.

    >>> parse_chat('<tool_call>\\n{"name": "python", "arguments": {"code": "print(1)"}}\\n</tool_call>').name
    'python'
    >>> parse_chat("<tool_call>{oops}</tool_call>").error.startswith("tool call is not valid JSON")
    True
    """
    matches = list(_TOOL_CALL.finditer(turn_text))
    if not matches:
        return None
    raw, body = matches[-1].group(0), matches[-1].group("body").strip()
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", {}, raw, error=f"tool call is not valid JSON: {exc.msg} at line {exc.lineno} column "
                        f"{exc.colno}")  # fmt: skip
    if not isinstance(call, dict):
        return ToolCall("", {}, raw, error=f"tool call must be a JSON object, got {type(call).__name__}")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", {}, raw, error='tool call has no "name" (a non-empty string)')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, raw, error='tool call "arguments" must be a JSON object')
    return ToolCall(name, arguments, raw)


def render_chat_result(result: str, tokenizer: Any = None) -> str:
    """The environment's text after a chat turn that ended with the model's EOS token: the rest of the template's
    line after that EOS, the tool message holding `result`, and the next assistant turn's generation prompt.

    Rendered by the tokenizer's own chat template when it can render a ``tool`` message (`chat_tool_suffix`);
    otherwise Qwen2.5's literal rendering, QWEN_TOOL_MESSAGE:
    ``\\n<|im_start|>user\\n<tool_response>\\n{result}\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``.
    """
    if tokenizer is not None:
        rendered = chat_tool_suffix(tokenizer, result)
        if rendered is not None:
            return rendered
    return QWEN_TOOL_MESSAGE.format(result=result)


def chat_tool_suffix(tokenizer: Any, result: str) -> str | None:
    """What the tokenizer's chat template writes after an assistant turn's EOS token for a tool message holding
    `result` plus the next generation prompt; None when the template has no chat template, fails on role
    ``tool``, or leaves the result out (then it cannot render tool messages)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    reply = "\x00ASSISTANT\x00"
    head = [{"role": "user", "content": "?"}, {"role": "assistant", "content": reply}]
    try:
        before = tokenizer.apply_chat_template(head, tokenize=False, add_generation_prompt=False)
        after = tokenizer.apply_chat_template(
            [*head, {"role": "tool", "content": result}], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template that rejects role "tool" (or this conversation): use the literal rendering
        return None
    if not isinstance(before, str) or not isinstance(after, str) or not after.startswith(before):
        return None
    added = after[len(before) :]
    if result not in added or reply not in before:
        return None
    # The text the template puts after the assistant's content; the model sampled its EOS itself.
    tail = before[before.rindex(reply) + len(reply) :]
    eos = getattr(tokenizer, "eos_token", None)
    if isinstance(eos, str) and eos and tail.startswith(eos):
        tail = tail[len(eos) :]
    return tail + added


def without_calls(turn_text: str, tool_format: str) -> str:
    """The turn's text less its tool calls, one a limit cut off included (from its opener on): what is scored when
    an episode ends on a turn that is not an answer. Code is never the answer: read as one, ``print(4821*317 -
    1528257)`` or a ``<tool_call>`` whose code holds ``x = 1528257`` was paid as the answer 1528257 by the math check,
    though the model never gave one.

    >>> without_calls("It is 42. <code>print(6*7)</code>", TAGGED)
    'It is 42. '
    >>> without_calls('Sure.<tool_call>{"name": "python", "arguments": {"code": "x = 15', CHAT)
    'Sure.'
    >>> without_calls("It is 42.\\n```python\\nprint(6*7)\\n```\\n```output", MARKDOWN)
    'It is 42.\\n'
    """
    if tool_format == MARKDOWN:
        return _without_markdown_calls(turn_text)
    opener, closer = (_CODE_OPEN, TAGGED_STOP) if tool_format == TAGGED else ("<tool_call>", "</tool_call>")
    kept, at = [], 0
    while (start := turn_text.find(opener, at)) >= 0:
        kept.append(turn_text[at:start])
        end = turn_text.find(closer, start + len(opener))
        if end < 0:  # a call the turn's limit cut off: the rest is its code
            return "".join(kept)
        at = end + len(closer)
    return "".join(kept) + turn_text[at:]


# ---- markdown (Qwen2.5-Math TIR, ToRA, ToRL) ---------------------------------------------------------------------


def parse_markdown(turn_text: str) -> ToolCall | None:
    """The ``python`` call of a markdown turn: the LAST ```` ```python ```` block before the ```` ```output ```` that
    ends the turn (trailing whitespace allowed); None when the turn ends otherwise (then the turn is the answer).

    The block's closing fence may be missing (```` ```python\\nprint(1)\\n```output ````: the code runs to
    ```` ```output ````). No python block before ```` ```output ````, or empty code, is a malformed call.

    >>> parse_markdown("Let me compute.\\n```python\\nprint(6*7)\\n```\\n```output").arguments["code"]
    'print(6*7)\\n'
    >>> parse_markdown("```output").error
    'no ```python block before ```output'
    >>> parse_markdown("The answer is 42.") is None
    True
    """
    body = turn_text.rstrip()
    if not body.endswith(MARKDOWN_STOP):
        return None
    before = body[: -len(MARKDOWN_STOP)]
    opened = list(_PYTHON_FENCE.finditer(before))
    if not opened:
        return ToolCall("python", {}, body, error="no ```python block before ```output")
    start = opened[-1]
    closed = _CLOSING_FENCE.search(before, start.end())  # words between the block and ```output are not code
    code = before[start.end() : closed.start() if closed else len(before)]
    if not closed:  # ```output right after the code: a fence left on the last line is no code
        code = code.rstrip()
        code = code[:-3] if code.endswith("```") else code
    code = _dedented(code.replace("\r\n", "\n"), start.group("indent"))
    if not code.strip():
        return ToolCall("python", {"code": code}, body[start.start() :], error="empty code block")
    return ToolCall("python", {"code": code}, body[start.start() :])


def _dedented(code: str, indent: str) -> str:
    """A block's code without the indent its opening fence had (a block in a list item)."""
    if not indent:
        return code
    return "".join(line[len(indent) :] if line.startswith(indent) else line for line in code.splitlines(True))


def _without_markdown_calls(turn_text: str) -> str:
    """A markdown turn less its python blocks (each up to its closing fence, an unclosed one to the end) and the
    ```output that asked to run one."""
    kept, at = [], 0
    while (opened := _PYTHON_FENCE.search(turn_text, at)) is not None:
        kept.append(turn_text[at : opened.start()])
        closed = _CLOSING_FENCE.search(turn_text, opened.end())
        if closed is None:
            return "".join(kept)
        at = closed.end()
    rest, tail = turn_text[at:], turn_text[at:].rstrip()
    if tail.endswith(MARKDOWN_STOP):  # the request to run the block, and the line break before it
        rest = tail[: -len(MARKDOWN_STOP)]
        rest = rest if rest.strip() else ""
    return "".join(kept) + rest


def render_markdown_result(result: str) -> str:
    """The environment's answer to a markdown call, after the model's ```` ```output ````: ``\\n`` + result +
    ``\\n```\\n`` (the output block, closed, and the line after it)."""
    return f"\n{result}\n```\n"


# ---- the three formats alike ------------------------------------------------------------------------------------


def parse_call(turn_text: str, tool_format: str) -> ToolCall | None:
    """The tool call that ends a turn written in `tool_format`, or None (the turn is the answer)."""
    if tool_format == TAGGED:
        return parse_tagged(turn_text)
    if tool_format == MARKDOWN:
        return parse_markdown(turn_text)
    return parse_chat(turn_text)


def render_result(result: str, tool_format: str, tokenizer: Any = None) -> str:
    """The environment's text for a call's `result` in `tool_format` (chat: through `tokenizer`'s template)."""
    if tool_format == TAGGED:
        return render_tagged_result(result)
    if tool_format == MARKDOWN:
        return render_markdown_result(result)
    return render_chat_result(result, tokenizer)


def turn_stops(tool_format: str) -> tuple[str, ...]:
    """The stop strings that end a turn on its tool call in `tool_format`."""
    return {TAGGED: (TAGGED_STOP,), MARKDOWN: (MARKDOWN_STOP,)}.get(tool_format, CHAT_STOPS)


# ---- results ----------------------------------------------------------------------------------------------------


def cut_result(text: str, max_chars: int) -> str:
    """`text` when it has at most `max_chars` characters (or max_chars <= 0: no limit); else its head and tail
    joined by CUT_MARK (``...``), `max_chars` characters in all, the head getting the odd one."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    keep = max(max_chars - len(CUT_MARK), 0)
    head, tail = (keep + 1) // 2, keep // 2
    return text[:head] + CUT_MARK + (text[len(text) - tail :] if tail else "")


def result_text(response: Any, timeout_s: float | None = None) -> str:
    """The python tool's result from a reward-service ExecuteResponse (status, stdout, stderr, exit_code):

    * ``ok``: stdout with one trailing newline removed (``print(42)`` gives ``42``);
    * ``timeout``: ``Error: timed out after {timeout_s:g}s`` (``Error: timed out`` when the limit is unknown);
    * ``memory_limit``: ``Error: memory limit exceeded``;
    * ``output_limit`` / ``process_limit``: ``Error: output limit exceeded`` / ``Error: process limit exceeded``;
    * other errors: ``Error: `` + the last non-empty line of stderr (``Error: ZeroDivisionError: division by
      zero``), else ``Error: exit code N`` or ``Error: `` + the status.

    Output that is not UTF-8 (stdout_encoding base64) reads ``Error: output is not UTF-8 text``.
    """
    status = response.status
    if status == "ok":
        if getattr(response, "stdout_encoding", "utf-8") == "base64":
            return "Error: output is not UTF-8 text"
        out: str = response.stdout
        return out[:-1] if out.endswith("\n") else out
    if status == "timeout":
        return f"Error: timed out after {timeout_s:g}s" if timeout_s else "Error: timed out"
    if status in ("memory_limit", "output_limit", "process_limit"):
        return f"Error: {status.split('_')[0]} limit exceeded"
    lines = [line.strip() for line in response.stderr.splitlines() if line.strip()]
    if lines:
        return f"Error: {lines[-1]}"
    has_code = response.HasField("exit_code") if hasattr(response, "HasField") else response.exit_code is not None
    return f"Error: exit code {response.exit_code}" if has_code else f"Error: {status}"


def error_text(reason: str) -> str:
    """The result the model sees for a call that did not run (malformed, unknown tool, a plug-in's exception):
    ``Error: `` + reason."""
    return f"Error: {reason}"
