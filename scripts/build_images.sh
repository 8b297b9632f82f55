#!/usr/bin/env bash
# Build the three CPU images docker-compose.yml names (grpo-{reward,rollout,trainer}:$GRPO_TAG), and the slim
# verifier grpo-reward:$GRPO_TAG-python, and write
# each one's build seconds and size to a JSON file (default runs/images.json).
#
# The Dockerfiles are built from copies without their `# syntax=` line: BuildKit would pull that
# frontend image, which an offline machine cannot (the Dockerfiles use nothing the built-in frontend
# lacks). --network host: a dockerd started with --iptables=false gives build containers no NAT.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/images.json}
tag=${GRPO_TAG:-latest}
# BuildKit is needed (the targets skip the GPU stages): a client with buildx, or one older than 23 that has
# it built in (Debian's docker.io 20.10). Another client may shadow Debian's on PATH.
docker=""
for candidate in ${DOCKER:-docker} /usr/bin/docker; do
  command -v "$candidate" >/dev/null || continue
  major=$($candidate version -f '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)
  if $candidate buildx version >/dev/null 2>&1 || [ "${major:-99}" -lt 23 ]; then docker=$candidate; break; fi
done
[ -n "$docker" ] || { echo "need a docker client with BuildKit (the buildx plugin)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$(dirname "$out")"
echo "{" > "$tmp/images.json"
sep=""
# name, service, image tag, extra build arguments. reward-python is the slim verifier: Python (and Bash) only.
builds=(
  "reward reward $tag"
  "reward-python reward $tag-python --build-arg LANGUAGES=python"
  "rollout rollout $tag --target cpu"
  "trainer trainer $tag --target cpu"
)
for build in "${builds[@]}"; do
  read -r name svc image_tag args <<< "$build"
  read -r -a args <<< "${args:-}"
  sed '/^# syntax=/d' "services/$svc/Dockerfile" > "$tmp/$svc.Dockerfile"
  start=$(date +%s.%N)
  if ! DOCKER_BUILDKIT=1 $docker build --network host --progress plain -f "$tmp/$svc.Dockerfile" "${args[@]}" \
      -t "grpo-$svc:$image_tag" . > "$tmp/$name.log" 2>&1; then
    tail -40 "$tmp/$name.log" >&2
    echo "building grpo-$svc:$image_tag failed (log above)" >&2
    exit 1
  fi
  seconds=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  bytes=$($docker image inspect -f '{{.Size}}' "grpo-$svc:$image_tag")
  echo "grpo-$svc:$image_tag built in ${seconds}s, $((bytes / 1000000)) MB"
  printf '%s "%s": {"build_s": %s, "size_mb": %s}' "$sep" "$name" "$seconds" "$((bytes / 1000000))" >> "$tmp/images.json"
  sep=$',\n'
done
printf '\n}\n' >> "$tmp/images.json"
cp "$tmp/images.json" "$out"
