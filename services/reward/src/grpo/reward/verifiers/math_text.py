"""What math-verify reads from a completion or a gold, and how that text is rewritten before it reads it.

`answer_region` picks the text an answer is judged on (the last `<answer>` block), `after_correction`,
`final_answer_sentence` and `after_marker` narrow it to the final answer, and `normalise` rewrites notation
math-verify misreads (escaped dollars, spaced thousands, an answer label in a box, scientific notation in plain text,
repeating decimals, `°`, `\\lor` between values). `keep_variables` keeps letters after a number as variables where the
gold has some. `hedge` finds an answer that offers several values ("either 3 or 4"), `math_spans` the math in a text.
Parsing and comparing are grpo.reward.verifiers.math's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal

import sympy
from latex2sympy2_extended.math_normalization import units_regex

from grpo.reward.verifiers.format import tag_blocks

_GSM8K_MARKER = re.compile(r"(?:^|\n)\s*####\s*(?=\S[^\n]*$)")  # the last line's "#### 72"
_FBOX = re.compile(r"\\fbox(?=\s*\{)")
_BOXES_REWRITTEN = 16  # in_boxes: the last boxes, where math-verify reads an answer
BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Between two boxes, a self-correction ("\\boxed{3}, no wait: \\boxed{4}") makes the last box the answer; without
# one, nearby boxes joined by commas or "and" are one answer with several parts (math-verify's rule).
_CORRECTION = re.compile(
    r"\b(?:wait|no|actually|instead|rather|correction|sorry|oops|mistaken?|wrong|incorrect|error|hmm+|re-?check"
    r"|reconsider)\b",
    re.IGNORECASE,
)
# Upright constants (ISO style): math-verify reads \mathrm{e} as text and then loses the rest of the expression,
# so `1 - \frac{1}{\mathrm{e}}` and `1 + \frac{1}{\mathrm{e}}` both became 1.
_UPRIGHT_CONSTANT = re.compile(r"\\(?:mathrm|operatorname)\s*\{\s*(e|i|\\pi)\s*\}")
# math-verify's "final answer ... is" sentence (its priority-50 pattern, below a box at our priority 0).
_FINAL_ANSWER = re.compile(r"final answer.{0,100}?\s+is\b", re.IGNORECASE | re.DOTALL)
# `\$18.90` is a dollar sign, not a math delimiter (`\\$` is a line break and then one).
ESCAPED_DOLLAR = re.compile(r"(?<!\\)\\\$")
_TRAILING_POINT = re.compile(r"(?<=\d)\.(?=\s*\})")  # \boxed{72.}: the sentence's full stop, not a decimal point
_DIGIT_GROUP_SPACE = re.compile(r"(?<=\d)\\[, ](?=\d{3}(?!\d))")  # 1\,000 and 1\ 000: thousands, not 1·000
# `\\boxed{1 000 000}` was the product 1·0·0 (0; `\\boxed{12 345}` was 4140): in a box, plain spaces group thousands.
# Also in `$...$`, `\\(...\\)` and `\\[...\\]` (`The answer is $1 000$.` was 0). Not after `_` or `^`: `x_1 234`.
_SPACED_THOUSANDS = re.compile(r"(?<![\d.^_])\d{1,3}(?: \d{3})+(?!\d)")
# A math span; each try stops at the next delimiter, so unclosed ones cost linear time. `$$` pairs with `$$`.
_MATH_SPAN = re.compile(r"(\$\$?)[^$]*\1|\\[(\[](?:[^\\$]|\\(?![()\[\]]))*\\[)\]]")
# `\\boxed{\\text{The answer is } 3}`: math-verify read the label as a symbol times 3 (theansweris·3), so a right
# answer scored 0. Only a label that says nothing else is dropped: `\\text{at most } 3` or `\\text{not } 3` stay.
_ANSWER_LABEL = re.compile(
    r"^\s*\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{\s*(?:(?:so|thus|hence|therefore),?\s+)?(?:the\s+)?"
    r"(?:final\s+)?answer\s*(?:is\s*:?|:|=)?\s*\}\s*(?=\S)",
    re.IGNORECASE,
)
# Scientific notation as plain text writes it (`1.2e3`, `2.5E-3`): math-verify read `1.2e3` as 1.2·e·3 and
# `The answer is 1.2e3.` as 1.2. Only a whole token outside math (no `$`, `\\(`, `\\[` or brace around it, no
# operator or letter beside it) with an exponent under 100; `2e`, `3e^{2}` and `e^{2e3}` keep Euler's e, and so does
# `2e-1` (2e − 1): a signed exponent after a whole number is scientific only with a capital E (`2E-3`).
_E_NOTATION = re.compile(r"(?<![^\s(=:])[+-]?(\d+)(\.\d+)?([eE])([+-]?)\d{1,2}(?=\s|[;:!?)]|[.,](?!\d)|$)")
# 0.\\overline{3}, 0.1\\overline{6}: math-verify reads the first as 0 and the second as 0.1·bar(6), so 1/3 was
# "incorrect" against the first and a gold written so was unparseable. \\varnothing is read as a symbol, not ∅.
_REPEATING = re.compile(r"(?<!\d)(\d*)\.(\d*)\s*\\overline\s*\{\s*(\d+)\s*\}")
_VARNOTHING = re.compile(r"\\varnothing(?![a-zA-Z])")
# math-verify strips a unit word from the end of what it reads (`units_regex`), and its list holds single letters and
# pairs (t, h, c, l, s, g, m, d, o, ab, bc): gold `4s` was 4 (so `\\boxed{4}` was paid) and `\\frac{1}{2}ab` was 1/2
# (so `\\frac{ab}{2}` scored 0). Longer ones (`5cm`, `3kg`) stay units. Those letters right after a digit or a brace,
# at the end of a box, a `$` span or the text, or before a `\\text{}` unit there (`2ab \\text{ cm}^2`).
_TRAILING_LETTERS = re.compile(
    r"(?<=[\d}])([a-z]|ab|bc)(?=\s*(?:\\(?:text|mathrm|mbox)\s*\{[^{}]*\}(?:\^\{?\d\}?)?\s*)?(?:\$|\\\)|\\\]|$))"
)
# `\\lor` and `\\vee` between values (`3 \\lor 4`, `x = 3 \\vee x = 4`): math-verify cannot read them, gave up on the box
# and read its last number instead, so `\\boxed{3 \\lor 4}` was paid for a gold 4. Written as `\\text{ or }`, which
# math-verify reads as the set of both (as `\\boxed{3 \\text{ or } 4}` always was). A logic formula (`p \\lor q`,
# `x_1 \\vee x_2`: no digit outside a subscript in some operand) stays as written, and is compared as text.
# Spacing and invisible delimiters latex2sympy cannot read: `4~\\text{cm}` (an unbreakable space; `~=` is math-verify's
# "approximately"), `\\left. 5 \\right.`, and a leading `\\approx` in a box (`\\boxed{\\approx 5}` states 5, as
# `x \\approx 5` does). math-verify then fell back to a number inside, which `_read_answer` no longer allows.
_TILDE = re.compile(r"(?<!\\)~(?!=)")
_INVISIBLE_DELIMITER = re.compile(r"\\(?:left|right)\s*\.")
_LEADING_APPROX = re.compile(r"^\s*\\approx(?![a-zA-Z])\s*(?=\S)")
_OR_SIGN = re.compile(r"\\(?:lor|vee)(?![a-zA-Z])")
_SUBSCRIPT = re.compile(r"_\s*(?:\{[^{}]*\}|\\?[a-zA-Z0-9])")
_DELIMITER = re.compile(r"\$|\\[(\[]|\\(?:boxed|fbox)\s*\{")
# `\\boxed{\\text{either } 3 \\text{ or } 4}`: "either" only announces the alternatives that follow, as a label does.
_EITHER = re.compile(r"^\s*\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{\s*either\s*\}\s*(?=\S)", re.IGNORECASE)
# A hedge: one answer that offers several values ("either 3 or 4", "3 (or 4)", "3, or possibly 4", "maybe 3, maybe 4",
# "3 and 4", "3, 4"). math-verify reads one of them (the first after "answer is", else the last), so a hedge was paid
# whenever that one was the gold, and a policy learns to hedge. Found on the text with its math unwrapped (`_plain`):
# values are tokens with a digit (`3`, `-1/2`, `\\frac{1}{2}`, `x = 3`) joined by "or", "and", a comma, or a "maybe".
_MODAL = r"(?:possibly|perhaps|maybe|probably|likely|alternatively|else|otherwise)"
_BOX_MARK = "\x00"  # where a box opened, in `_plain`'s text: a value ends there, a hedge may go on past it
_VALUE = re.compile(r"(?<![^\s,;(\x00])(?:[a-zA-Z]\s*=\s*)?[^\s,;()\d\x00]*\d[^\s,;()\x00]*+")
_LINK = (
    rf"\s*[,;]?\s*\(?\s*(?:(?:but\s+)?(?:or|and/or|and|&)\s+(?:{_MODAL}\s+)?|(?:but\s+)?{_MODAL}\s+)"
    r"|\s*[,;]\s*"
)
_HEDGE = re.compile(
    rf"(?:(?:either|{_MODAL})\s+)?{_VALUE.pattern}(?:(?:{_LINK})(?:\x00\s*)?{_VALUE.pattern}\s*\)?)+", re.IGNORECASE
)
# "3 and 4" and "3, 4" also list the parts of one answer in a sentence ("15, 5 more than before", "12 and 3 of them
# red"): without an "or" or a "maybe" they are a hedge only where the sentence ends with them ("The roots are 3 and 4.").
_DOUBT = re.compile(rf"\bor\b|\b{_MODAL}\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[\s)]*(?:[.!?;]?\s*$|[.!?;]\s|\n)")
_WRAPPED = re.compile(r"\\(?:text[a-z]*|math(?:rm|bf|it|sf)|mbox|operatorname)\s*\{([^{}]*)\}")
_ANSWER_WORD = re.compile(r"\banswer\b", re.IGNORECASE)
_MATH_SPACING = re.compile(r"\\[,;:! ]|\\q?quad(?![a-zA-Z])|~|\$|\\[()\[\]]|\\(?:left|right)(?![a-zA-Z])")
_UNWRAPPED_LEVELS = 8  # nesting depth unwrapped: `\\text{\\text{...}}` thousands deep must not cost quadratic time


def answer_region(completion: str, tag: str = "answer") -> str:
    """The text the final answer is extracted from: the last <answer> (`tag`) block's content, else everything."""
    tagged = tag_blocks(completion, tag)  # not a lazy regex: 40,000 `<answer>` took it 49 s
    if tagged:  # even when empty: falling back to everything let `<answer></answer>` pass off a box in <think>
        return completion[slice(*tagged[-1])].strip()
    return completion.strip()


