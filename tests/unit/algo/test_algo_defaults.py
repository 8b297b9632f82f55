"""The loss settings' defaults live in one place: a default changed in presets.py reaches every path.

A copy of grpo.algo with some LossConfig defaults changed is put first on the path of a fresh interpreter, which
then builds each thing a user's run is made of from it: the trainer's settings and the preset they resolve to, the
other presets, the LearnerConfig (through the trainer and bare), group_advantages' keywords and the loss call. Any
path with a default of its own would keep today's value, and the test would fail naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpo.algo

# (today's line in LossConfig, the line in the changed copy): values no path has today
CHANGES = [
    ("beta: float = 0.001", "beta: float = 0.25"),
    ("clip_high: float = 0.2", "clip_high: float = 0.3"),
    ('kl_kind: str = "k3"', 'kl_kind: str = "k2"'),
    ("advantage_eps: float = 1e-4", "advantage_eps: float = 0.5"),
    ("ref_refresh_steps: int | None = 400", "ref_refresh_steps: int | None = 7"),
    ("mask_truncated: bool = False", "mask_truncated: bool = True"),
]

PROBE = """
import json, sys, torch
import grpo.algo.presets
from grpo.algo import get_preset, group_advantages, policy_loss
from grpo.trainer.assemble import learner_config, resolve_algo
from grpo.trainer.config import parse_settings
from grpo.trainer.learner import LearnerConfig

settings = parse_settings(["--train-data", sys.argv[1]])
algo = resolve_algo(settings)
trained = learner_config(settings, algo)
bare = LearnerConfig()
logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
loss, metrics = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_logp=ref, **algo.loss_kwargs())
try:
    policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2))
    own_defaults = True
except TypeError:
    own_defaults = False
knobs = ("beta", "clip_high", "kl_kind", "mask_truncated")
print(json.dumps({
    "presets_file": grpo.algo.presets.__file__,
    "resolved": {k: getattr(algo, k) for k in (*knobs, "advantage_eps", "ref_refresh_steps")},
    "rloo": {k: getattr(get_preset("rloo"), k) for k in knobs},
    "trainer_learner": {k: getattr(trained, k) for k in (*knobs, "ref_refresh_steps")},
    "bare_learner": {k: getattr(bare, k) for k in (*knobs, "ref_refresh_steps")},
    "advantages": group_advantages(torch.tensor([0.0, 1.0]), 2).tolist(),
    "kl_loss_over_kl": float(metrics["kl_loss"] / metrics["kl"]),
    "policy_loss_has_own_defaults": own_defaults,
}))
"""


def test_a_default_changed_in_presets_reaches_every_path(tmp_path: Path) -> None:
    copy = tmp_path / "grpo" / "algo"
    shutil.copytree(Path(grpo.algo.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    presets = copy / "presets.py"
    text = presets.read_text()
    for today, changed in CHANGES:
        assert text.count(today) == 1, f"presets.py no longer says {today!r}: update CHANGES"
        text = text.replace(today, changed)
    presets.write_text(text)
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "gold": "2"}\n')

    # `grpo` is a namespace package: the copy, first on the path, shadows the real grpo.algo, nothing else.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(data)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.splitlines()[-1])

    assert Path(got["presets_file"]) == presets
    changed = {"beta": 0.25, "clip_high": 0.3, "kl_kind": "k2", "mask_truncated": True}
    assert got["resolved"] == {**changed, "advantage_eps": 0.5, "ref_refresh_steps": 7}  # trainer settings → preset
    assert got["rloo"] == changed  # a preset that does not set them inherits them
    assert got["trainer_learner"] == {**changed, "ref_refresh_steps": 7}  # what the trainer's learner trains with
    assert got["bare_learner"] == {**changed, "ref_refresh_steps": 7}  # LearnerConfig's own defaults
    # (0 − 0.5) / (std 0.7071 + eps 0.5): group_advantages' default eps is the changed one
    assert got["advantages"][1] == -got["advantages"][0]
    assert abs(got["advantages"][0] - (-0.5 / (0.5**0.5 + 0.5))) < 1e-6
    assert abs(got["kl_loss_over_kl"] - 0.25) < 1e-6  # the loss call weighs the KL by the changed beta
    assert got["policy_loss_has_own_defaults"] is False
