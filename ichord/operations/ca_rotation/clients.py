"""Finalizing's client restarts: the in-cluster clients known to keep the old Kubernetes CA
(docs/decisions.md#client-restarts).

One at a time, each after the previous is available again: the CNI first (cilium DaemonSet, then the
cilium-operator Deployment; kube-flannel for flannel; nothing for an unmanaged CNI), then kube-proxy,
then coredns, all in kube-system. A restart is a rollout-restart merge patch of the pod template
(``kubectl.kubernetes.io/restartedAt`` plus ``ichor.maesh.dev/ca-rotation: <operation UID>``); a
template already carrying the UID is not patched again, which makes it idempotent across restarts
without a status field. A workload that does not exist is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ichord.api.names import CA_ROTATION_TEMPLATE_ANNOTATION, RESTARTED_AT_ANNOTATION
from ichord.failpoints import failpoint
from ichord.kube.client import KubeClient
from ichord.operations.ca_rotation.managed_objects import get_workload, patch_workload

NAMESPACE = "kube-system"


@dataclass(frozen=True)
class Workload:
    plural: str  # daemonsets | deployments
    name: str

    def __str__(self) -> str:
        return f"{self.plural.removesuffix('s')}/{self.name}"


_CNI: dict[str, tuple[Workload, ...]] = {
    "cilium": (Workload("daemonsets", "cilium"), Workload("deployments", "cilium-operator")),
    "flannel": (Workload("daemonsets", "kube-flannel"),),
    "unmanaged": (),
}
_TAIL = (Workload("daemonsets", "kube-proxy"), Workload("deployments", "coredns"))


def sequence(cni_preset: str) -> tuple[Workload, ...]:
    """The restart order for a cluster's CNI preset (Talos's default CNI is flannel)."""
    return (*_CNI.get(cni_preset or "flannel", ()), *_TAIL)


def cni_restarted(cni_preset: str) -> bool:
    return bool(_CNI.get(cni_preset or "flannel", ()))


def carries(obj: dict[str, Any], uid: str) -> bool:
    tpl = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return (tpl.get("annotations") or {}).get(CA_ROTATION_TEMPLATE_ANNOTATION) == uid


def available(obj: dict[str, Any]) -> bool:
    """The rollout finished: the controller saw the generation and every replica is updated and available."""
    meta, spec, st = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    if int(st.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return False
    if obj.get("kind") == "DaemonSet" or "desiredNumberScheduled" in st:
        desired = int(st.get("desiredNumberScheduled") or 0)
        return (int(st.get("updatedNumberScheduled") or 0) >= desired
                and int(st.get("numberAvailable") or 0) >= desired)
    replicas = int(spec.get("replicas", 1) or 0)
    return (int(st.get("updatedReplicas") or 0) >= replicas and int(st.get("availableReplicas") or 0) >= replicas
            and int(st.get("replicas") or 0) <= replicas)


def restart_patch(uid: str, restarted_at: str) -> dict[str, Any]:
    return {"spec": {"template": {"metadata": {"annotations": {
        RESTARTED_AT_ANNOTATION: restarted_at, CA_ROTATION_TEMPLATE_ANNOTATION: uid}}}}}


@dataclass
class Progress:
    done: bool
    waiting_for: Workload | None = None
    restarted: list[str] = field(default_factory=list)  # patched in this step
    skipped: list[str] = field(default_factory=list)  # absent from the cluster


async def restart_step(kc: KubeClient, uid: str, seq: tuple[Workload, ...], restarted_at: str) -> Progress:
    """Advance the sequence by at most one restart; done when every present workload is back."""
    progress = Progress(done=False)
    for w in seq:
        obj = await get_workload(kc, w.plural, NAMESPACE, w.name)
        if obj is None:
            progress.skipped.append(str(w))
            continue
        if not carries(obj, uid):
            failpoint("ca-rotation.restart.before")
            await patch_workload(kc, w.plural, NAMESPACE, w.name, restart_patch(uid, restarted_at))
            failpoint("ca-rotation.restart.after")
            progress.restarted.append(str(w))
            progress.waiting_for = w
            return progress
        if not available(obj):
            progress.waiting_for = w
            return progress
    progress.done = True
    return progress


async def not_back(kc: KubeClient, uid: str, seq: tuple[Workload, ...]) -> list[str]:
    """The present workloads not restarted by this operation or not available again."""
    out = []
    for w in seq:
        obj = await get_workload(kc, w.plural, NAMESPACE, w.name)
        if obj is not None and not (carries(obj, uid) and available(obj)):
            out.append(str(w))
    return out
