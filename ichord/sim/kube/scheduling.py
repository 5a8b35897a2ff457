"""The scheduler's and the ReplicaSet controller's part of a drain (docs/decisions.md#config-rollout).

- ``schedulable``: the scheduler places no new pod on a Node with ``spec.unschedulable`` (a cordon).
- ``Replacer``: a Deployment pod deleted by anyone but a rollout (an eviction, ``kubectl delete``) is
  replaced by a new one, scheduled like any other pod, as the ReplicaSet controller keeps the replica
  count; so a drain under a PodDisruptionBudget completes instead of stalling.
- ``MIRROR_ANNOTATION``: the kubelet's mirror pods of static pods carry it (a drain leaves them alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ichord.sim.kube.podrules import template_hash
from ichord.sim.kube.resources import JSON
from ichord.sim.kube.status import ApiError
from ichord.sim.kube.store import Store

if TYPE_CHECKING:
    from ichord.sim.kube.clientpods import PodModel, PodState

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def schedulable(node: JSON) -> bool:
    return not (node.get("spec") or {}).get("unschedulable")


class Replacer:
    """Called with the state of a Deployment pod that was deleted behind the rollouts' back."""

    def __init__(self, store: Store, pods: PodModel, delay: Callable[[], float]) -> None:
        self.store = store
        self.pods = pods
        self.delay = delay
        self.replaced = 0

    def __call__(self, state: PodState) -> None:
        if state.owner[0] != "deployments":
            return
        asyncio.get_running_loop().call_later(max(0.0, self.delay()), self._replace, state.owner)

    def _replace(self, owner: tuple[str, str, str]) -> None:
        plural, namespace, name = owner
        try:
            obj = self.store.get(self.store.resolve("apps", "v1", plural), namespace, name)
        except ApiError:
            return  # the Deployment is gone: nothing to keep
        template = obj["spec"].get("template") or {}
        if len(self.pods.owned(obj["metadata"]["uid"])) >= int(obj["spec"].get("replicas", 1)):
            return
        self.pods.create_pod(obj, plural, template, template_hash(template), None)
        self.replaced += 1
        self.pods.record("pod_replaced", workload=f"{plural}/{name}")


STATIC_PODS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


def ensure_mirror_pods(store: Store, node: str) -> int:
    """The kubelet's mirror pods of a control plane's static pods (kube-system/<pod>-<node>); how many were added."""
    rt = store.resolve("", "v1", "pods")
    added = 0
    for pod in STATIC_PODS:
        name = f"{pod}-{node}"
        try:
            store.get(rt, "kube-system", name)
            continue
        except ApiError:
            pass
        try:
            store.create(rt, "kube-system", {
                "metadata": {"name": name, "namespace": "kube-system", "labels": {"component": pod, "tier":
                                                                                  "control-plane"},
                             "annotations": {MIRROR_ANNOTATION: name},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node,
                                                  "controller": True}]},
                "spec": {"nodeName": node, "containers": [{"name": pod, "image": f"registry.k8s.io/{pod}"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
        except ApiError:
            continue  # no kube-system yet: the next readiness change adds them
        added += 1
    return added
