"""The kube-system workloads a Talos cluster runs: the CNI, kube-proxy and CoreDNS (``addons=True``).

Shaped like Talos's own manifests where it matters to the pod model (clientpods.py): the agents'
DaemonSets tolerate every taint, CoreDNS runs 2 replicas that tolerate the control-plane taint (so
they spread over 2 Nodes) but not cilium's agent-not-ready taint, and cilium-operator tolerates
every taint like the cilium chart's default.
"""

from __future__ import annotations

from typing import Any

from ichord.sim.kube.podrules import CLIENT_NAMESPACE
from ichord.sim.kube.store import Store

JSON = dict[str, Any]
ALL_TAINTS = [{"operator": "Exists"}]
COREDNS_TOLERATIONS = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
                       {"key": "CriticalAddonsOnly", "operator": "Exists"}]


def _workload(plural: str, name: str, image: str, tolerations: list[JSON], replicas: int | None = None) -> JSON:
    spec: JSON = {"selector": {"matchLabels": {"k8s-app": name}},
                  "template": {"metadata": {"labels": {"k8s-app": name}},
                               "spec": {"containers": [{"name": name, "image": image}],
                                        "tolerations": tolerations}}}
    if replicas is not None:
        spec["replicas"] = replicas
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    else:
        spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    kind = "DaemonSet" if plural == "daemonsets" else "Deployment"
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": CLIENT_NAMESPACE},
            "spec": spec}


def addon_workloads(cni: str) -> list[tuple[str, JSON]]:
    """(plural, object) of every addon for the CNI preset (``unmanaged``: no CNI workload)."""
    out: list[tuple[str, JSON]] = []
    if cni == "cilium":
        out.append(("daemonsets", _workload("daemonsets", "cilium", "quay.io/cilium/cilium:v1.18.2", ALL_TAINTS)))
        out.append(("deployments", _workload("deployments", "cilium-operator",
                                             "quay.io/cilium/operator-generic:v1.18.2", ALL_TAINTS, replicas=1)))
    elif cni in ("flannel", ""):
        out.append(("daemonsets", _workload("daemonsets", "kube-flannel", "ghcr.io/siderolabs/flannel:v0.27.4",
                                            ALL_TAINTS)))
    out.append(("daemonsets", _workload("daemonsets", "kube-proxy", "registry.k8s.io/kube-proxy:v1.34.1",
                                        ALL_TAINTS)))
    out.append(("deployments", _workload("deployments", "coredns", "registry.k8s.io/coredns/coredns:v1.12.3",
                                         COREDNS_TOLERATIONS, replicas=2)))
    return out


def install_addons(store: Store, cni: str) -> list[tuple[str, str]]:
    """Create the addons (their pods follow from the simulated controllers); returns (plural, name) of each."""
    made = []
    for plural, obj in addon_workloads(cni):
        store.create(store.resolve("apps", "v1", plural), CLIENT_NAMESPACE, obj)
        made.append((plural, obj["metadata"]["name"]))
    return made
