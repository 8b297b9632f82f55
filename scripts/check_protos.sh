#!/usr/bin/env bash
# Fail when the committed generated gRPC code differs from a fresh `protoc` run.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
scripts/gen_protos.sh "$tmp"
status=0
for f in "$tmp"/grpo/v1/*; do
  name=$(basename "$f")
  if ! cmp -s "$f" "common/src/grpo/v1/$name"; then
    echo "stale generated file: common/src/grpo/v1/$name (run 'make protos')"
    status=1
  fi
done
for f in common/src/grpo/v1/*_pb2*.py*; do
  [ -e "$tmp/grpo/v1/$(basename "$f")" ] || { echo "generated file without a proto: $f"; status=1; }
done
[ $status = 0 ] && echo "generated gRPC code is fresh"
exit $status