def box_end(text: str, start: int) -> int:
    """Index just past the brace that closes the box whose content starts at `start` (len(text) if none)."""
    depth, i = 1, start
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return i


def after_correction(region: str) -> str:
    """The region from its last box on when the text before that box corrects the previous box."""
    boxes = list(BOX_START.finditer(region))
    if len(boxes) < 2:
        return region
    between = region[box_end(region, boxes[-2].end()) : boxes[-1].start()]
    return region[boxes[-1].start() :] if _CORRECTION.search(between) else region


def final_answer_sentence(region: str) -> str | None:
    """The region from its last "final answer ... is" sentence on, when that sentence follows the last box; else None.

    math-verify ranks a box above that sentence wherever they stand, so `\\boxed{5} (pairs) ... the final answer is
    $7$` was read as 5. Whichever comes last decides: a box after the sentence (or in it) still wins.
    """
    sentences = list(_FINAL_ANSWER.finditer(region))
    boxes = list(BOX_START.finditer(region))
    if not sentences or not boxes or boxes[-1].start() > sentences[-1].start():
        return None
    return region[sentences[-1].start() :]


def after_marker(text: str) -> str:
    """The answer part of a gold or an answer: what follows GSM8K's `####` marker on the last line (a whole
    solution, or `#### 72`), else all. A model trained on GSM8K ends so: its `#### 72` was read as text, 0."""
    marker = _GSM8K_MARKER.search(text)
    return text[marker.end() :] if marker else text


