"""Trainer settings: precedence (defaults < preset < file < env < CLI), preset application, clear errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from grpo.trainer.assemble import learner_config, overlong_buffer, resolve_algo, task_spec
from grpo.trainer.config import PRESETS, TrainerSettings, parse_settings
from tests.unit.reward.helpers import self_signed_cert


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "1+1?", "gold": "2"}\n')
    return path


def test_defaults_and_ports(data: Path) -> None:
    s = parse_settings(["--train-data", str(data)])
    assert (s.grpc_port, s.http_port) == (7053, 8003)
    assert s.preset == "grpo" and s.max_staleness == 0 and s.resume == "auto" and s.backend == "torch"
    assert s.algo_overrides() == {}
    assert (s.weight_push, s.relay_fanout) == ("auto", 1)  # a chain from 2 replicas on (grpo.trainer.pusher.push_mode)


def test_preset_values_become_defaults(data: Path) -> None:
    algo = resolve_algo(parse_settings(["--train-data", str(data), "--preset", "dapo"]))
    assert (algo.clip_low, algo.clip_high, algo.beta, algo.agg) == (0.2, 0.28, 0.0, "token_mean")
    assert algo.refill_zero_variance is True


def test_explicit_settings_override_the_preset(data: Path) -> None:
    s = parse_settings(["--train-data", str(data), "--preset", "dapo", "--clip-high", "0.3", "--group-size", "4"])
    algo = resolve_algo(s)
    assert algo.clip_high == 0.3 and algo.group_size == 4
    assert algo.agg == "token_mean"  # untouched preset value
    assert s.algo_overrides() == {"clip_high": 0.3, "group_size": 4}


def test_ref_refresh_zero_means_never(data: Path) -> None:
    s = parse_settings(["--train-data", str(data), "--ref-refresh-steps", "0"])
    assert resolve_algo(s).ref_refresh_steps is None
    assert learner_config(s, resolve_algo(s)).ref_refresh_steps == 0


def test_the_lr_schedule_spans_the_whole_run_at_any_ppo_epochs(data: Path) -> None:
    from grpo.trainer.learner.optim import lr_factor

    args = ["--train-data", str(data), "--steps", "100", "--warmup-steps", "10", "--lr-schedule", "cosine"]
    for epochs in (1, 2, 4):
        cfg = learner_config(s := parse_settings([*args, "--ppo-epochs", str(epochs)]), resolve_algo(s))

        def lr_at(step: int, cfg=cfg, epochs=epochs) -> float:  # the first optimizer step of trainer step `step`
            return lr_factor((step - 1) * epochs, warmup_steps=cfg.warmup_steps, total_steps=cfg.total_steps,
                             schedule="cosine")  # fmt: skip

        assert lr_at(1) <= 0.1 and lr_at(6) < 1.0 and lr_at(11) == 1.0  # warm-up lasts 10 trainer steps
        assert lr_at(55) == pytest.approx(0.5, abs=0.03)  # half-way through the decay, not at its end
        assert lr_at(100) > 0.0
    sft = learner_config(s := parse_settings([*args, "--ppo-epochs", "2", "--mode", "sft"]), resolve_algo(s))
    assert (sft.warmup_steps, sft.total_steps) == (10, 100)  # SFT makes one optimizer step per step


def test_k1_in_the_loss_is_refused_at_start_up(data: Path) -> None:
    with pytest.raises(ValidationError, match="regularises nothing"):
        parse_settings(["--train-data", str(data), "--kl-kind", "k1", "--beta", "0.04"])
    assert parse_settings(["--train-data", str(data), "--kl-kind", "k1", "--beta", "0"]).kl_kind == "k1"


def test_stale_samples_are_never_trained_as_on_policy(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    def tis(*extra: str) -> float | None:
        return resolve_algo(parse_settings(["--train-data", str(data), *extra])).tis_cap

    assert tis() is None  # on-policy: nothing to correct
    with caplog.at_level("WARNING"):
        assert tis("--max-staleness", "1") == 2.0  # inexact sampler log-probs: TIS corrects the staleness
    assert "truncated importance sampling" in caplog.text
    assert tis("--max-staleness", "1", "--sampler-exact") is None  # exact π_old: PPO's ratio corrects it
    assert tis("--max-staleness", "1", "--tis-cap", "3") == 3.0


def test_every_algorithm_knob_is_a_setting_defaulting_to_the_preset(data: Path) -> None:
    import dataclasses

    from grpo.algo import PRESETS as ALGO_PRESETS
    from grpo.algo import LossConfig
    from grpo.trainer.config import ALGO_FIELDS

    knobs = {f.name for f in dataclasses.fields(LossConfig)} - {"name", "source", "notes"}
    assert set(ALGO_FIELDS) == knobs
    assert set(PRESETS) == set(ALGO_PRESETS)
    for name in knobs:
        assert TrainerSettings.model_fields[name].default is None, f"{name} must default to None (the preset's)"
    s = parse_settings(["--train-data", str(data), "--std-unbiased", "false", "--advantage-eps", "1e-6",
                        "--reward-clip", "[-1, 1]", "--mask-truncated", "true",
                        "--zero-variance-on", "accuracy"])  # fmt: skip
    algo = resolve_algo(s)
    assert (algo.std_unbiased, algo.advantage_eps, algo.reward_clip, algo.mask_truncated) == (
        False,
        1e-6,
        (-1, 1),
        True,
    )
    assert algo.zero_variance_basis() == "accuracy"
    assert learner_config(s, algo).mask_truncated is True
    with pytest.raises(ValidationError, match="lo <= hi"):
        parse_settings(["--train-data", str(data), "--reward-clip", "[1, -1]"])
    with pytest.raises(ValidationError, match="zero_variance_on"):
        parse_settings(["--train-data", str(data), "--zero-variance-on", "format"])


def test_refills_without_the_skip_are_refused(data: Path) -> None:
    """A refill replaces a group the skip drops: with the skip off none is dropped, so none would ever come."""
    dapo = ["--train-data", str(data), "--preset", "dapo"]
    assert resolve_algo(parse_settings(dapo)).refill_zero_variance
    with pytest.raises(ValidationError, match=r"refill_zero_variance \(preset dapo\) needs skip_zero_variance"):
        parse_settings([*dapo, "--skip-zero-variance", "false"])
    parse_settings([*dapo, "--skip-zero-variance", "false", "--refill-zero-variance", "false"])


@pytest.mark.parametrize("preset", ["grpo", "rloo", "vineppo"])
def test_a_group_of_one_is_refused_at_start_up(data: Path, preset: str) -> None:
    """One sample per prompt is its own baseline: every group would be dropped (or rloo raise) after the rollouts."""
    argv = ["--train-data", str(data), "--preset", preset, "--group-size", "1"]
    with pytest.raises(ValidationError, match="group_size=1: a group needs at least 2 samples"):
        parse_settings(argv)
    with pytest.raises(ValidationError, match="group_size=1"):
        parse_settings([*argv, "--skip-zero-variance", "false", "--refill-zero-variance", "false"])
    assert parse_settings([*argv[:-1], "2"]).group_size == 2
    assert parse_settings([*argv, "--mode", "sft"]).mode == "sft"  # SFT has no groups


def test_precedence_file_env_cli(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "t.yaml"
    cfg.write_text(f"train_data: {data}\nsteps: 5\nlr: 0.001\nbeta: 0.5\n")
    monkeypatch.setenv("GRPO_TRAINER_CONFIG", str(cfg))
    monkeypatch.setenv("GRPO_TRAINER_LR", "0.002")
    s = parse_settings(["--beta", "0.25"])
    assert s.steps == 5  # file
    assert s.lr == 0.002  # env beats file
    assert s.beta == 0.25  # CLI beats file
    assert resolve_algo(s).beta == 0.25  # and beats the preset


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--beta", "-1"], "beta"),
        (["--preset", "ppo"], "preset"),
        (["--resume", "/no/such/checkpoint"], "resume"),
        (["--run-id", "a:b"], "run_id"),
        (["--clip-low", "1.5"], "clip_low"),
        (["--max-staleness", "-1"], "max_staleness"),
        (["--weight-push", "broadcast"], "weight_push"),
        (["--relay-fanout", "0"], "relay_fanout"),
        (["--temperature", "inf"], "temperature"),
        (["--eval-temperature", "nan"], "eval_temperature"),
    ],
)
def test_bad_values_name_the_field(data: Path, argv: list[str], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_settings(["--train-data", str(data), *argv])
    assert field in str(exc.value)


def test_a_redis_password_stays_out_of_the_run_record(data: Path) -> None:
    """W&B keeps the run's settings on a third party's servers."""
    url = "rediss://default:S3CRETPW@redis.example:6379/0"
    record = parse_settings(["--train-data", str(data), "--redis-url", url, "--token", "tok"]).run_record()
    assert record["redis_url"] == "rediss://redis.example:6379/0" and "token" not in record
    assert "S3CRETPW" not in json.dumps(record)  # (the start-up error: test_trainer_startup_errors.py)


def test_tls_settings(data: Path, tmp_path: Path) -> None:
    cert, key = (str(p) for p in self_signed_cert(tmp_path))
    s = parse_settings(["--train-data", str(data), "--tls-cert-file", cert, "--tls-key-file", key,
                        "--rollout-tls-ca-file", cert])  # fmt: skip
    assert (s.tls_cert_file, s.tls_key_file, s.rollout_tls_ca_file) == (cert, key, cert)
    with pytest.raises(ValidationError, match=r"rollout_tls_ca_file ca\.pem: no such file"):
        parse_settings(["--train-data", str(data), "--rollout-tls-ca-file", "ca.pem"])
    with pytest.raises(ValidationError, match="tls_cert_file and tls_key_file must be set together"):
        parse_settings(["--train-data", str(data), "--tls-cert-file", cert])
    with pytest.raises(ValidationError, match=r"tls_cert_file c\.pem: no such file"):  # read at start-up, not first use
        parse_settings(["--train-data", str(data), "--tls-cert-file", "c.pem", "--tls-key-file", "k.pem"])


def test_train_data_required() -> None:
    with pytest.raises(ValidationError, match="train_data is required"):
        parse_settings([])


def test_every_preset_has_an_example_config_that_runs_from_the_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo.trainer.assemble import check_step_credit
    from grpo.trainer.data import load_rows

    root = Path(__file__).parents[3]
    monkeypatch.chdir(root)  # the README runs them from the clone's root
    for name in PRESETS:
        path = Path("services/trainer/configs") / f"{name}.yaml"
        assert path.is_file(), f"missing example config {path}"
        s = parse_settings(["--config", str(path)])
        assert s.preset == name
        algo = resolve_algo(s)  # the example resolves against the real preset
        rows = load_rows(Path(s.train_data))  # the data it names ships with the repository
        assert rows and load_rows(Path(s.eval_data))
        check_step_credit(s, algo, rows)
        # Run by hand beside a rollout replica on a few cores, torch's default (every core) oversubscribed them:
        # 13 s a step against 2.4 s under `grpo up`, which sets 1 (issue 34).
        assert s.torch_threads == 1, f"{path}: torch_threads"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_example_config_can_learn_the_shipped_task(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What made the examples train on nothing (reproduced in review): a random start with no cold start (every
    group scores the same, so every group is skipped), step credit from a PRM the reward service has no
    prm_path for (every group fails), steps cut at a delimiter addition answers never hold (one step: outcome
    credit again), and an overlong ramp that punishes complete answers. Checked with the reward service's own
    step code and the tiny model's tokenizer on the shipped worked answers."""
    from transformers import AutoTokenizer

    from grpo.common.tiny_model import TINY_NAMES, resolve_model
    from grpo.reward.verifiers.steps import STEP_RULES, cut_at
    from grpo.trainer.data import load_rows
    from grpo.trainer.stages import plan_stages

    monkeypatch.chdir(Path(__file__).parents[3])
    s = parse_settings(["--config", f"services/trainer/configs/{name}.yaml"])
    stages = [stage.settings for stage in plan_stages(s)] or [s]
    first, grpo = stages[0], [stage for stage in stages if stage.mode == "grpo"]
    assert len(grpo) == 1, "one GRPO stage: the preset's"
    # A randomly initialised model never answers right: it needs the cold start before GRPO.
    assert first.model not in TINY_NAMES or first.mode == "sft", f"{name}: the built-in tiny model without SFT"
    assert stages.index(grpo[0]) > 0, f"{name}: GRPO must run from the SFT model, after the cold start"
    worked = load_rows(Path(first.train_data), need_response=True)[:200]
    assert worked

    g = grpo[0]
    algo = resolve_algo(g)
    if algo.credit in ("process", "vineppo"):
        check = g.step_check or {}
        # The reward service scores `prm` steps only with its prm_path, which the shipped services do not set.
        assert check.get("source") in ("rule", "cut"), f"{name}: step_check {check} needs the reward's prm_path"
        for row in worked:
            assert isinstance(row.prompt, str) and row.response
            if check["source"] == "rule":
                judged = STEP_RULES[check["rule"]](row.prompt, row.response)
                assert all(j.status == "ok" and j.score == 1 for j in judged), (name, row.response, judged)
                steps = len(judged)
            else:
                steps = len(cut_at(row.response, check.get("delimiter") or "\n"))
            assert steps >= 2, f"{name}: {check} gives {row.response!r} {steps} step(s): no credit per step"

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(first.model))  # GRPO's model is SFT's: same tokenizer
    longest = max(len(tokenizer.encode(row.response or "", add_special_tokens=False)) for row in worked) + 1  # EOS
    assert longest <= g.max_new_tokens - overlong_buffer(g, algo), (
        f"{name}: the overlong ramp (from token {g.max_new_tokens - overlong_buffer(g, algo)}) punishes complete "
        f"answers of up to {longest} tokens"
    )


