#!/usr/bin/env bash
# Builds .gpu-carry/ (git-ignored) for bench/gpu_check/ on a lent GPU machine, whose image has Python 3.12, CUDA
# torch and transformers but no network: the tiny model the checks run on, and the packages that image lacks or
# holds too old, as unzipped cp312 wheels (nothing is installed there), at the versions in .venv. Then, with the
# device tool, from the repo root:
#   run(command="export PYTHONPATH=common/src:services/trainer/src:services/rollout/src:.gpu-carry/site;
#                python3 bench/gpu_check --out $OUT", carry=[".gpu-carry"])
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
out=.gpu-carry
grep -qx '/.gpu-carry/' .git/info/exclude || echo '/.gpu-carry/' >> .git/info/exclude
rm -rf "$out/site" "$out/wheels"
mkdir -p "$out/site" "$out/wheels"

version() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))"; }
# DeepSpeed imports pydantic (2.14 needs typing_extensions >= 4.16); grpo/v1/*_pb2*.py need this protobuf and
# grpcio; GrpcServer serves the health and reflection services.
for pkg in pydantic pydantic-core annotated-types typing-inspection typing-extensions hjson protobuf grpcio \
           grpcio-health-checking grpcio-reflection; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    -d "$out/wheels" "$pkg==$(version "$pkg")"
done
for wheel in "$out"/wheels/*.whl; do "$py" -m zipfile -e "$wheel" "$out/site"; done
rm -rf "$out/wheels"
# DeepSpeed has only a source release on PyPI: its pure-Python package as installed here.
site=$("$py" -c "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec('deepspeed').origin).parents[1])")
cp -r "$site/deepspeed" "$site"/deepspeed-*.dist-info "$out/site/"
find "$out/site" -name __pycache__ -prune -exec rm -rf {} +  # CPython 3.11's, of no use there

"$py" - <<'PY'
import shutil
import sys

sys.path.insert(0, "bench")
from gpu_check.shared import CARRIED_MODEL, MODEL_RECIPE  # noqa: E402

from grpo.common.tiny_model import ensure_tiny_model  # noqa: E402

shutil.rmtree(CARRIED_MODEL, ignore_errors=True)
shutil.copytree(ensure_tiny_model(**MODEL_RECIPE), CARRIED_MODEL)
PY
du -sh "$out"