def normalise(text: str) -> str:
    """Notation math-verify misreads, rewritten before parsing: escaped dollars, `~` and `\\left.`, a leading `\\approx`
    in a box, thin or plain spaces grouping thousands in math, an answer label in a box, `\\lor` between values,
    scientific notation in plain text or alone in a box, `°`."""
    text = _UPRIGHT_CONSTANT.sub(r"\1", text.strip())
    text = _FBOX.sub(r"\\boxed", text)  # math-verify finds `\\fbox{3}` only inside `$...$`: elsewhere no answer
    text = ESCAPED_DOLLAR.sub("", text)  # its `$` opened a math span: `\$18.90` could not be read at all
    text = _TRAILING_POINT.sub("", text)
    text = _INVISIBLE_DELIMITER.sub("", _TILDE.sub(" ", text))
    text = in_boxes(text, lambda box: _LEADING_APPROX.sub("", box, count=1))
    text = _DIGIT_GROUP_SPACE.sub("", text)
    text = in_boxes(text, _without_answer_label)
    text = in_boxes(text, _joined_thousands)
    text = _MATH_SPAN.sub(lambda span: _joined_thousands(span.group()), text)
    text = in_boxes(text, _values_joined)
    text = _MATH_SPAN.sub(lambda span: _values_joined(span.group()), text)
    text = text if _DELIMITER.search(text) else _values_joined(text)
    text = in_boxes(text, _boxed_scientific)
    text = plain_scientific(text)
    text = _REPEATING.sub(_repeating_fraction, text)
    text = _VARNOTHING.sub(r"\\emptyset", text)
    return text.replace("°", "^\\circ")


