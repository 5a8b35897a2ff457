"""Cordon and uncordon a Node of the managed cluster, remembering that ichord did it (docs/decisions.md#config-rollout).

``spec.unschedulable`` and the annotation ``ichor.maesh.dev/cordoned-by-ichor`` change together in one
merge patch carrying the resourceVersion just read, so a concurrent edit fails the patch (409) instead
of being overwritten. A Node that is already unschedulable was cordoned by someone else: ichord neither
annotates nor, later, uncordons it. Reads are live GETs: a cache must not decide a reboot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ichord.api.names import GROUP
from ichord.kube.client import KubeClient
from ichord.kube.reads import node_ready, read_node

#: On a Node ichord cordoned; its absence means a person (or nobody) cordoned it.
CORDONED_BY_ICHORD_ANNOTATION = f"{GROUP}/cordoned-by-ichor"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class NodeView:
    """What a roll decides on about one Node, read live."""

    name: str
    resource_version: str
    ready: bool
    #: ``status.nodeInfo.bootID`` as the kubelet reports it ("" when absent): a Ready from an older boot is stale.
    boot_id: str
    unschedulable: bool
    cordoned_by_ichord: bool

    @classmethod
    def of(cls, obj: dict[str, Any]) -> NodeView:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        return cls(name=str(meta.get("name", "")), resource_version=str(meta.get("resourceVersion", "")),
                   ready=node_ready(obj), boot_id=str((status.get("nodeInfo") or {}).get("bootID") or ""),
                   unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
                   cordoned_by_ichord=CORDONED_BY_ICHORD_ANNOTATION in (meta.get("annotations") or {}))


async def read_node_view(kc: KubeClient, name: str) -> NodeView:
    """The Node now; NotFound and the other KubeErrors propagate."""
    return NodeView.of(await read_node(kc, name))


async def _patch(kc: KubeClient, name: str, patch: dict[str, Any]) -> NodeView:
    out: dict[str, Any] = await kc.raw("PATCH", f"/api/v1/nodes/{name}", body=patch, content_type=MERGE_PATCH)
    return NodeView.of(out)


async def cordon(kc: KubeClient, name: str) -> NodeView:
    """Make the Node unschedulable and mark it as ichord's cordon; a Node already unschedulable is left alone."""
    node = await read_node_view(kc, name)
    if node.unschedulable:
        return node
    return await _patch(kc, name, {
        "metadata": {"resourceVersion": node.resource_version, "annotations": {CORDONED_BY_ICHORD_ANNOTATION: "true"}},
        "spec": {"unschedulable": True}})


async def uncordon(kc: KubeClient, name: str) -> bool:
    """Undo ichord's own cordon (True when a patch was sent); a Node ichord did not cordon is never touched."""
    node = await read_node_view(kc, name)
    if not node.cordoned_by_ichord:
        return False
    await _patch(kc, name, {
        "metadata": {"resourceVersion": node.resource_version, "annotations": {CORDONED_BY_ICHORD_ANNOTATION: None}},
        "spec": {"unschedulable": None}})
    return True
