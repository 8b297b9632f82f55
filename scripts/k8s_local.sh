#!/usr/bin/env bash
# The single-node Kubernetes `make test-k8s` runs the chart on: ../shared/tools/k8s-local/k8s-local.sh (K8S_LOCAL_TOOL)
# plus what it lacks, added here rather than in the tool: a cluster DNS (scripts/k8s_local_dns.py in the
# cluster's network namespace, the kubelet's clusterDNS pointing at it) and a StorageClass of host-path volumes.
#
#   scripts/k8s_local.sh up              # start the cluster (the tool's `deps` and `build` must have run once)
#   scripts/k8s_local.sh load IMAGE...   # copy images from the local Docker into the node
#   scripts/k8s_local.sh exec CMD...     # kubectl / helm / socat inside the cluster's network namespace
#   scripts/k8s_local.sh volumes N       # N host-path PersistentVolumes of class k8slocal-hostpath
#   scripts/k8s_local.sh down
set -euo pipefail
cd "$(dirname "$0")/.."
TOOL=${K8S_LOCAL_TOOL:-$PWD/../shared/tools/k8s-local/k8s-local.sh}
B=${K8S_LOCAL:-/var/tmp/k8s-local}
C=$B/cluster
NS=k8slocal
DNS_IP=10.250.0.1   # the node's address in the cluster's network namespace (the tool's NODE_IP): bound, not 0.0.0.0,
                    # so that replies leave from the address pods asked (else their resolver drops them)
PY=${PY:-$PWD/.venv/bin/python}

need_tool() {
  [ -x "$TOOL" ] || [ -f "$TOOL" ] || { echo "no k8s-local tool at $TOOL (set K8S_LOCAL_TOOL)" >&2; exit 1; }
  [ -x "$B/src120/kubernetes-1.20.2/_output/bin/kube-apiserver" ] || {
    echo "Kubernetes is not built: run \`$TOOL deps && $TOOL build\` once (17-40 min on 2 cores)" >&2; exit 1; }
  docker info >/dev/null 2>&1 || { echo "no Docker engine: run ../shared/tools/docker-offline.sh" >&2; exit 1; }
}

running() { [ -f "$C/kube-apiserver.pid" ] && kill -0 "$(cat "$C/kube-apiserver.pid")" 2>/dev/null; }

dns_up() {
  [ -f "$C/grpo-dns.pid" ] && kill -0 "$(cat "$C/grpo-dns.pid")" 2>/dev/null && return 0
  nsenter --net=/var/run/netns/$NS -- "$PY" scripts/k8s_local_dns.py --pki "$C/pki" --host "$DNS_IP" > "$C/logs/grpo-dns.log" 2>&1 &
  echo $! > "$C/grpo-dns.pid"
  for _ in $(seq 1 50); do grep -q answering "$C/logs/grpo-dns.log" && return 0; sleep 0.2; done
  echo "the cluster DNS did not start:" >&2; cat "$C/logs/grpo-dns.log" >&2; exit 1
}

up() {
  need_tool
  if running; then
    grep -q "^clusterDNS:" "$C/kubelet/config.yaml" || { echo "the cluster runs without our DNS: $0 down, then up" >&2; exit 1; }
    dns_up
    return 0
  fi
  [ -f "$B/images/pause.tar" ] || bash "$TOOL" images
  # netns, certificates, configs, etcd, containerd (unless they still run): the kubelet's config exists from here
  [ -f "$C/containerd.pid" ] && kill -0 "$(cat "$C/containerd.pid")" 2>/dev/null || bash "$TOOL" base
  grep -q "^clusterDNS:" "$C/kubelet/config.yaml" || printf 'clusterDNS: ["%s"]\n' "$DNS_IP" >> "$C/kubelet/config.yaml"
  dns_up
  bash "$TOOL" up
  x kubectl apply -f - <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: k8slocal-hostpath}
provisioner: kubernetes.io/no-provisioner
reclaimPolicy: Retain
volumeBindingMode: Immediate
EOF
}

volumes() {  # N PersistentVolumes of 10Gi on host directories any pod user may write (no fsGroup on hostPath)
  local i name
  for i in $(seq 1 "$1"); do
    name=k8slocal-pv-$(date +%s%N | tail -c 9)-$i
    mkdir -p "$C/volumes/$name" && chmod 0777 "$C/volumes/$name"
    x kubectl apply -f - <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: $name, labels: {k8slocal/volume: "true"}}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: k8slocal-hostpath
  hostPath: {path: $C/volumes/$name, type: Directory}
EOF
  done
}

free_volumes() {  # delete the PersistentVolumes no claim holds any more, and their directories
  local pv
  for pv in $(x kubectl get pv -l k8slocal/volume=true -o jsonpath='{range .items[?(@.status.phase!="Bound")]}{.metadata.name}{"\n"}{end}'); do
    x kubectl delete pv "$pv" --wait=false
    rm -rf "${C:?}/volumes/$pv"
  done
}

load() {  # skip an image the node already has in this exact build (a load of the three takes ~3 min)
  local img id
  touch "$C/loaded-images"
  for img in "$@"; do
    id=$(docker image inspect -f '{{.Id}}' "$img")
    grep -qx "$img $id" "$C/loaded-images" && { echo "$img: already loaded"; continue; }
    bash "$TOOL" load "$img"
    grep -v "^$img " "$C/loaded-images" > "$C/loaded-images.new" || true
    echo "$img $id" >> "$C/loaded-images.new" && mv "$C/loaded-images.new" "$C/loaded-images"
  done
}

x() { bash "$TOOL" exec "$@"; }

case "${1:-}" in
  up) up;;
  load) shift; need_tool; load "$@";;
  exec) shift; x "$@";;
  volumes) volumes "${2:-1}";;
  free-volumes) free_volumes;;
  down)
    [ -f "$C/grpo-dns.pid" ] && kill "$(cat "$C/grpo-dns.pid")" 2>/dev/null || true
    rm -f "$C/grpo-dns.pid"
    bash "$TOOL" down;;
  *) echo "usage: $0 up | load IMAGE... | exec CMD... | volumes N | free-volumes | down" >&2; exit 2;;
esac
