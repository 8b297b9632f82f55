"""Tool settings: defaults, the episode every task carries (training and evaluation), and the refusals at start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.assemble import fit_prompts, learner_config, load_grpo_data, overlong_buffer, resolve_algo, task_spec
from grpo.trainer.config import parse_settings
from grpo.trainer.data import DataError, load_rows
from grpo.trainer.publisher import build_task


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "12345*678=", "gold": "8369910"}\n')
    return path


def test_no_tools_no_episode(data: Path) -> None:
    s = parse_settings(["--train-data", str(data)])
    assert (s.tools, s.tool_format, s.max_turns, s.max_tool_calls, s.max_episode_tokens) == ([], "tagged", 4, None, 0)
    assert (s.tool_timeout_s, s.tool_output_chars, s.tool_memory_mb) == (5.0, 1000, 0)
    spec = task_spec(s, resolve_algo(s))
    assert spec.episode is None and s.episode_tokens() == s.max_new_tokens
    assert not build_task(load_rows(data)[0], "t-e0-0", 0, spec).HasField("episode")


def test_tools_make_every_task_an_episode(data: Path) -> None:
    s = parse_settings(["--train-data", str(data), "--tools", '["python"]', "--max-new-tokens", "32",
                        "--max-turns", "3", "--tool-timeout-s", "2.5", "--tool-output-chars", "200",
                        "--tool-memory-mb", "256"])  # fmt: skip
    assert s.tool_call_limit() == 2 and s.episode_tokens() == 96  # max_turns - 1 calls; 3 turns × 32 tokens
    spec = task_spec(s, resolve_algo(s))
    row = load_rows(data)[0]
    for task in (build_task(row, "t-e0-0", 0, spec), build_task(row, "t-eval", 0, spec, evaluation=True)):
        ep = task.episode
        assert (list(ep.tools), ep.tool_format, ep.max_turns, ep.max_tool_calls) == (["python"], "tagged", 3, 2)
        assert (ep.max_total_tokens, ep.max_tool_output_chars, ep.tool_timeout_s, ep.tool_memory_mb) == (
            96, 200, 2.5, 256)  # fmt: skip
        assert task.sampling.max_new_tokens == 32  # each turn's limit
        assert not ep.python_session  # each call a fresh program, unless asked
    explicit = parse_settings(["--train-data", str(data), "--tools", '["python"]', "--max-tool-calls", "0",
                               "--max-episode-tokens", "50"])  # fmt: skip
    ep = build_task(row, "t", 0, task_spec(explicit, resolve_algo(explicit))).episode
    assert (ep.max_tool_calls, ep.max_total_tokens) == (0, 50)


def test_the_episode_budget_is_the_length_budget(data: Path) -> None:
    """Overlong penalty, the prompt's room in the context and Dr. GRPO's normaliser all use the episode budget."""
    argv = ["--train-data", str(data), "--tools", '["python"]', "--max-new-tokens", "16", "--max-turns", "4"]
    s = parse_settings([*argv, "--preset", "dapo"])
    algo = resolve_algo(s)
    assert overlong_buffer(s, algo) == 32  # capped at half of 64, not of 16
    task = build_task(load_rows(data)[0], "t", 0, task_spec(s, algo))
    assert (task.checks.overlong.max_tokens, task.checks.overlong.buffer_tokens) == (64, 32)
    dr = parse_settings([*argv, "--preset", "dr_grpo"])
    assert learner_config(dr, resolve_algo(dr)).max_len == 64
    rows = load_rows(data)
    with pytest.raises(DataError, match="leave no room for max_episode_tokens 64 in the model's context of 70"):
        fit_prompts(rows, lambda row: 10, s, context=70)
    assert fit_prompts(rows, lambda row: 10, s, context=74)[1] == 10


def test_python_session_and_the_markdown_format_are_carried(data: Path) -> None:
    s = parse_settings(["--train-data", str(data), "--tools", '["python"]', "--python-session", "--tool-format",
                        "markdown"])  # fmt: skip
    episode = build_task(load_rows(data)[0], "t", 0, task_spec(s, resolve_algo(s))).episode
    assert episode.python_session and episode.tool_format == "markdown"
    with pytest.raises(ValidationError, match="tool_format"):
        parse_settings(["--train-data", str(data), "--tools", '["python"]', "--tool-format", "fenced"])
    for tools in ("[]", '["echo"]'):
        with pytest.raises(ValidationError, match=r"python_session shares state .* has no python: add python to tools"):
            parse_settings(["--train-data", str(data), "--tools", tools, "--python-session"])


@pytest.mark.parametrize("preset", ["prm", "vineppo"])
def test_process_credit_over_episodes_is_refused(data: Path, preset: str) -> None:
    with pytest.raises(ValidationError, match="process credit over multi-turn episodes is not supported"):
        parse_settings(["--train-data", str(data), "--tools", '["python"]', "--preset", preset])
    with pytest.raises(ValidationError, match="credit 'process'"):
        parse_settings(["--train-data", str(data), "--tools", '["python"]', "--credit", "process"])
    parse_settings(["--train-data", str(data), "--tools", '["python"]', "--preset", preset, "--mode", "sft"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tools", '["python", "python"]'], "each must be a non-empty tool name, listed once"),
        (["--tools", '["python"]', "--tool-format", "chat"], "set apply_chat_template true"),
        (["--max-turns", "0"], "max_turns"),
        (["--tool-timeout-s", "0"], "tool_timeout_s"),
        (["--tool-format", "json"], "tool_format"),
    ],
)
def test_bad_tool_settings_are_refused_naming_them(data: Path, argv: list[str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_settings(["--train-data", str(data), *argv])


def test_chat_tool_format_needs_a_chat_template(data: Path, tmp_path: Path) -> None:
    bare = tmp_path / "no-template"
    shutil.copytree(ensure_tiny_model(), bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    argv = ["--train-data", str(data), "--tools", '["python"]', "--tool-format", "chat", "--apply-chat-template",
            "--max-new-tokens", "16"]  # fmt: skip
    s = parse_settings([*argv, "--model", str(bare)])
    algo = resolve_algo(s)
    with pytest.raises(DataError, match="tool_format chat needs the model's chat template"):
        load_grpo_data(s, algo, task_spec(s, algo), str(bare))
    tiny = parse_settings(argv)
    assert load_grpo_data(tiny, algo, task_spec(tiny, algo), str(ensure_tiny_model())).rows
