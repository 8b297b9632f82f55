#!/usr/bin/env bash
# Regenerate the Python gRPC code from proto/ into common/src (import path grpo.v1).
# The output is committed; `make check-protos` fails when it is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-common/src}
PY=${PY:-.venv/bin/python}
"$PY" -m grpc_tools.protoc -I proto \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  proto/grpo/v1/*.proto
