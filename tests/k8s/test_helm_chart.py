"""The Helm chart on a real cluster, as a user installs it: `helm install` with values-cpu.yaml, then use it.

Needs the single-node cluster of scripts/k8s_local.sh running with the images loaded (`make test-k8s` does
both). The release runs with an API token; the tests reach Services by their ClusterIP from the cluster's
network namespace (kube-proxy's rules, as any client in the cluster), and pods reach each other by Service
name through the cluster DNS. The staged run (SFT, then GRPO shortened to 60 steps) must learn while a
rollout pod, the reward pod and the trainer pod are deleted, with the books balanced; `helm uninstall`
leaves only the claims a StatefulSet keeps by design, and deleting those leaves nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.netpol import CHART_REACHABILITY, Pod, isolated, reachability
from tests.support.readme_examples import mismatches, verifier_examples
from tests.support.run_status import wait_for_status

pytestmark = pytest.mark.k8s
log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "scripts" / "k8s_local.sh"
NAMESPACE = "grpo-k8s-test"
RELEASE = "demo"
FULL = f"{RELEASE}-grpo"
TOKEN = "k8s-test-s3cret"
IMAGE_TAG = "k8s"  # make test-k8s tags the built images grpo-<service>:k8s and loads them into the node
GRPO_STEPS = 60
COMPONENTS = ("redis", "reward", "rollout", "trainer")
# Helm 4 (server-side apply, which 1.20 accepts because every port names its protocol) by default;
# GRPO_K8S_HELM=helm3 runs the same tests with Helm 3.
HELM = os.environ.get("GRPO_K8S_HELM", "helm")


def local(*args: str, check: bool = True, timeout: float = 300, input: str | None = None) -> str:
    done = subprocess.run([str(LOCAL), *args], capture_output=True, text=True, timeout=timeout, input=input)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def kubectl(*args: str, check: bool = True, timeout: float = 300) -> str:
    return local("exec", "kubectl", "-n", NAMESPACE, *args, check=check, timeout=timeout)


def helm(*args: str, check: bool = True, timeout: float = 600) -> str:
    return local("exec", HELM, "-n", NAMESPACE, *args, check=check, timeout=timeout)


def get(kind: str, *args: str) -> list[dict[str, Any]]:
    return json.loads(kubectl("get", kind, *args, "-o", "json"))["items"]


def pods(component: str | None = None) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={RELEASE}" + (
        f",app.kubernetes.io/component={component}" if component else ""
    )
    return [p for p in get("pods", "-l", selector) if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def cluster_ip(service: str) -> str:
    return kubectl("get", "service", service, "-o", "jsonpath={.spec.clusterIP}")


def diagnose() -> str:
    """Pods, recent events and the logs of pods that are not Ready: what a failed wait shows."""
    out = [kubectl("get", "pods,pvc", "-o", "wide", check=False)]
    out.append(kubectl("get", "events", "--sort-by=.lastTimestamp", check=False)[-4000:])
    for pod in pods():
        if not ready(pod):
            name = pod["metadata"]["name"]
            out.append(f"--- {name}\n" + kubectl("logs", name, "--tail=40", check=False))
    return "\n".join(out)


@contextmanager
def service_client(service: str, port: int, tmp: Path) -> Iterator[httpx.Client]:
    """An HTTP client to a Service's ClusterIP: socat in the cluster's network namespace, bridged to a unix socket."""
    sock = tmp / f"{service}-{port}.sock"
    sock.unlink(missing_ok=True)
    target = f"TCP:{cluster_ip(service)}:{port}"
    # A process group of its own: bash -> the tool -> socat, all stopped at the end (else socat keeps listening).
    proc = subprocess.Popen([str(LOCAL), "exec", "socat", f"UNIX-LISTEN:{sock},fork", target], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport, base_url=f"http://{service}", timeout=60) as client:
            yield client
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


@dataclass
class Release:
    tmp: Path
    seen: dict[str, Any] = field(default_factory=dict)

    def trainer_status(self, client: httpx.Client) -> dict[str, Any] | None:
        try:
            reply = client.get("/v1/status", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10)
        except httpx.HTTPError:
            return None  # the trainer pod restarting: no endpoint behind the Service
        return reply.json() if reply.status_code == 200 else None

    def wait(
        self, client: httpx.Client, what: str, predicate: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any]:
        return wait_for_status(lambda: self.trainer_status(client), predicate, what, timeout, diagnose,
                               on_status=lambda status: self.seen.update(last_status=status))  # fmt: skip


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    tmp = tmp_path_factory.mktemp("k8s")
    local("up", timeout=600)
    local("exec", "kubectl", "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=300)
    local("free-volumes")
    local("exec", "kubectl", "create", "namespace", NAMESPACE)
    local("volumes", "2")  # the trainer's checkpoints and Redis's AOF
    overrides = {
        "image": {"registry": "docker.io/library", "tag": IMAGE_TAG, "pullPolicy": "Never"},
        "storageClass": "k8slocal-hostpath",
        "auth": {"apiToken": TOKEN},
        "run": {"trainer": {"steps": GRPO_STEPS, "eval_every": 20}},
        # The HPA exists (at the API version this cluster serves) but holds one pod: the node has 2 cores.
        "reward": {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 1}},
    }
    values = tmp / "test-values.yaml"
    values.write_text(yaml.safe_dump(overrides))
    started = time.monotonic()
    helm("install", RELEASE, str(REPO / "k8s" / "grpo"), "-f", str(REPO / "k8s" / "grpo" / "values-cpu.yaml"),
         "-f", str(values))  # fmt: skip
    r = Release(tmp, {"installed_s": round(time.monotonic() - started, 1)})
    r.seen["started"] = started
    try:
        yield r
    finally:
        log.info("k8s test: %s", {k: v for k, v in r.seen.items() if k != "last_status"})
        helm("uninstall", RELEASE, "--wait", check=False)
        local("exec", "kubectl", "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", check=False)
        local("free-volumes", check=False)


def test_every_pod_becomes_ready(release: Release) -> None:
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        live = pods()
        components = {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in live}
        if components == set(COMPONENTS) and len(live) == 5 and all(ready(p) for p in live):
            break
        for pod in live:  # a pod that cannot start will not start by waiting
            for c in pod["status"].get("containerStatuses", []):
                reason = (c.get("state", {}).get("waiting") or {}).get("reason", "")
                assert reason not in ("ErrImageNeverPull", "CreateContainerConfigError", "InvalidImageName"), diagnose()
        time.sleep(3)
    else:
        raise AssertionError(f"pods not Ready after 900 s\n{diagnose()}")
    release.seen["ready_s"] = round(time.monotonic() - release.seen["started"], 1)
    claims = {c["metadata"]["name"]: c["status"]["phase"] for c in get("pvc")}
    assert claims == {f"checkpoints-{FULL}-trainer-0": "Bound", f"data-{FULL}-redis-0": "Bound"}, claims


def test_the_chart_renders_for_the_cluster_it_meets(release: Release) -> None:
    """Kubernetes 1.20: PodDisruptionBudget policy/v1beta1, HPA autoscaling/v2beta2, AppArmor by annotation."""
    docs = [d for d in yaml.safe_load_all(helm("get", "manifest", RELEASE)) if d]
    versions = {d["kind"]: d["apiVersion"] for d in docs}
    assert versions["PodDisruptionBudget"] == "policy/v1beta1"
    assert versions["HorizontalPodAutoscaler"] == "autoscaling/v2beta2"
    reward = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{FULL}-reward")
    template = reward["spec"]["template"]
    assert template["metadata"]["annotations"]["container.apparmor.security.beta.kubernetes.io/reward"] == "unconfined"
    assert "appArmorProfile" not in template["spec"]["securityContext"]


def test_pods_reach_services_by_name(release: Release) -> None:
    rollout = pods("rollout")[0]["metadata"]["name"]
    names = [f"{FULL}-redis", f"{FULL}-reward.{NAMESPACE}", f"{FULL}-trainer.{NAMESPACE}.svc.cluster.local"]
    script = "import socket, sys; print(' '.join(socket.gethostbyname(n) for n in sys.argv[1:]))"
    resolved = kubectl("exec", rollout, "--", "python", "-c", script, *names).split()
    assert resolved == [cluster_ip(n.split(".")[0]) for n in names]


def test_readme_verifier_examples_through_the_service(release: Release) -> None:
    examples = verifier_examples()
    assert {path for path, _, _ in examples} == {"/v1/verify/math", "/v1/execute", "/v1/verify/code", "/v1/score"}
    with service_client(f"{FULL}-reward", 8002, release.tmp) as reward:
        assert reward.post("/v1/verify/math", json=examples[0][1]).status_code == 401  # the token is required
        assert reward.get("/healthz").status_code == 200  # probes stay open
        for path, body, expected in examples:
            reply = reward.post(path, json=body, headers={"authorization": f"Bearer {TOKEN}"})
            assert reply.status_code == 200, (path, reply.text)
            assert not mismatches(reply.json(), expected), (path, reply.json())


def test_helm_test_passes(release: Release) -> None:
    """The chart's own test (what a user runs after installing): a pod calls the verifier by Service name."""
    # No --logs: Helm fetches them after the hook-succeeded clean-up has deleted the pod (helm/helm#9098).
    out = helm("test", RELEASE, "--timeout", "5m")  # the pod exits 1 unless the answer is judged correct
    assert re.search(r"Phase:\s+Succeeded", out), out
    assert kubectl("get", "pod", f"{FULL}-test-verifier", "--ignore-not-found", "-o", "name") == ""  # cleaned up