def test_task_spec_and_overlong_cap(data: Path) -> None:
    s = parse_settings(["--train-data", str(data), "--preset", "dapo", "--max-new-tokens", "16", "--group-size", "4"])
    algo = resolve_algo(s)
    assert overlong_buffer(s, algo) == 8  # DAPO's 4096 capped to half the budget
    spec = task_spec(s, algo)
    assert spec.group_size == 4 and spec.sampling().n == 4 and spec.sampling().max_new_tokens == 16


def test_step_credit_needs_a_step_check_and_sends_it_with_every_training_task(data: Path) -> None:
    from grpo.trainer.assemble import check_step_credit
    from grpo.trainer.data import load_rows
    from grpo.trainer.publisher import build_task

    s = parse_settings(["--train-data", str(data), "--preset", "prm"])
    algo = resolve_algo(s)
    assert algo.credit == "process" and algo.process_weight == 0.5
    rows = load_rows(data)
    with pytest.raises(ValueError, match=r"needs steps, but 1 of 1 rows .* set `step_check`"):
        check_step_credit(s, algo, rows)
    s = parse_settings(["--train-data", str(data), "--preset", "prm", "--step-check",
                        '{"source": "rule", "rule": "column_addition"}'])  # fmt: skip
    check_step_credit(s, algo, rows)
    spec = task_spec(s, algo)
    task = build_task(rows[0], "t-e0-0", 0, spec)
    assert task.checks.steps.source == "rule" and task.checks.steps.rule == "column_addition"
    assert not build_task(rows[0], "t-e0-0", 0, spec, evaluation=True).checks.HasField("steps")  # eval: outcome only
    cut = parse_settings(["--train-data", str(data), "--preset", "prm", "--step-check", '{"source": "cut"}'])
    with pytest.raises(ValueError, match="trains on step scores, but step_check asks for source cut"):
        check_step_credit(cut, algo, rows)  # cut steps have no scores: every group would be unscored
    vine = parse_settings(["--train-data", str(data), "--preset", "vineppo", "--step-check", '{"source": "cut"}'])
    check_step_credit(vine, resolve_algo(vine), rows)  # VinePPO needs only the boundaries
    with pytest.raises(ValidationError, match=r'step_check: .*no field named "rules"'):
        parse_settings(["--train-data", str(data), "--step-check", '{"source": "rule", "rules": "x"}'])
    with pytest.raises(ValidationError, match=r"step_check\.source must be rule, prm or cut"):
        parse_settings(["--train-data", str(data), "--step-check", '{"rule": "column_addition"}'])


