"""The Helm chart lints and renders with Helm itself, validates against the Kubernetes
schemas, and has the properties the deployment promises (probes, security, policies)."""

from __future__ import annotations

import ast
import json
import re
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
CRD_KINDS = {"ServiceMonitor", "ScaledObject"}
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