def test_the_sandbox_isolates_code_inside_the_reward_pod(release: Release) -> None:
    redis_ip, trainer_ip = cluster_ip(f"{FULL}-redis"), cluster_ip(f"{FULL}-trainer")
    probe = (
        "import os, socket\n"
        "print('uid', os.getuid())\n"
        f"for host, port in (({redis_ip!r}, 6379), ({trainer_ip!r}, 8003), ('1.1.1.1', 53)):\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2); print('reached', host)\n"
        "    except OSError as e:\n"
        "        print('blocked', host, type(e).__name__)\n"
    )
    headers = {"authorization": f"Bearer {TOKEN}"}
    with service_client(f"{FULL}-reward", 8002, release.tmp) as reward:
        out = reward.post("/v1/execute", headers=headers, json={"language": "python", "code": probe, "timeout_s": 10})
        assert out.status_code == 200, out.text
        run = out.json()
        assert run["status"] == "ok", run
        uid = int(run["stdout"].split("uid ")[1].split()[0])
        assert uid not in (0, 10001), f"generated code ran as uid {uid}"
        assert "reached" not in run["stdout"] and run["stdout"].count("blocked") == 3, run["stdout"]
        c_program = '#include <stdio.h>\nint main(){ int a, b; scanf("%d %d", &a, &b); printf("%d\\n", a + b); }'
        # One test (a single run), then three (a batch), the second time from the program the worker holds.
        for tests in ([("2 40", "42")], [("2 40", "42"), ("-1 1", "0"), ("7 8", "15")]):
            body = {"language": "c", "code": c_program,
                    "tests": [{"stdin": i, "expected_stdout": o} for i, o in tests]}  # fmt: skip
            verdict = reward.post("/v1/verify/code", headers=headers, json=body).json()
            assert (verdict["passed"], verdict["total"]) == (len(tests), len(tests)), verdict
        release.seen["sandbox"] = reward.get("/healthz").json().get("sandbox")
    # The pod runs the chart's securityContext: read-only root, exactly the four capabilities added.
    pod = pods("reward")[0]
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN", "SETUID", "SETGID", "KILL"]