def _joined_thousands(math: str) -> str:
    """Math with `1 000 000` written as one number: a space between digit groups is not a product there."""
    return _SPACED_THOUSANDS.sub(lambda number: number.group().replace(" ", ""), math)


def _without_answer_label(box: str) -> str:
    """A box's content without a leading `\\text{The answer is }` or `\\text{either}` label (the answer follows it)."""
    return _EITHER.sub("", _ANSWER_LABEL.sub("", box, count=1), count=1)


def _values_joined(math: str) -> str:
    """Math with `\\lor`/`\\vee` between values written `\\text{ or }`, which math-verify reads as the set of them."""
    operands = _OR_SIGN.split(math)
    if len(operands) < 2 or not all(re.search(r"\d", _SUBSCRIPT.sub("", operand)) for operand in operands):
        return math
    return _OR_SIGN.sub(r" \\text{ or } ", math)


def _boxed_scientific(box: str) -> str:
    """A box holding scientific notation alone (`\\boxed{1.2e3}`) as the decimal it denotes, as in plain text; a box
    with more in it (`\\boxed{3e^{2}}`, `\\boxed{2e}`) keeps Euler's e."""
    match = _E_NOTATION.fullmatch(box.strip())
    return _scientific_decimal(match) if match else box


def plain_scientific(text: str) -> str:
    """The text with scientific notation outside math (`1.2e3`, `2.5E-3`) written as the decimal it denotes.

    One pass: the delimiters and braces before each candidate are counted from the previous one on.
    """
    parts: list[str] = []
    last, dollars, spans, braces = 0, 0, 0, 0
    for match in _E_NOTATION.finditer(text):
        gap = text[last : match.start()]
        dollars += gap.count("$") - gap.count("$$")  # `$$` opens or closes one span, as `$` does
        spans += gap.count("\\(") + gap.count("\\[") - gap.count("\\)") - gap.count("\\]")
        braces += gap.count("{") - gap.count("}")
        in_math = dollars % 2 or spans > 0 or braces > 0
        parts += [gap, match.group() if in_math else _scientific_decimal(match)]
        last = match.end()
    return "".join([*parts, text[last:]])


def _scientific_decimal(match: re.Match[str]) -> str:
    """`1.2e3` as `1200`, exactly; `2e-1` (whole number, small e, signed exponent) as it is: 2e − 1 in LaTeX."""
    if match.group(3) == "e" and match.group(4) and not match.group(2):
        return match.group()
    return format(Decimal(match.group()), "f")


def _repeating_fraction(match: re.Match[str]) -> str:
    """`1.2\\overline{34}` as the exact fraction it denotes, `\\frac{p}{q}` in lowest terms."""
    whole, fixed, period = match.group(1) or "0", match.group(2), match.group(3)
    denominator = 10 ** len(fixed) * (10 ** len(period) - 1)
    value = int(whole) + sympy.Rational(int(fixed + period) - int(fixed or "0"), denominator)
    return f"\\frac{{{value.p}}}{{{value.q}}}"


def keep_variables(text: str) -> str:
    """Trailing letters after a number (`4s`, `\\frac{1}{2}ab`) braced as a factor, `4{s}`, which math-verify keeps.

    Only for an algebraic gold (verify_math): against a number, `\\boxed{5m}` is 5 metres, as math-verify reads it.
    """
    text = in_boxes(text, lambda box: _TRAILING_LETTERS.sub(_braced_unit, box))
    return _TRAILING_LETTERS.sub(_braced_unit, text)