@pytest.mark.parametrize(
    ("field", "registry"),
    [("agg", "AGGREGATIONS"), ("advantage_mode", "ADVANTAGE_MODES"), ("kl_kind", "KL_ESTIMATORS"),
     ("ratio_level", "RATIO_LEVELS"), ("preset", "PRESETS"), ("process_advantage", "PROCESS_ADVANTAGES")],
)  # fmt: skip
def test_each_algorithm_setting_offers_exactly_its_registry(field: str, registry: str) -> None:
    """The settings name the choices as plain literals (so --help never imports torch); a new registry entry
    must be added there too, and this test says so."""
    import typing

    import grpo.algo.advantages
    import grpo.algo.aggregation
    import grpo.algo.credit
    import grpo.algo.kl
    import grpo.algo.loss
    import grpo.algo.presets

    modules = (grpo.algo.advantages, grpo.algo.aggregation, grpo.algo.credit, grpo.algo.kl, grpo.algo.loss,
               grpo.algo.presets)  # fmt: skip
    names = next(getattr(m, registry) for m in modules if hasattr(m, registry))
    annotation = TrainerSettings.model_fields[field].annotation
    choices = {a for arg in typing.get_args(annotation) for a in typing.get_args(arg)} or set(
        typing.get_args(annotation)
    )
    assert choices - {None} == set(names), f"add the new name to TrainerSettings.{field} in grpo/trainer/config.py"