def test_network_policies_select_the_live_pods(release: Release) -> None:
    """The bridge CNI here does not enforce NetworkPolicies: check what they would allow, on the live pods' labels."""
    policies = get("networkpolicies")
    namespace = json.loads(local("exec", "kubectl", "get", "namespace", NAMESPACE, "-o", "json"))
    namespace_labels = namespace["metadata"].get("labels") or {}  # 1.20 sets no kubernetes.io/metadata.name
    live = {c: Pod(pods(c)[0]["metadata"]["labels"], NAMESPACE, namespace_labels) for c in COMPONENTS}
    assert all(isolated(policies, pod) for pod in live.values())
    assert reachability(policies, live) == CHART_REACHABILITY


def test_grpo_learns_while_pods_are_deleted(release: Release) -> None:
    def grpo_step(at_least: int) -> Callable[[dict[str, Any]], bool]:
        return lambda s: s.get("stage", "").endswith("grpo") and s.get("step", 0) >= at_least

    with service_client(f"{FULL}-trainer", 8003, release.tmp) as trainer:
        release.wait(trainer, "GRPO step 8", grpo_step(8), timeout=1500)
        victim = pods("rollout")[0]["metadata"]["name"]
        kubectl("delete", "pod", victim, "--wait=false")
        deleted = time.monotonic()

        def replaced(s: dict[str, Any]) -> bool:  # the deleted pod deregistered, its successor registered
            ids = {r["replica_id"] for r in s.get("replicas", [])}
            return victim not in ids and len(ids) == 2

        release.wait(trainer, "the deleted rollout pod's successor", replaced, timeout=600)
        release.seen["rollout_replaced_s"] = round(time.monotonic() - deleted, 1)
        release.wait(trainer, "GRPO step 16 after replacing a rollout pod", grpo_step(16), timeout=600)
        kubectl("delete", "pod", pods("reward")[0]["metadata"]["name"], "--wait=false")
        release.wait(trainer, "GRPO step 24 after deleting the reward pod", grpo_step(24), timeout=600)
        release.seen["trainer_deleted_at_step"] = release.seen["last_status"]["step"]
        trainer_pod = pods("trainer")[0]
        before = trainer_pod["metadata"]["uid"]
        kubectl("delete", "pod", trainer_pod["metadata"]["name"], "--wait=false")
    # A new pod (same name, same claim): it resumes where the checkpoint left off, without redoing the SFT stage.
    deadline = time.monotonic() + 300
    while not any(p["metadata"]["uid"] != before for p in pods("trainer")):
        assert time.monotonic() < deadline, diagnose()
        time.sleep(2)
    with service_client(f"{FULL}-trainer", 8003, release.tmp) as trainer:
        first = release.wait(trainer, "the new trainer pod to answer", lambda s: s.get("phase") != "starting", 600)
        assert first.get("stage", "").endswith("grpo") and first["step"] >= 20, first  # SFT done, GRPO resumed
        resumed = re.search(r"resumed at step (\d+)", kubectl("logs", f"{FULL}-trainer-0"))
        assert resumed, "the new trainer pod did not resume from a checkpoint"
        # The deleted pod finished its step and checkpointed on SIGTERM: at least where the test last saw it.
        assert int(resumed.group(1)) >= release.seen["trainer_deleted_at_step"], resumed.group(0)
        release.seen["trainer_resumed_at_step"] = int(resumed.group(1))
        done = release.wait(trainer, "the run to finish", lambda s: s.get("phase") == "done", timeout=1500)
        release.seen["done_s"] = round(time.monotonic() - release.seen["started"], 1)
    assert done["step"] == GRPO_STEPS
    name = f"{FULL}-trainer-0"
    last = json.loads(kubectl("exec", name, "--", "cat", "/checkpoints/stage-2-grpo/metrics.jsonl").splitlines()[-1])
    dropped = sum(v for k, v in last.items() if k.startswith("tasks/dropped/"))
    assert last["step"] == GRPO_STEPS and last["tasks/balanced"] == 1.0, last
    assert last["tasks/published"] == last["tasks/trained"] + dropped + last["tasks/in_flight"], last
    assert last["tasks/trained"] > 0
    release.seen["accounting"] = {k: v for k, v in last.items() if k.startswith("tasks/")}
    summary = json.loads(kubectl("exec", name, "--", "cat", "/checkpoints/summary.json"))
    release.seen["summary"] = {k: summary.get(k) for k in ("eval_accuracy_before", "eval_accuracy_after",
                                                           "eval_accuracy_gain", "wall_seconds")}  # fmt: skip
    assert [s["mode"] for s in summary["stages"]] == ["sft", "grpo"]
    assert summary["eval_accuracy_gain"] >= 0.20, summary["eval_history"]
    warnings = [line for line in kubectl("logs", name).splitlines() if " WARNING " in line or " ERROR " in line]
    release.seen["trainer_warnings"] = warnings[-10:]  # for the report: what the run had to ride out
    # A finished run keeps serving (--when-done serve): Ready, not restarted in a loop.
    time.sleep(15)
    pod = next(p for p in pods("trainer"))
    assert ready(pod) and pod["status"]["containerStatuses"][0]["restartCount"] == 0, pod["status"]


