"""R1's whole recipe as a user runs it (`grpo up -c deploy/local/r1-quick.yaml`), and the checks its tests share
(tests/e2e/test_up_r1.py, tests/faults/test_r1_stage_resume.py): each stage's outcome, the books of every stage
that publishes tasks, and the rejection-sampling data against the filters it promises."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
QUICK_STACK = ROOT / "deploy" / "local" / "r1-quick.yaml"
MODES = ["sft", "grpo", "rejection_sampling", "sft", "grpo"]


def quick_trainer() -> dict[str, Any]:
    """The quick stack's trainer section."""
    return dict(yaml.safe_load(QUICK_STACK.read_text())["trainer"])


def stage_values(trainer: dict[str, Any], index: int) -> dict[str, Any]:
    """Stage `index`'s (1-based) settings as the run resolves them: the section overridden by the stage's own."""
    return {**{k: v for k, v in trainer.items() if k != "stages"}, **trainer["stages"][index - 1]}


def stage_dir(run_dir: Path, index: int) -> Path:
    return run_dir / f"stage-{index}-{MODES[index - 1]}"


def grpo_up(runs_dir: Path, log: Path, stack: Path = QUICK_STACK) -> subprocess.Popen[bytes]:
    """`grpo up -c <stack> --no-live` from the repository root (the stack's data paths are relative to it), the
    run folder under runs_dir; stdout and stderr to `log` (appended: a restarted run keeps one log)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    cmd = ["grpo", "--runs-dir", str(runs_dir), "up", "-c", str(stack), "--no-live"]
    with log.open("a") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rows_by_id(path: Path) -> dict[str, dict[str, Any]]:
    return {str(r["id"]): r for r in read_jsonl(path)}


def check_books(folder: Path) -> dict[str, Any]:
    """A GRPO or rejection-sampling stage's books: every step balanced (published = used + dropped + in flight),
    each step logged once, and every task resolved at most once in the ledger. Returns the last step's row."""
    from grpo.trainer.ledger import read_ledger

    rows = [r for r in read_jsonl(folder / "metrics.jsonl") if "tasks/balanced" in r]
    assert rows, f"{folder}: no step logged its books"
    unbalanced = [r["step"] for r in rows if r["tasks/balanced"] != 1.0]
    assert not unbalanced, f"{folder}: the books did not balance at steps {unbalanced}"
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"{folder}: a step logged twice: {Counter(steps).most_common(3)}"
    ids = [str(e["task_id"]) for e in read_ledger(folder / "ledger")]
    assert ids, f"{folder}: an empty ledger"
    twice = [tid for tid, n in Counter(ids).items() if n > 1]
    assert not twice, f"{folder}: task(s) resolved twice in the ledger: {twice[:5]}"
    return rows[-1]


def normalised(text: str) -> str:
    """What de-duplication compares: the text stripped, runs of whitespace as one space."""
    return re.sub(r"\s+", " ", text.strip())


def check_rs_data(folder: Path, values: dict[str, Any], prompts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The rejection-sampling stage's data.jsonl is exactly what its settings promise, checked row by row with the
    reward service's own verifiers (not the stage's recorded scores alone): every required component passes, at
    most rs_keep_per_prompt answers per prompt, no answer twice per prompt (whitespace aside), no (prompt, sample)
    twice, none cut off by the length limit, each row's prompt, task_type and checks those of its training row, and
    the counts are the summary's. Returns the rows."""
    from grpo.common.tiny_model import ensure_tiny_model
    from grpo.demo.task import is_correct
    from grpo.reward.verifiers.format import format_reward
    from grpo.trainer.export import load_tokenizer

    tokenizer = load_tokenizer(str(ensure_tiny_model()))  # the recipe's model: `tiny`
    rows = read_jsonl(folder / "data.jsonl")
    summary = json.loads((folder / "rs_summary.json").read_text())
    outcome = json.loads((folder / "stage.json").read_text())
    assert len(rows) == summary["kept"] == outcome["kept"], (len(rows), summary, outcome)
    assert summary["sampled"] == summary["prompts"] * values["rs_samples"], summary
    assert summary["prompts"] == values["rs_prompts"], summary
    required = values["rs_require"]
    per_prompt: Counter[str] = Counter()
    texts: set[tuple[str, str]] = set()
    samples: set[tuple[str, int]] = set()
    for row in rows:
        prov = row["provenance"]
        pid, index = str(prov["prompt_id"]), int(prov["sample_index"])
        assert row["id"] == f"{pid}#{index}" and 0 <= index < values["rs_samples"], row
        source = prompts[pid]
        assert (row["prompt"], row["task_type"], row["checks"]) == (source["prompt"], source["task_type"],
                                                                   source["checks"]), row  # fmt: skip
        for name in required:
            assert prov["components"][name] >= values.get("rs_pass_score", 1.0), (name, row)
        if "format" in required:
            assert format_reward(row["response"]).score == 1.0, row
        if "math" in required:
            assert is_correct(row["response"], source["checks"]["math"]["gold"]), row
        assert prov["tokens"] <= values["max_new_tokens"], row
        if "truncated" in values.get("rs_filters", []):
            assert prov["ended"] == "stop", row  # the stage's own record: stopped on EOS, not cut
            if prov["tokens"] == values["max_new_tokens"] and "\ufffd" not in row["response"]:
                # And the text's own evidence: at the limit it must have ended with EOS, so its text is one token
                # shorter. (Only at the limit, and only where the text holds no U+FFFD: a byte the model sampled
                # that decodes to no character does not encode back token for token, so such a text's count says
                # nothing; stop 46's CI failed on one.)
                text_tokens = len(tokenizer.encode(row["response"], add_special_tokens=False))
                assert text_tokens + 1 == prov["tokens"], (text_tokens, row)
        assert (pid, index) not in samples, f"sample {index} of {pid} kept twice"
        samples.add((pid, index))
        assert (pid, normalised(row["response"])) not in texts, f"{pid}: the same answer kept twice: {row}"
        texts.add((pid, normalised(row["response"])))
        per_prompt[pid] += 1
    assert max(per_prompt.values(), default=0) <= values["rs_keep_per_prompt"], per_prompt.most_common(3)
    assert len(per_prompt) + summary["prompts_with_none"] == summary["prompts"], (len(per_prompt), summary)
    assert sum(int(n) * int(k) for k, n in summary["kept_per_prompt"].items()) == len(rows), summary
    return rows
