"""Kubernetes NetworkPolicy semantics over label sets, for tests on clusters whose CNI does not enforce them.

`allowed(policies, src, dst, port)` answers what an enforcing CNI would: a connection from pod `src` to pod
`dst` on a TCP port passes if `src`'s egress and `dst`'s ingress both allow it. A pod no policy selects for a
direction is open in that direction; a selected one is open only to what some rule of a selecting policy lists.
Only what the chart uses is modelled: podSelector/namespaceSelector peers (matchLabels), numeric TCP ports;
the rest (ipBlock, matchExpressions, port ranges, named ports) raises NotImplementedError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# What the chart's policies must allow between its components (and a pod of some other namespace), on one port.
CHART_REACHABILITY = {
    ("trainer", "rollout", 7051): True, ("trainer", "rollout", 7054): True,  # weight pushes
    ("rollout", "rollout", 7051): True, ("rollout", "rollout", 7054): True,  # relay fan-out
    ("rollout", "reward", 7052): True, ("trainer", "reward", 7052): False,  # only rollout scores
    ("rollout", "redis", 6379): True, ("trainer", "redis", 6379): True,
    ("reward", "redis", 6379): False, ("reward", "rollout", 7051): False,  # the sandbox pod reaches nothing
    ("reward", "trainer", 8003): False, ("redis", "rollout", 7054): False,
    ("outsider", "rollout", 7051): False, ("outsider", "rollout", 7054): False, ("outsider", "redis", 6379): False,
    ("outsider", "reward", 7052): False, ("outsider", "reward", 8002): True,  # the verifier API is for the cluster
    ("outsider", "trainer", 8003): True,  # status (token) and metrics
    ("outsider", "trainer", 7053): False,  # control (Stop, SaveCheckpoint): `kubectl port-forward`, or named peers
}  # fmt: skip
OUTSIDER = {"app": "someone-else"}


@dataclass(frozen=True)
class Pod:
    labels: dict[str, str]
    namespace: str
    namespace_labels: dict[str, str] = field(default_factory=dict)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if selector.get("matchExpressions"):
        raise NotImplementedError("matchExpressions")
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def peer_matches(peer: dict[str, Any], pod: Pod, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        raise NotImplementedError("ipBlock")
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], pod.namespace_labels):
            return False
    elif pod.namespace != policy_namespace:  # a bare podSelector means the policy's own namespace
        return False
    return selects(peer.get("podSelector", {}), pod.labels)


def policy_types(policy: dict[str, Any]) -> list[str]:
    """The spec's default when unset: Ingress, plus Egress if the policy has egress rules."""
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress", "Egress"] if spec.get("egress") else ["Ingress"])


def port_matches(entry: dict[str, Any], port: int) -> bool:
    if "endPort" in entry or isinstance(entry.get("port"), str):
        raise NotImplementedError("port ranges and named ports")
    return entry.get("port") in (None, port) and entry.get("protocol", "TCP") == "TCP"


def rule_allows(rule: dict[str, Any], peers_key: str, other: Pod, port: int, namespace: str) -> bool:
    ports = rule.get("ports")
    if ports and not any(port_matches(p, port) for p in ports):
        return False
    peers = rule.get(peers_key)
    return not peers or any(peer_matches(peer, other, namespace) for peer in peers)


def direction_allows(policies: list[dict[str, Any]], pod: Pod, other: Pod, port: int, direction: str) -> bool:
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and selects(p["spec"]["podSelector"], pod.labels)
        and direction in policy_types(p)
    ]
    if not selecting:
        return True
    return any(
        rule_allows(rule, peers_key, other, port, p["metadata"]["namespace"])
        for p in selecting
        for rule in p["spec"].get(key) or []
    )


def allowed(policies: list[dict[str, Any]], src: Pod, dst: Pod, port: int) -> bool:
    return direction_allows(policies, src, dst, port, "Egress") and direction_allows(
        policies, dst, src, port, "Ingress"
    )


def reachability(policies: list[dict[str, Any]], pods: dict[str, Pod]) -> dict[tuple[str, str, int], bool]:
    """CHART_REACHABILITY's connections as the policies decide them, for the given pod of each component."""
    outsider = Pod(OUTSIDER, "other", {"kubernetes.io/metadata.name": "other"})
    return {(s, d, port): allowed(policies, pods.get(s, outsider), pods[d], port) for s, d, port in CHART_REACHABILITY}


def isolated(policies: list[dict[str, Any]], pod: Pod) -> bool:
    """Does some policy select the pod for ingress?"""
    return any(
        p["metadata"]["namespace"] == pod.namespace
        and selects(p["spec"]["podSelector"], pod.labels)
        and "Ingress" in policy_types(p)
        for p in policies
    )
