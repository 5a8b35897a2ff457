"""Cordon and uncordon a Node of the managed cluster, remembering that ichord did it (docs/decisions.md#config-rollout).

``spec.unschedulable`` and the annotation ``ichor.maesh.dev/cordoned-by-ichor`` change together in one
merge patch carrying the resourceVersion just read, so a concurrent edit fails the patch (409) instead
of being overwritten. A Node that is already unschedulable was cordoned by someone else: ichord neither
annotates nor, later, uncordons it.

Reads are live GETs: a cache must not decide a reboot. A step reads a Node once and decides on that copy for the
rest of the step (its Ready gate, its cordon or uncordon, its drain: roll_ports.KubeNodes holds it); never on a copy
older than the step. A cordon or uncordon sent on that copy carries its resourceVersion: a 409 means someone wrote
the Node since, so it is read again once and the decision taken again on what it says (a second 409 propagates: the
roll tries again on a later step), never a blind overwrite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ichord.api.names import GROUP
from ichord.kube.client import KubeClient
from ichord.kube.errors import Conflict
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
    #: The Node as read (or as a patch returned it): what else the step decides on, e.g. the drain's annotation.
    obj: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, obj: dict[str, Any]) -> NodeView:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        return cls(name=str(meta.get("name", "")), resource_version=str(meta.get("resourceVersion", "")),
                   ready=node_ready(obj), boot_id=str((status.get("nodeInfo") or {}).get("bootID") or ""),
                   unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
                   cordoned_by_ichord=CORDONED_BY_ICHORD_ANNOTATION in (meta.get("annotations") or {}), obj=obj)


async def read_node_view(kc: KubeClient, name: str) -> NodeView:
    """The Node now; NotFound and the other KubeErrors propagate."""
    return NodeView.of(await read_node(kc, name))


async def _patch(kc: KubeClient, name: str, patch: dict[str, Any]) -> NodeView:
    out: dict[str, Any] = await kc.raw("PATCH", f"/api/v1/nodes/{name}", body=patch, content_type=MERGE_PATCH)
    return NodeView.of(out)


def _cordon_patch(node: NodeView) -> dict[str, Any] | None:
    if node.unschedulable:
        return None
    return {"metadata": {"resourceVersion": node.resource_version,
                         "annotations": {CORDONED_BY_ICHORD_ANNOTATION: "true"}},
            "spec": {"unschedulable": True}}


def _uncordon_patch(node: NodeView) -> dict[str, Any] | None:
    if not node.cordoned_by_ichord:
        return None
    return {"metadata": {"resourceVersion": node.resource_version,
                         "annotations": {CORDONED_BY_ICHORD_ANNOTATION: None}},
            "spec": {"unschedulable": None}}


async def _decide_and_patch(kc: KubeClient, name: str, node: NodeView | None,
                            decide: Callable[[NodeView], dict[str, Any] | None]) -> tuple[NodeView, bool]:
    """The Node after the patch ``decide`` asks for on ``node`` (read now when None), and whether one was sent. On a
    409 the Node is read again and decided again once; a second 409 propagates."""
    node = node or await read_node_view(kc, name)
    patch = decide(node)
    if patch is None:
        return node, False
    try:
        return await _patch(kc, name, patch), True
    except Conflict:
        node = await read_node_view(kc, name)  # someone wrote it since it was read: decide on what it says now
        patch = decide(node)
        if patch is None:
            return node, False
        return await _patch(kc, name, patch), True


async def cordon(kc: KubeClient, name: str, node: NodeView | None = None) -> NodeView:
    """Make the Node unschedulable and mark it as ichord's cordon; a Node already unschedulable is left alone.
    ``node``: the Node as this step read it (read now when None)."""
    return (await _decide_and_patch(kc, name, node, _cordon_patch))[0]


async def release(kc: KubeClient, name: str, node: NodeView | None = None) -> NodeView | None:
    """Undo ichord's own cordon: the Node as the patch left it, None when nothing was sent (a Node ichord did not
    cordon is never touched). ``node``: the Node as this step read it (read now when None)."""
    after, sent = await _decide_and_patch(kc, name, node, _uncordon_patch)
    return after if sent else None


async def uncordon(kc: KubeClient, name: str, node: NodeView | None = None) -> bool:
    """Undo ichord's own cordon (True when a patch was sent); a Node ichord did not cordon is never touched."""
    return await release(kc, name, node) is not None
