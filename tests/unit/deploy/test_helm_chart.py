"""The Helm chart lints and renders with Helm itself, validates against the Kubernetes
schemas, and has the properties the deployment promises (probes, security, policies).

One file past 500 lines on purpose: every test reads the same renders of the chart (a module fixture runs
Helm once per values set), and the properties are the chart's, listed in one place."""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from grpo.common.queue import TASKS_GROUP, stream_keys
from tests.support.netpol import CHART_REACHABILITY, Pod, allowed, isolated, reachability
from tests.support.readme_examples import verifier_examples

CHART = Path(__file__).resolve().parents[3] / "k8s" / "grpo"
K8S_VERSION = "1.33.0"
# Custom resources have no schema in kubernetes-validate; their shape is asserted below.
CRD_KINDS = {"ServiceMonitor", "ScaledObject", "TriggerAuthentication"}
VALUE_FILES = {"default": None, "cpu": "values-cpu.yaml", "gpu": "values-gpu.yaml"}


def load_values(name: str) -> dict[str, Any]:
    file = VALUE_FILES[name]
    return yaml.safe_load((CHART / file).read_text()) if file else {}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    files = helm_python.Chart.load(str(CHART)).render(values, name="demo", namespace="grpo")
    docs = []
    for path, text in files.items():
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.fixture(scope="module", params=list(VALUE_FILES))
def manifests(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(load_values(request.param))


@pytest.mark.parametrize("name", list(VALUE_FILES))
def test_chart_lints_clean(name: str) -> None:
    result = helm_python.lint(str(CHART), load_values(name), strict=True)
    assert result["errors"] == []
    assert all(m["severity"] <= 1 for m in result["messages"]), result["messages"]


def test_every_manifest_validates_against_kubernetes_schemas(manifests: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = manifests
    assert len(docs) >= 12
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_workloads_have_probes_and_hardened_security(manifests: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = manifests
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    assert {n.rsplit("-", 1)[-1] for n in workloads} == {"reward", "rollout", "trainer", "redis"}
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert c["resources"]["requests"], name
            if not name.endswith("redis"):
                # Readiness is /readyz (can it work: Redis, sandbox, ...); liveness and start-up are /healthz.
                assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}, name
                for probe in ("livenessProbe", "startupProbe"):
                    assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, (name, probe)
                assert "http" in {p["name"] for p in c["ports"]}, name
                mounts = {m["mountPath"] for m in c["volumeMounts"]}
                assert {"/tmp", "/cache", "/etc/grpo"} <= mounts


def test_only_the_sandbox_pod_gets_extra_capabilities(manifests: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = manifests
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        added = pod["containers"][0]["securityContext"]["capabilities"].get("add", [])
        if name.endswith("reward"):
            assert sorted(added) == ["KILL", "SETGID", "SETUID", "SYS_ADMIN"]
        else:
            assert added == [], name
            assert pod["securityContext"]["runAsNonRoot"] is True, name


def test_unprivileged_sandbox_option_runs_reward_as_non_root() -> None:
    docs = render({"reward": {"sandboxPrivileged": False}})
    reward = by_kind(docs, "Deployment")["demo-grpo-reward"]["spec"]["template"]["spec"]
    assert reward["securityContext"]["runAsNonRoot"] is True
    assert "add" not in reward["containers"][0]["securityContext"]["capabilities"]
    # Math only by choice: readiness must not wait for a sandbox this pod cannot have.
    args = reward["containers"][0]["args"]
    assert args[args.index("--sandbox") + 1] == "off"
    privileged = by_kind(render({}), "Deployment")["demo-grpo-reward"]["spec"]["template"]["spec"]
    assert "--sandbox" not in privileged["containers"][0]["args"]


def test_network_policies_isolate_sandbox_and_weight_endpoint(manifests: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = manifests
    policies = by_kind(docs, "NetworkPolicy")
    reward = policies["demo-grpo-reward"]["spec"]
    assert reward["policyTypes"] == ["Ingress", "Egress"]
    assert reward["egress"] == [], "sandbox pods get no egress"
    grpc_rule = next(r for r in reward["ingress"] if r["ports"][0]["port"] == 7052)
    assert grpc_rule["from"] == [{"podSelector": {"matchLabels": selector("rollout")}}]
    rollout = policies["demo-grpo-rollout"]["spec"]
    weights_rule = next(r for r in rollout["ingress"] if r["ports"][0]["port"] == 7051)
    # From the trainer, and from the other replicas (relay fan-out), which may reach each other.
    assert weights_rule["from"] == [{"podSelector": {"matchLabels": selector(c)}} for c in ("trainer", "rollout")]
    to_replicas = next(
        r for r in rollout["egress"] if r.get("to") == [{"podSelector": {"matchLabels": selector("rollout")}}]
    )
    assert {"port": 7054, "protocol": "TCP"} in to_replicas["ports"]
    # The weights data port: open to the trainer and the replicas only, and the trainer may reach it.
    assert {"port": 7054, "protocol": "TCP"} in weights_rule["ports"]
    assert not any(p["port"] == 7054 for r in rollout["ingress"] if r is not weights_rule for p in r["ports"])
    trainer_egress = policies["demo-grpo-trainer"]["spec"]["egress"]
    to_rollout = next(
        r for r in trainer_egress if r.get("to") == [{"podSelector": {"matchLabels": selector("rollout")}}]
    )
    assert {"port": 7054, "protocol": "TCP"} in to_rollout["ports"]
    pod = by_kind(docs, "Deployment")["demo-grpo-rollout"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "weights", "containerPort": 7054, "protocol": "TCP"} in pod["ports"]
    assert pod["args"][pod["args"].index("--weights-data-port") + 1] == "7054"


def test_network_policies_allow_exactly_the_chart_paths(manifests: tuple[str, list[dict[str, Any]]]) -> None:
    """Evaluated as an enforcing CNI would, over the pod templates' labels (tests/k8s does it on live pods)."""
    _, docs = manifests
    policies = [
        {**p, "metadata": {**p["metadata"], "namespace": "grpo"}} for p in by_kind(docs, "NetworkPolicy").values()
    ]
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    pods = {
        name.rsplit("-", 1)[-1]: Pod(w["spec"]["template"]["metadata"]["labels"], "grpo")
        for name, w in workloads.items()
    }
    assert all(isolated(policies, pod) for pod in pods.values())
    assert reachability(policies, pods) == CHART_REACHABILITY


def selector(component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "grpo",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/component": component,
    }


def test_trainer_is_a_statefulset_with_checkpoint_pvc_and_auto_resume(
    manifests: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = manifests
    trainer = by_kind(docs, "StatefulSet")["demo-grpo-trainer"]
    claim = trainer["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "checkpoints"
    assert claim["spec"]["resources"]["requests"]["storage"]
    assert claim["metadata"]["labels"] == selector("trainer")  # helm uninstall keeps it: the labels find it
    assert "storageClassName" not in claim["spec"]  # the cluster's default class
    args = trainer["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--resume") + 1] == "auto"
    assert args[args.index("--when-done") + 1] == "serve"  # a finished run is not restarted in a loop
    assert "/checkpoints" in args


@pytest.mark.parametrize(
    ("values", "trainer_class", "redis_class"),
    [
        ({"storageClass": "fast"}, "fast", "fast"),
        ({"storageClass": "-"}, "", ""),  # no class: bind a pre-made PersistentVolume
        ({"storageClass": "fast", "redis": {"persistence": {"storageClass": "slow"}}}, "fast", "slow"),
        ({"trainer": {"checkpoints": {"storageClass": "nfs"}}}, "nfs", None),
    ],
)
def test_claims_take_the_storage_class_given(
    values: dict[str, Any], trainer_class: str, redis_class: str | None
) -> None:
    sets = by_kind(render(values), "StatefulSet")
    for name, expected in (("demo-grpo-trainer", trainer_class), ("demo-grpo-redis", redis_class)):
        spec = sets[name]["spec"]["volumeClaimTemplates"][0]["spec"]
        assert spec.get("storageClassName") == expected, (name, spec)


def test_the_builtin_data_has_the_sft_answers() -> None:
    data = by_kind(render(load_values("cpu")), "ConfigMap")["demo-grpo-data"]["data"]
    assert set(data) == {"train.jsonl", "eval.jsonl", "sft.jsonl"}
    assert data["sft.jsonl"] == (CHART / "files" / "sft.jsonl").read_text().rstrip("\n")
    assert sum(len(v) for v in data.values()) < 1_000_000  # a ConfigMap holds 1 MiB


def test_reward_autoscales_on_cpu_and_has_disruption_budgets(manifests: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = manifests
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    if name == "cpu":
        assert hpas == {}
        assert by_kind(docs, "Deployment")["demo-grpo-reward"]["spec"]["replicas"] == 1
    else:
        metric = hpas["demo-grpo-reward"]["spec"]["metrics"][0]
        assert metric["resource"]["name"] == "cpu"
    budgets = by_kind(docs, "PodDisruptionBudget")
    assert set(budgets) == {"demo-grpo-reward", "demo-grpo-rollout"}
    for budget_name, budget in budgets.items():  # a drain must be able to move at least one pod
        fewest = hpas[budget_name]["spec"]["minReplicas"] if budget_name in hpas else None
        fewest = fewest or by_kind(docs, "Deployment")[budget_name]["spec"].get("replicas", 1)
        spec = budget["spec"]
        assert spec.get("maxUnavailable", 0) >= 1 or fewest > spec["minAvailable"], (name, budget_name, spec)


def test_gpu_values_request_gpus_and_scale_rollout_on_queue_depth() -> None:
    docs = render(load_values("gpu"))
    rollout = by_kind(docs, "Deployment")["demo-grpo-rollout"]
    container = rollout["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].endswith("grpo-rollout-gpu:0.1.0")
    scaled = by_kind(docs, "ScaledObject")["demo-grpo-rollout"]
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "redis-streams"
    # The queue's own stream and group (a name KEDA cannot find scales nothing), on its backlog: tasks not yet
    # read (lag). The pending list holds only what replicas already read, a batch each, never the backlog.
    run = load_values("gpu")["run"].get("id", "grpo-run")
    assert (trigger["metadata"]["stream"], trigger["metadata"]["consumerGroup"]) == (stream_keys(run)[0], TASKS_GROUP)
    assert "lagCount" in trigger["metadata"] and "pendingEntriesCount" not in trigger["metadata"]
    assert trigger["metadata"]["address"] == "demo-grpo-redis.grpo.svc:6379"  # KEDA resolves it from its namespace
    assert "replicas" not in rollout["spec"] and scaled["spec"]["minReplicaCount"] == 2  # values-gpu's replicas: 2
    trainer = by_kind(docs, "StatefulSet")["demo-grpo-trainer"]["spec"]["template"]["spec"]["containers"][0]
    assert trainer["command"][0] == "torchrun"
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 4


def test_external_redis_replaces_the_builtin_one_and_its_url_stays_in_a_secret() -> None:
    """An external Redis's URL may carry a password: the pods read it from a Secret, never from their spec."""
    url = "rediss://default:S3cretPass@redis.example:6379/2"
    docs = render({"redis": {"enabled": False, "externalUrl": url}})
    assert "demo-grpo-redis" not in by_kind(docs, "StatefulSet")
    config = by_kind(docs, "ConfigMap")["demo-grpo-config"]["data"]
    assert "trainer.yaml" in config
    assert by_kind(docs, "Secret")["demo-grpo-redis"]["stringData"] == {"redis-url": url}
    from_secret = {"secretKeyRef": {"name": "demo-grpo-redis", "key": "redis-url"}}
    for kind, name, var in (("Deployment", "rollout", "GRPO_ROLLOUT_REDIS_URL"),
                            ("StatefulSet", "trainer", "GRPO_TRAINER_REDIS_URL")):  # fmt: skip
        env = by_kind(docs, kind)[f"demo-grpo-{name}"]["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": var, "valueFrom": from_secret} in env
    assert all("S3cretPass" not in json.dumps(d) for d in docs if d["kind"] != "Secret")
    # Or a Secret of the user's own: no URL in the chart's values at all.
    docs = render({"redis": {"enabled": False, "existingSecret": "my-redis", "externalPort": 6380}})
    assert "demo-grpo-redis" not in by_kind(docs, "Secret")
    env = by_kind(docs, "Deployment")["demo-grpo-rollout"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {
        "name": "GRPO_ROLLOUT_REDIS_URL",
        "valueFrom": {"secretKeyRef": {"name": "my-redis", "key": "redis-url"}},
    } in env
    ports = [
        p["port"] for r in by_kind(docs, "NetworkPolicy")["demo-grpo-trainer"]["spec"]["egress"] for p in r["ports"]
    ]
    assert 6380 in ports


def test_an_external_redis_is_reachable_through_the_network_policies() -> None:
    """The default policies let rollout and trainer reach only the built-in Redis's pods: with an external one
    nothing trained. They now reach it on its URL's port, anywhere or at the peers given."""
    redis_pod = Pod({"app": "redis"}, "data", {"kubernetes.io/metadata.name": "data"})
    other_pod = Pod({"app": "web"}, "data", {"kubernetes.io/metadata.name": "data"})

    def reaches(values: dict[str, Any], dst: Pod, port: int) -> dict[str, bool]:
        docs = render({"redis": {"enabled": False, **values}})
        policies = [
            {**p, "metadata": {**p["metadata"], "namespace": "grpo"}} for p in by_kind(docs, "NetworkPolicy").values()
        ]
        workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
        pods = {
            n.rsplit("-", 1)[-1]: Pod(w["spec"]["template"]["metadata"]["labels"], "grpo") for n, w in workloads.items()
        }
        return {name: allowed(policies, pod, dst, port) for name, pod in pods.items()}

    url = {"externalUrl": "rediss://default:secret@redis.data.svc:6380/0"}
    assert reaches(url, redis_pod, 6380) == {"rollout": True, "trainer": True, "reward": False}
    assert not any(reaches(url, redis_pod, 6379).values())  # the URL's port only
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "data"}},
              "podSelector": {"matchLabels": {"app": "redis"}}}]  # fmt: skip
    assert reaches({**url, "externalEgress": peers}, redis_pod, 6380)["trainer"]
    assert not any(reaches({**url, "externalEgress": peers}, other_pod, 6380).values())
    assert reaches({"externalUrl": "redis://10.0.0.5/0"}, redis_pod, 6379)["rollout"]  # no port: Redis's default


def test_users_mount_their_own_data_model_and_model_cache() -> None:
    """Data off the built-in ConfigMap, a local model, a cache that survives restarts: volumes of the user's own."""
    data = {"name": "data", "persistentVolumeClaim": {"claimName": "my-data"}}
    mount = {"name": "data", "mountPath": "/mnt/data", "readOnly": True}
    extra = {"extraVolumes": [data], "extraVolumeMounts": [mount]}
    docs = render({"data": {"builtin": False}, "modelCache": {"existingClaim": "models-rwx"},
                   "trainer": extra, "rollout": extra})  # fmt: skip
    for kind, name in (("StatefulSet", "trainer"), ("Deployment", "rollout")):
        pod = by_kind(docs, kind)[f"demo-grpo-{name}"]["spec"]["template"]["spec"]
        assert data in pod["volumes"] and mount in pod["containers"][0]["volumeMounts"]
        cache = next(v for v in pod["volumes"] if v["name"] == "cache")
        assert cache == {"name": "cache", "persistentVolumeClaim": {"claimName": "models-rwx"}}
    for doc in docs:
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("trainer", "image"),
    [({}, "grpo-trainer:"), ({"gpus": 1}, "grpo-trainer-gpu:"), ({"backend": "deepspeed"}, "grpo-trainer-gpu:")],
)
def test_a_gpu_trainer_gets_the_image_with_cuda_torch(trainer: dict[str, Any], image: str) -> None:
    """The CPU image's torch has no CUDA: a trainer given a GPU with it trained on the CPU without a word."""
    pod = by_kind(render({"trainer": trainer}), "StatefulSet")["demo-grpo-trainer"]["spec"]["template"]["spec"]
    assert image in pod["containers"][0]["image"]


def test_keda_with_an_external_redis_needs_its_address() -> None:
    external = {"redis": {"enabled": False, "externalUrl": "redis://redis.data.svc:6379/0"}}
    with pytest.raises(Exception, match=r"rollout\.keda\.redisAddress is required with an external Redis"):
        render({**external, "rollout": {"keda": {"enabled": True}}})
    keda = {"enabled": True, "redisAddress": "redis.data.svc:6379", "authenticationRef": "redis-auth"}
    trigger = by_kind(render({**external, "rollout": {"keda": keda}}), "ScaledObject")["demo-grpo-rollout"]
    assert trigger["spec"]["triggers"][0]["metadata"]["address"] == "redis.data.svc:6379"
    assert trigger["spec"]["triggers"][0]["authenticationRef"] == {"name": "redis-auth"}


def test_external_redis_without_url_is_a_clear_error() -> None:
    with pytest.raises(Exception, match=r"redis\.externalUrl \(or redis\.existingSecret\) is required"):
        render({"redis": {"enabled": False}})


def test_service_monitor_and_dashboard() -> None:
    docs = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    monitor = by_kind(docs, "ServiceMonitor")["demo-grpo"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    dashboard = by_kind(docs, "ConfigMap")["demo-grpo-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["grpo.json"])["panels"]
    assert len(panels) >= 6


def test_the_trainer_uses_exact_sampler_logprobs_only_where_the_engine_gives_them() -> None:
    def trainer_yaml(values: dict[str, Any]) -> dict[str, Any]:
        config = next(
            d for d in render(values) if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")
        )
        return yaml.safe_load(config["data"]["trainer.yaml"])

    assert trainer_yaml({})["sampler_exact"] is True  # hf engine, float32 (the default)
    assert "sampler_exact" not in trainer_yaml(load_values("gpu"))  # vLLM / bf16: TIS corrects stale samples
    assert trainer_yaml({"run": {"trainer": {"sampler_exact": False}}})["sampler_exact"] is False


def test_helm_test_makes_the_readme_math_call_through_the_service() -> None:
    """`helm test`: a pod (deleted when it passes) posts the README's first verifier call to the reward Service."""
    hook = by_kind(render(load_values("cpu")), "Pod")["demo-grpo-test-verifier"]
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "hook-succeeded" in hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    container = hook["spec"]["containers"][0]
    script = container["command"][-1]
    path, readme_body, _ = verifier_examples()[0]
    assert f'url = "http://demo-grpo-reward:8002{path}"' in script
    assert ast.literal_eval(re.search(r"body = (\{.*\})", script).group(1)) == readme_body  # type: ignore[union-attr]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_every_port_names_its_protocol(manifests: tuple[str, list[dict[str, Any]]]) -> None:
    """Server-side apply (Helm 4's default) on Kubernetes before 1.26 refuses ports without the protocol key."""
    _, docs = manifests
    ports = [p for d in docs if d["kind"] == "Service" for p in d["spec"]["ports"]]
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            ports += [p for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
    assert len(ports) >= 12 and all(p.get("protocol") == "TCP" for p in ports), ports


def notes(values: dict[str, Any]) -> str:
    return str(
        helm_python.Chart.load(str(CHART)).render(values, name="demo", namespace="grpo")["grpo/templates/NOTES.txt"]
    )


def test_notes_say_why_pods_may_be_pending_and_what_to_set() -> None:
    """On a cluster without a default StorageClass the trainer and Redis wait Pending without an error: the notes
    printed after `helm install` name the claims, their class, how to see it and the value that fixes it."""
    default = notes({})
    assert "Pods Pending?" in default and "without a default StorageClass" in default
    assert (
        "checkpoints\n(50Gi, the cluster's default class) and Redis's AOF (8Gi, the cluster's default class)" in default
    )
    assert "kubectl get pvc -n grpo -l app.kubernetes.io/instance=demo" in default
    assert "kubectl get storageclass" in default and "--set storageClass=<a class from that list>" in default
    chosen = notes({"storageClass": "local-path", "trainer": {"checkpoints": {"storageClass": "fast"}}})
    assert "(50Gi, class fast) and Redis's AOF (8Gi, class local-path)" in chosen
    external = notes({"storageClass": "-", "redis": {"enabled": False, "externalUrl": "redis://r:6379/0"}})
    assert "checkpoints\n(50Gi, no class (a PersistentVolume you made))." in external and "Redis's AOF" not in external


def local_cluster_install() -> tuple[dict[str, Any], list[str]]:
    """The README's "On a local cluster" `helm install`: its values (the -f file with the --set values laid over
    it) and the images its `kind load` line loads."""
    text = (CHART.parents[1] / "README.md").read_text().split("**On a local cluster**", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    install = next(line for line in block.splitlines() if line.strip().startswith("helm install"))
    values = yaml.safe_load((CHART.parents[1] / re.search(r"-f (\S+)", install).group(1)).read_text())  # type: ignore[union-attr]
    for key, value in re.findall(r"--set ([\w.]+)=(\S+)", install):
        *path, last = key.split(".")
        target = values
        for part in path:
            target = target.setdefault(part, {})
        target[last] = value
    loaded = next(line for line in block.splitlines() if line.strip().startswith("kind load")).split()[3:]
    return values, loaded


def test_the_readme_local_cluster_install_uses_the_images_it_loads() -> None:
    """A loaded `grpo-reward:latest` is `docker.io/library/grpo-reward:latest` to the node: the chart must ask for
    exactly that, and never pull it."""
    values, loaded = local_cluster_install()
    wanted = {f"docker.io/library/{image}" for image in loaded}
    pods = [d["spec"]["template"]["spec"] for d in render(values) if d["kind"] in ("Deployment", "StatefulSet")]
    ours = [c for pod in pods for c in pod["containers"] if "/grpo-" in c["image"]]
    assert {c["image"] for c in ours} == wanted and len(wanted) == 3, ours
    assert {c["imagePullPolicy"] for c in ours} == {"Never"}


def container_env(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, dict[str, Any]]:
    pod = by_kind(docs, kind)[f"demo-grpo-{name}"]["spec"]["template"]["spec"]
    return {e["name"]: e for e in pod["containers"][0]["env"]}


def secret_ref(env: dict[str, Any]) -> dict[str, Any]:
    return dict(env["valueFrom"]["secretKeyRef"])


def test_a_token_and_a_redis_password_are_generated_when_none_is_given() -> None:
    """With no auth.apiToken the chart once ran every API open; with no redis.password, Redis took anyone."""
    first, second = render({}), render({})
    auth = by_kind(first, "Secret")["demo-grpo-auth"]["stringData"]
    assert len(auth["api-token"]) >= 32 and auth["weights-token"] == auth["api-token"]
    assert auth["api-token"] != by_kind(second, "Secret")["demo-grpo-auth"]["stringData"]["api-token"]  # random
    redis = by_kind(first, "Secret")["demo-grpo-redis"]["stringData"]
    password = redis["redis-password"]
    assert (
        len(password) >= 32 and password != by_kind(second, "Secret")["demo-grpo-redis"]["stringData"]["redis-password"]
    )
    assert redis["redis-url"] == f"redis://:{password}@demo-grpo-redis:6379/0"
    assert redis["users.acl"].strip() == f"user default on #{hashlib.sha256(password.encode()).hexdigest()} ~* &* +@all"
    assert all(password not in json.dumps(d) and auth["api-token"] not in json.dumps(d)
               for d in first if d["kind"] != "Secret")  # fmt: skip
    # What the operator gives is what is used.
    given = render({"auth": {"apiToken": "op-token"}, "redis": {"password": "op-pass"}})
    assert by_kind(given, "Secret")["demo-grpo-auth"]["stringData"]["api-token"] == "op-token"
    assert by_kind(given, "Secret")["demo-grpo-redis"]["stringData"]["redis-url"] == (
        "redis://:op-pass@demo-grpo-redis:6379/0"
    )
    # The notes printed after `helm install` say where the token is and send it.
    assert "kubectl get secret -n grpo demo-grpo-auth -o jsonpath='{.data.api-token}'" in notes({})
    assert '/v1/status -H "authorization: Bearer $TOKEN"' in notes({})


def test_every_service_requires_the_token_and_redis_the_password(
    manifests: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = manifests
    token = {"name": "demo-grpo-auth", "key": "api-token"}  # not optional: a Secret without it stops the pod
    for kind, name, variables in (
        ("Deployment", "reward", ["GRPO_REWARD_TOKEN"]),
        ("Deployment", "rollout", ["GRPO_ROLLOUT_TOKEN", "GRPO_ROLLOUT_REWARD_TOKEN"]),
        ("StatefulSet", "trainer", ["GRPO_TRAINER_TOKEN"]),
    ):
        env = container_env(docs, kind, name)
        for var in variables:
            assert secret_ref(env[var]) == token, (name, var)
    url = {"name": "demo-grpo-redis", "key": "redis-url"}
    assert secret_ref(container_env(docs, "Deployment", "rollout")["GRPO_ROLLOUT_REDIS_URL"]) == url
    assert secret_ref(container_env(docs, "StatefulSet", "trainer")["GRPO_TRAINER_REDIS_URL"]) == url
    redis = by_kind(docs, "StatefulSet")["demo-grpo-redis"]["spec"]["template"]["spec"]
    args = redis["containers"][0]["args"]
    acl = args[args.index("--aclfile") + 1]
    mount = next(m for m in redis["containers"][0]["volumeMounts"] if acl.startswith(m["mountPath"] + "/"))
    volume = next(v for v in redis["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "demo-grpo-redis"
    assert volume["secret"]["items"] == [{"key": "users.acl", "path": acl.rsplit("/", 1)[1]}]
    probe_env = {e["name"]: e for e in redis["containers"][0]["env"]}
    assert secret_ref(probe_env["REDISCLI_AUTH"]) == {"name": "demo-grpo-redis", "key": "redis-password"}


class FakeApiServer(ThreadingHTTPServer):
    """What Helm's `lookup` asks of a Kubernetes API server, answered from `objects` (path -> JSON): discovery
    of the core group and GET of one object. A stand-in for the cluster (tests/k8s runs the real one)."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects, self.asked = objects, []
        super().__init__(("127.0.0.1", 0), self.Handler)

    class Handler(BaseHTTPRequestHandler):
        server: FakeApiServer

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            self.server.asked.append(path)
            if path in self.server.objects:
                self.reply(200, self.server.objects[path])
            elif path == "/api":
                self.reply(200, {"kind": "APIVersions", "versions": ["v1"]})
            elif path == "/apis":
                self.reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
            elif path == "/api/v1":
                secrets = {"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret",
                           "verbs": ["get", "list"]}  # fmt: skip
                self.reply(200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [secrets]})
            elif path == "/version":
                self.reply(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0"})
            else:
                self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                 "code": 404})  # fmt: skip

        def reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass


def secret_object(name: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "grpo"}, "data": encoded}


def test_generated_secrets_are_kept_across_upgrades() -> None:
    """`helm upgrade` renders again: a new random token would lock every client out and a new Redis password
    would not match the running Redis. The chart looks up the Secrets it made and keeps their values."""
    existing = {
        "/api/v1/namespaces/grpo/secrets/demo-grpo-auth": secret_object(
            "demo-grpo-auth", {"api-token": "kept-token", "weights-token": "kept-token", "hf-token": ""}
        ),
        "/api/v1/namespaces/grpo/secrets/demo-grpo-redis": secret_object(
            "demo-grpo-redis", {"redis-password": "kept-pass", "redis-url": "x", "users.acl": "x"}
        ),
    }
    server = FakeApiServer(existing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = helm_python.Config(kube_apiserver=f"http://127.0.0.1:{server.server_address[1]}", namespace="grpo")
    try:
        files = config.render(helm_python.Chart.load(str(CHART)), {}, name="demo", namespace="grpo", is_upgrade=True)
    finally:
        config.close()
        server.shutdown()
    assert set(existing) <= set(server.asked), server.asked  # it did ask
    docs = [d for path, text in files.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    secrets = by_kind(docs, "Secret")
    assert secrets["demo-grpo-auth"]["stringData"]["api-token"] == "kept-token"
    assert secrets["demo-grpo-redis"]["stringData"]["redis-password"] == "kept-pass"
    assert secrets["demo-grpo-redis"]["stringData"]["redis-url"] == "redis://:kept-pass@demo-grpo-redis:6379/0"


def test_the_trainer_control_port_is_closed_unless_peers_are_named() -> None:
    """Stop and SaveCheckpoint were reachable from every namespace; operators use `kubectl port-forward`."""
    operator = Pod({"app": "ops"}, "ops", {"kubernetes.io/metadata.name": "ops"})
    outsider = Pod({"app": "web"}, "web", {"kubernetes.io/metadata.name": "web"})

    def reaches(values: dict[str, Any], src: Pod) -> bool:
        docs = render(values)
        policies = [
            {**p, "metadata": {**p["metadata"], "namespace": "grpo"}} for p in by_kind(docs, "NetworkPolicy").values()
        ]
        trainer = by_kind(docs, "StatefulSet")["demo-grpo-trainer"]["spec"]["template"]["metadata"]["labels"]
        return allowed(policies, src, Pod(trainer, "grpo"), 7053)

    assert not reaches({}, operator) and not reaches({}, outsider)
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}]
    assert reaches({"networkPolicy": {"trainerControlFrom": peers}}, operator)
    assert not reaches({"networkPolicy": {"trainerControlFrom": peers}}, outsider)


def test_keda_authenticates_to_the_builtin_redis() -> None:
    docs = render({"rollout": {"keda": {"enabled": True}}})
    trigger = by_kind(docs, "ScaledObject")["demo-grpo-rollout"]["spec"]["triggers"][0]
    auth = by_kind(docs, "TriggerAuthentication")[trigger["authenticationRef"]["name"]]
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "password", "name": "demo-grpo-redis",
                                                "key": "redis-password"}]  # fmt: skip


# Pod Security Standards, baseline level (kubernetes.io/docs/concepts/security/pod-security-standards), as
# Pod Security Admission checks it: what a pod may not set.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
BASELINE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def baseline_violations(template: dict[str, Any], kube_minor: int = 33) -> list[str]:
    """What in a pod template the baseline level refuses; empty when it is admitted. From Kubernetes 1.35 a pod
    with its own user namespace (hostUsers: false) may set procMount Unmasked (PSA's procMount 1.35 check)."""
    pod, found = template["spec"], []
    found += [f"spec.{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    found += [f"volume {v['name']}: hostPath" for v in pod.get("volumes", []) if "hostPath" in v]
    contexts = [("pod", pod.get("securityContext") or {})]
    containers = [*pod["containers"], *pod.get("initContainers", []), *pod.get("ephemeralContainers", [])]
    contexts += [(c["name"], c.get("securityContext") or {}) for c in containers]
    own_users = pod.get("hostUsers") is False and kube_minor >= 35
    for name, sc in contexts:
        if sc.get("privileged"):
            found.append(f"{name}: privileged")
        if sc.get("windowsOptions", {}).get("hostProcess"):
            found.append(f"{name}: hostProcess")
        extra = set(sc.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        found += [f"{name}: capability {cap}" for cap in sorted(extra)]
        if sc.get("procMount", "Default") != "Default" and not own_users:
            found.append(f"{name}: procMount {sc['procMount']}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"{name}: seccomp Unconfined")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            found.append(f"{name}: AppArmor Unconfined")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"{name}: seLinuxOptions {selinux}")
    for c in containers:
        found += [f"{c['name']}: hostPort {p['hostPort']}" for p in c.get("ports", []) if p.get("hostPort")]
    for key, value in template["metadata"].get("annotations", {}).items():
        apparmor = key.startswith("container.apparmor.security.beta.kubernetes.io/")
        if apparmor and value != "runtime/default" and not value.startswith("localhost/"):
            found.append(f"annotation {key}: {value}")
    sysctls = {s["name"] for s in pod.get("securityContext", {}).get("sysctls", [])}
    found += [f"sysctl {name}" for name in sorted(sysctls - BASELINE_SYSCTLS)]
    return found


def reward_template(values: dict[str, Any]) -> dict[str, Any]:
    return by_kind(render(values), "Deployment")["demo-grpo-reward"]["spec"]["template"]


ROOTLESS = {"reward": {"sandbox": {"mode": "rootless"}}}


def test_the_rootless_sandbox_pod_is_admitted_at_the_baseline_level() -> None:
    """Rootless: no root, no added capability, no Unconfined profile; the Localhost seccomp profile lets the sandbox
    make its user namespace. With unmaskedProc (the default: containerd masks /proc, and a user namespace cannot
    mount a fresh one over a masked one) it is baseline from Kubernetes 1.35, hostUsers false; without, from any."""
    template = reward_template(ROOTLESS)
    pod, container = template["spec"], template["spec"]["containers"][0]
    assert baseline_violations(template, kube_minor=35) == []
    assert baseline_violations(template, kube_minor=34) == ["reward: procMount Unmasked"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "grpo/reward-rootless.json",
    }
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["hostUsers"] is False and container["securityContext"]["procMount"] == "Unmasked"
    args = container["args"]
    assert args[args.index("--sandbox-mode") + 1] == "rootless" and "--sandbox" not in args
    for doc in render(ROOTLESS):
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)

    masked = reward_template({"reward": {"sandbox": {"mode": "rootless", "unmaskedProc": False}}})
    assert baseline_violations(masked, kube_minor=30) == []
    assert "hostUsers" not in masked["spec"] and "procMount" not in masked["spec"]["containers"][0]["securityContext"]

    apparmor = {"mode": "rootless", "appArmorProfile": "grpo-reward-rootless"}
    profile = reward_template({"reward": {"sandbox": apparmor}})["spec"]["securityContext"]["appArmorProfile"]
    assert profile == {"type": "Localhost", "localhostProfile": "grpo-reward-rootless"}


def test_the_root_sandbox_pod_stays_privileged_and_off_is_baseline() -> None:
    """The default (root mode) is what it was: the privileged level, with its four capabilities; off is baseline."""
    root = reward_template({})
    assert set(baseline_violations(root, kube_minor=35)) >= {"reward: capability SYS_ADMIN", "pod: seccomp Unconfined"}
    args = root["spec"]["containers"][0]["args"]
    assert args[args.index("--sandbox-mode") + 1] == "root"
    assert baseline_violations(reward_template({"reward": {"sandboxPrivileged": False}})) == []
    assert baseline_violations(reward_template({"reward": {"sandbox": {"mode": "off"}}})) == []
    with pytest.raises(Exception, match="root, rootless or off"):
        render({"reward": {"sandbox": {"mode": "unconfined"}}})


def test_a_runtime_class_such_as_gvisor_is_set_on_the_reward_pod_only() -> None:
    docs = render({"reward": {"runtimeClassName": "gvisor", "sandbox": {"mode": "rootless"}}})
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    classes = {name: w["spec"]["template"]["spec"].get("runtimeClassName") for name, w in workloads.items()}
    assert classes.pop("demo-grpo-reward") == "gvisor"
    assert set(classes.values()) == {None}
    assert "runtimeClassName" not in reward_template({})["spec"]