def test_the_broadcast_transport_is_checked_at_start(data: Path, tmp_path: Path) -> None:
    s = parse_settings(["--train-data", str(data)])
    assert s.weight_transport == "data_port"  # the default
    s = parse_settings(["--train-data", str(data), "--weight-transport", "broadcast", "--broadcast-address", "[::1]:0"])
    assert (s.weight_transport, s.broadcast_backend) == ("broadcast", "gloo")
    for bad in ("trainer", "0.0.0.0:29500", "[::]:0", "trainer:http"):
        with pytest.raises(ValidationError, match=f"broadcast_address '{re.escape(bad)}' must be host:port"):
            parse_settings(["--train-data", str(data), "--broadcast-address", bad])
    ca = str(self_signed_cert(tmp_path)[0])
    with pytest.raises(ValidationError, match="sends the weights unencrypted"):
        parse_settings(["--train-data", str(data), "--weight-transport", "broadcast", "--rollout-tls-ca-file", ca])


def test_zero_stage_from_flags_env_and_file(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Flags and env values arrive as text: '3' must be the stage 3, as the file's 3 is.
    assert parse_settings(["--train-data", str(data), "--zero-stage", "3"]).zero_stage == 3
    monkeypatch.setenv("GRPO_TRAINER_ZERO_STAGE", "1")
    assert parse_settings(["--train-data", str(data)]).zero_stage == 1
    monkeypatch.delenv("GRPO_TRAINER_ZERO_STAGE")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(f"train_data: {data}\nzero_stage: 3\n")
    s = parse_settings(["--config", str(cfg)])
    assert s.zero_stage == 3 and learner_config(s, resolve_algo(s)).zero_stage == 3
    for bad in ("0", "4", "two"):
        with pytest.raises(ValidationError, match="zero_stage"):
            parse_settings(["--train-data", str(data), "--zero-stage", bad])


def test_redis_url_needs_a_redis_scheme(data: Path) -> None:
    with pytest.raises(ValidationError, match=r"redis_url must start with redis://, rediss:// or unix://"):
        parse_settings(["--train-data", str(data), "--redis-url", "notaurl"])
    for url in ("redis://h:6379/0", "rediss://h:6380/1", "unix:///run/redis.sock"):
        assert parse_settings(["--train-data", str(data), "--redis-url", url]).redis_url == url


def test_resume_from_a_folder_that_is_not_a_checkpoint_is_refused(data: Path, tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "x"
    folder.mkdir(parents=True)
    with pytest.raises(ValidationError, match=r"is not a checkpoint \(no trainer_state.json\)"):
        parse_settings(["--train-data", str(data), "--resume", str(folder)])
    (folder / "trainer_state.json").write_text("{}")
    assert parse_settings(["--train-data", str(data), "--resume", str(folder)]).resume == str(folder)


def test_step_credit_errors_are_data_errors_naming_the_line(tmp_path: Path) -> None:
    from grpo.trainer.assemble import check_step_credit
    from grpo.trainer.data import DataError, load_rows

    path = tmp_path / "steps.jsonl"
    steps = {"math": {"gold": "2"}, "steps": {"source": "rule", "rule": "column_addition"}}
    path.write_text(json.dumps({"prompt": "1+1=", "checks": steps}) + "\n\n" + '{"prompt": "1+1=", "gold": "2"}\n')
    s = parse_settings(["--train-data", str(path), "--preset", "prm"])
    with pytest.raises(DataError, match=rf"1 of 2 rows \(the first: {re.escape(str(path))} line 3\) have no"):
        check_step_credit(s, resolve_algo(s), load_rows(path))
    cut = {"math": {"gold": "2"}, "steps": {"source": "cut"}}
    path.write_text(json.dumps({"prompt": "1+1=", "checks": steps}) + "\n" + json.dumps({"prompt": "x", "checks": cut}))
    with pytest.raises(DataError, match=rf"but {re.escape(str(path))} line 2 asks for source cut"):
        check_step_credit(s, resolve_algo(s), load_rows(path))


def test_reward_weights_must_name_a_check_of_every_row(tmp_path: Path) -> None:
    from grpo.trainer.assemble import check_reward_weights
    from grpo.trainer.data import DataError, load_rows

    path = tmp_path / "mixed.jsonl"
    code = {"code": {"tests": [{"stdio": {"stdin": "", "expected_stdout": "hi"}}]}, "plugins": {"length": {}}}
    path.write_text('{"prompt": "2+2=", "checks": {"math": {"gold": "4"}, "format": {}}}\n\n'
                    + json.dumps({"prompt": "print hi", "checks": code}) + "\n")  # fmt: skip
    rows = load_rows(path)

    def spec_with(weights: dict[str, float], penalty: bool = False) -> Any:
        argv = ["--train-data", str(path), "--reward-weights", json.dumps(weights), "--max-new-tokens", "64"]
        s = parse_settings([*argv, "--overlong-soft-penalty", str(penalty).lower()])
        return task_spec(s, resolve_algo(s))

    with pytest.raises(DataError, match=rf"names 'mathh', but {re.escape(str(path))} line 1 has no 'mathh' check "
                                        r"\(a typo\?\).*\['code', 'format', 'length', 'math'\]"):  # fmt: skip
        check_reward_weights(spec_with({"mathh": 1.0}), rows)
    with pytest.raises(DataError, match=rf"names 'math', but {re.escape(str(path))} line 3 .*1 of 2 rows lack it"):
        check_reward_weights(spec_with({"math": 1.0}), rows)  # the reward service would fail every code task
    with pytest.raises(DataError, match="names 'overlong'"):
        check_reward_weights(spec_with({"overlong": 1.0}), rows)
    check_reward_weights(spec_with({"overlong": 0.5}, penalty=True), rows)  # the penalty adds it to every task
    math_only = load_rows(path)[:1]
    check_reward_weights(spec_with({"math": 1.0, "format": 0.2}), math_only)
    check_reward_weights(spec_with({}), rows)


def test_the_settings_load_without_torch() -> None:
    """They read the loss settings' defaults (grpo.algo.presets) at import, yet `--help` must stay instant."""
    import subprocess
    import sys

    code = "import sys, grpo.trainer.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_task_reward_weights_weight_each_task_type_by_its_own_checks(tmp_path: Path) -> None:
    """A hybrid run: math rows weighted on math and format, reward-model rows on the model alone. reward_weights
    cannot say it (every row must have every named check); task_reward_weights can, checked per type."""
    from grpo.trainer.assemble import check_reward_weights
    from grpo.trainer.data import DataError, load_rows
    from grpo.trainer.publisher import build_task

    path = tmp_path / "hybrid.jsonl"
    path.write_text('{"prompt": "2+2=", "task_type": "add", "checks": {"math": {"gold": "4"}, "format": {}}}\n'
                    '{"prompt": "say hi", "task_type": "chat", "checks": {"reward_model": {}}}\n')  # fmt: skip
    rows = load_rows(path)

    def spec_with(weights: dict[str, Any], per_task: dict[str, Any]) -> Any:
        s = parse_settings(["--train-data", str(path), "--reward-weights", json.dumps(weights),
                            "--task-reward-weights", json.dumps(per_task)])  # fmt: skip
        return task_spec(s, resolve_algo(s))

    spec = spec_with({}, {"add": {"math": 1.0, "format": 0.5}, "chat": {"reward_model": 2.0}})
    check_reward_weights(spec, rows)
    tasks = [build_task(row, f"t{i}", 0, spec) for i, row in enumerate(rows)]
    assert [dict(t.weights) for t in tasks] == [{"math": 1.0, "format": 0.5}, {"reward_model": 2.0}]
    check_reward_weights(spec_with({"math": 1.0}, {"chat": {"reward_model": 1.0}}), rows)  # add keeps reward_weights
    with pytest.raises(DataError, match=r"^reward_weights names 'math', but .* line 2 .*1 of 2 rows lack it.*"
                                        "task_reward_weights"):  # fmt: skip
        check_reward_weights(spec_with({"math": 1.0}, {}), rows)
    with pytest.raises(DataError, match=r"^task_reward_weights\[chat\] names 'format', but .* line 2 .*a typo"):
        check_reward_weights(spec_with({}, {"chat": {"format": 1.0}}), rows)
    with pytest.raises(DataError, match=r"task type\(s\) \['sub'\] that no row has; the rows' task types: "
                                        r"\['add', 'chat'\]"):  # fmt: skip
        check_reward_weights(spec_with({}, {"sub": {"math": 1.0}}), rows)
