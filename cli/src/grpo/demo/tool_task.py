"""The tool demo's task: multiplication too big for the tiny model, easy with the python tool (pure, seeded, no torch).

A prompt is the bare product `4821*317=` (a has 4–5 digits, b 3–4). The worked episode, in the tagged tool
format (grpo.common.tool_formats), calls the tool once and copies its output into the answer:

    4821*317=<code>print(4821*317)</code><output>1528257</output><answer>1528257</answer>

The first and last parts are the model's turns, `<output>…</output>` is the environment's. The gold answer is a
plain integer string, so the reward service's math verifier judges the last turn's `<answer>N</answer>`.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from dataclasses import dataclass

from grpo.common.tool_formats import TAGGED_STOP, parse_tagged, render_tagged_result
from grpo.demo.task import draw_splits, is_correct, write_data_files

A_RANGE = (1000, 99999)
B_RANGE = (100, 9999)
# Longest turns (with EOS where the turn ends with one): the call is 30 tokens, the answer 12; the result 26.
TURN_TOKENS = 32
RESULT_TOKENS = 26
MAX_PROMPT_TOKENS = 11


@dataclass(frozen=True)
class Problem:
    """One multiplication problem."""

    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a}*{self.b}="

    @property
    def gold(self) -> str:
        return str(self.a * self.b)

    @property
    def key(self) -> tuple[int, int]:
        return (self.a, self.b)

    @property
    def code(self) -> str:
        """The program the worked episode runs."""
        return f"print({self.a}*{self.b})"


def worked_segments(problem: Problem) -> list[dict[str, str]]:
    """The SFT target as segments: the call (assistant), its result (tool, never trained), the answer (assistant)."""
    return [
        {"role": "assistant", "content": f"<code>{problem.code}{TAGGED_STOP}"},
        {"role": "tool", "content": render_tagged_result(problem.gold)},
        {"role": "assistant", "content": f"<answer>{problem.gold}</answer>"},
    ]


def worked_episode(problem: Problem) -> str:
    """The whole worked episode after the prompt, as one text."""
    return "".join(s["content"] for s in worked_segments(problem))


class Unsupported(ValueError):
    """A program the in-process evaluator does not run (anything but print of integer + - * arithmetic)."""


def _value(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        left, right = _value(node.left), _value(node.right)
        if max(abs(left), abs(right)) >= 10**12:
            raise Unsupported("operands too large")
        return left + right if isinstance(node.op, ast.Add) else left - right if isinstance(node.op, ast.Sub) \
            else left * right  # fmt: skip
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    raise Unsupported(f"not integer arithmetic: {ast.dump(node)[:60]}")


def run_product(code: str) -> str:
    """What the python tool prints for `print(<integer + - * arithmetic>)`, as its result (one trailing newline
    removed); any other program gives an `Error: …` result. The in-process evaluation of the cold start uses this
    instead of the sandbox: for the programs the model writes for this task (print of a product, possibly with
    wrong digits) the result is the sandbox's; a program it cannot run reads as an error, as a broken one would.
    """
    try:
        tree = ast.parse(code.strip(), mode="exec")
    except SyntaxError as exc:
        return f"Error: SyntaxError: {exc.msg}"
    body = tree.body
    try:
        if (len(body) != 1 or not isinstance(body[0], ast.Expr) or not isinstance(call := body[0].value, ast.Call)
                or not isinstance(call.func, ast.Name) or call.func.id != "print" or len(call.args) != 1
                or call.keywords):  # fmt: skip
            raise Unsupported("only print(<arithmetic>) is evaluated in-process")
        return str(_value(call.args[0]))
    except Unsupported as exc:
        return f"Error: {exc}"


def tool_answer(turn_text: str) -> str | None:
    """The environment's text after a model turn: the rendered result when the turn ends with a call, else None."""
    call = parse_tagged(turn_text)
    if call is None:
        return None
    return render_tagged_result(f"Error: {call.error}" if call.error else run_product(call.arguments["code"]))


def _pairs(rng: random.Random) -> Iterator[Problem]:
    while True:
        yield Problem(rng.randint(*A_RANGE), rng.randint(*B_RANGE))


def is_eval(problem: Problem, seed: int, eval_fraction: float) -> bool:
    """Deterministic split by a hash of the operands: a pair is eval or train for every caller, never both."""
    return random.Random(f"tool:{seed}:{problem.a}:{problem.b}").random() < eval_fraction


@dataclass(frozen=True)
class Splits:
    """Disjoint train problems (SFT episodes first, then GRPO prompts) and held-out eval problems."""

    sft: list[Problem]
    grpo: list[Problem]
    eval: list[Problem]


def make_splits(
    n_sft: int = 2048, n_grpo: int = 4096, n_eval: int = 512, seed: int = 0, eval_fraction: float = 0.1
) -> Splits:
    """Seeded splits; eval problems are never in train (the eval side of the hash split), no duplicates."""
    train, held = draw_splits(_pairs(random.Random(f"tool:{seed}")), lambda p: is_eval(p, seed, eval_fraction),
                              n_sft + n_grpo, n_eval)  # fmt: skip
    return Splits(sft=train[:n_sft], grpo=train[n_sft:], eval=held)


def prompt_rows(problems: list[Problem], prefix: str) -> list[dict[str, object]]:
    """Trainer data rows: the prompt, task_type math, and the math verifier's gold (it reads the last turn)."""
    return [
        {"id": f"{prefix}-{i}", "prompt": p.prompt, "task_type": "math", "checks": {"math": {"gold": p.gold}}}
        for i, p in enumerate(problems)
    ]


def sft_rows(problems: list[Problem]) -> list[dict[str, object]]:
    """Trainer SFT rows: prompt plus the worked episode as `response` segments."""
    return [
        {**row, "response": worked_segments(p)} for row, p in zip(prompt_rows(problems, "sft"), problems, strict=True)
    ]


def check_answer(episode_text: str, gold: str) -> bool:
    """The answer of an episode is its last turn's: text after the last tool result (a result never counts)."""
    last = episode_text.rsplit("</output>", 1)[-1]
    return is_correct(last, gold)


def data_files(seed: int = 0) -> dict[str, list[dict[str, object]]]:
    """The rows services/trainer/configs/tool.yaml trains on (services/trainer/configs/data/tool-*.jsonl)."""
    splits = make_splits(n_sft=1024, n_grpo=2048, n_eval=256, seed=seed)
    return {"tool-sft.jsonl": sft_rows(splits.sft), "tool-train.jsonl": prompt_rows(splits.grpo, "train"),
            "tool-eval.jsonl": prompt_rows(splits.eval, "eval")}  # fmt: skip


if __name__ == "__main__":  # python -m grpo.demo.tool_task services/trainer/configs/data
    write_data_files(data_files())