def test_helm_uninstall_leaves_only_the_kept_claims(release: Release) -> None:
    helm("uninstall", RELEASE, "--wait", timeout=600)
    deadline = time.monotonic() + 180  # terminating pods included: the trainer checkpoints on SIGTERM
    while get("pods", "-l", f"app.kubernetes.io/instance={RELEASE}") and time.monotonic() < deadline:
        time.sleep(2)
    kinds = "all,configmaps,secrets,networkpolicies,poddisruptionbudgets,persistentvolumeclaims,serviceaccounts"
    left = kubectl("get", kinds, "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name").split()
    # A StatefulSet's claims outlive it on purpose (checkpoints, the AOF): they carry the release's labels.
    assert sorted(left) == [
        f"persistentvolumeclaim/checkpoints-{FULL}-trainer-0",
        f"persistentvolumeclaim/data-{FULL}-redis-0",
    ]
    kubectl("delete", "pvc", "-l", f"app.kubernetes.io/instance={RELEASE}", "--wait=true")
    everything = kubectl("get", "all,configmaps,secrets,networkpolicies,pvc", "-o", "name").split()
    # What every namespace has: the default service account's token and the cluster's CA bundle.
    own = [x for x in everything if not x.startswith("secret/default-token-") and x != "configmap/kube-root-ca.crt"]
    assert own == [], everything