def in_boxes(text: str, rewrite: Callable[[str], str]) -> str:
    """The text with the content of its last closed `\\boxed{}`/`\\fbox{}` boxes rewritten (inner ones as part of theirs).

    Only the last few: math-verify reads the last box and the few joined to it, and finding the end of every box of
    thousands (`\\boxed{1 \\boxed{1 ...`, never closed) took minutes.
    """
    for box in list(BOX_START.finditer(text))[-_BOXES_REWRITTEN:][::-1]:
        end = box_end(text, box.end()) - 1  # the box's closing brace
        if text[end : end + 1] == "}":
            text = text[: box.end()] + rewrite(text[box.end() : end]) + text[end:]
    return text


def _braced_unit(match: re.Match[str]) -> str:
    """Letters math-verify would strip as a unit, braced; others (`3i`, `2xy`) as they are."""
    letters = match.group(1)
    return f"{{{letters}}}" if units_regex.search(f"0{letters}") else letters


def math_spans(text: str) -> list[tuple[int, int]]:
    """Where the last few closed boxes and delimited math spans (`$...$`, `\\(...\\)`, `\\[...\\]`) of a text are, by
    their ends (the last `_BOXES_REWRITTEN`: math-verify reads an answer from the end)."""
    spans = [span.span() for span in _MATH_SPAN.finditer(text)]
    for box in list(BOX_START.finditer(text))[-_BOXES_REWRITTEN:]:
        end = box_end(text, box.end())
        if text[end - 1 : end] == "}":
            spans.append((box.start(), end))
    return sorted(spans, key=lambda span: span[1])[-_BOXES_REWRITTEN:]


def hedge(region: str, reading: str) -> list[str] | None:
    """The values an answer offers when what math-verify read from it (`reading`) is one of several joined in a hedge
    ("The answer is either 3 or 4."), else None.

    The hedge must hold the reading where math-verify took it from: its first occurrence after the last box (or, with
    no box, the last "answer"), and its last occurrence. "\\boxed{2}; it takes 2 or 3 steps" and "n is 3 or 4; n = 4
    works" are no hedges. Whether the values differ (`4 (or 2^2)` says one value twice) is math.py's to judge.
    """
    text, said = _plain(region), _compact(_alternative(reading))
    hits = [value.start() for value in _VALUE.finditer(text) if said and said in _forms(value.group())]
    if not hits:
        return None
    anchor = _anchor(text)
    first = min((hit for hit in hits if hit >= anchor), default=hits[-1])
    for match in _HEDGE.finditer(text):
        values = [_alternative(value.group()) for value in _VALUE.finditer(match.group())]
        ends = _DOUBT.search(match.group()) or _SENTENCE_END.match(text, match.end())
        if match.start() <= first and hits[-1] < match.end() and ends and len({_compact(v) for v in values}) > 1:
            return values
    return None


def _anchor(text: str) -> int:
    """Where math-verify looks for the answer in plain text: its last box, else its last "answer" (0: anywhere)."""
    box = text.rfind(_BOX_MARK)
    if box >= 0:
        return box
    answers = list(_ANSWER_WORD.finditer(text))
    return answers[-1].end() if answers else 0


def _plain(text: str) -> str:
    """Text with its math unwrapped to words and values: no `$`, `\\text{}` or spacing, `\\lor` as "or", and each box
    opening as `_BOX_MARK` (its closing brace stays)."""
    for _ in range(_UNWRAPPED_LEVELS):
        unwrapped = _WRAPPED.sub(r" \1 ", text)
        if unwrapped == text:
            break
        text = unwrapped
    text = BOX_START.sub(f" {_BOX_MARK} ", _OR_SIGN.sub(" or ", text))
    return _MATH_SPACING.sub(" ", text)


def _alternative(token: str) -> str:
    """One value of a hedge as written, without the sentence's full stop or a bracket it does not open (a box's `}`
    left from unwrapping, the `)` of "(1, 2)." that math-verify's number reader keeps)."""
    token = token.strip().rstrip(".:!?")
    while token[-1:] in ("}", ")") and token.count(token[-1]) > token.count("{" if token[-1] == "}" else "("):
        token = token[:-1].rstrip(".:!?")
    return token


def _compact(text: str) -> str:
    return re.sub(r"\s+|\$", "", text).rstrip(".")


def _forms(token: str) -> tuple[str, str]:
    """A value as math-verify may have read it: whole (`x=3`), or what follows its `=` (`3`)."""
    value = _alternative(token)
    return _compact(value), _compact(value.rsplit("=", 1)[-1])
