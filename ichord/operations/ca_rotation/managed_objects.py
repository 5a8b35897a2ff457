"""The managed cluster's objects a ca-rotation reads and restarts, live through its admin client
(operations/managed/clients.py): Node readiness, kube-root-ca.crt in every namespace, the workloads Finalizing
restarts. Every failure is a ``ManagedAPIError`` (the operation waits)."""

from __future__ import annotations

from typing import Any

from ichord.api.names import ROOT_CA_CONFIGMAP
from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError, NotFound
from ichord.kube.reads import list_nodes, node_ready
from ichord.operations.managed.clients import ManagedAPIError
from ichord.pki import pem as _pem
from ichord.pki.scrub import SCRUBBER


async def not_ready_nodes(kc: KubeClient) -> list[str]:
    """Names of the Nodes that are not Ready (read live, never a cache)."""
    try:
        nodes = await list_nodes(kc)
    except KubeError as exc:
        raise ManagedAPIError(f"cannot list the Nodes: {SCRUBBER.exception(exc)}") from None
    if not nodes:
        raise ManagedAPIError("the managed cluster lists no Node")
    return sorted(str(n["metadata"]["name"]) for n in nodes if not node_ready(n))


async def root_ca_lagging(kc: KubeClient, cert_pem: bytes) -> list[str]:
    """Namespaces whose kube-root-ca.crt does not hold ``cert_pem`` (docs/decisions.md#rotation-state)."""
    want = _pem.pem_blocks(cert_pem)
    try:
        namespaces = await kc.raw("GET", "/api/v1/namespaces")
        maps = await kc.raw("GET", "/api/v1/configmaps",
                            query=[("fieldSelector", f"metadata.name={ROOT_CA_CONFIGMAP}")])
    except KubeError as exc:
        raise ManagedAPIError(f"cannot read {ROOT_CA_CONFIGMAP}: {SCRUBBER.exception(exc)}") from None
    holds: set[str] = set()
    for cm in maps.get("items") or []:
        if cm["metadata"].get("name") != ROOT_CA_CONFIGMAP:
            continue
        data = str((cm.get("data") or {}).get("ca.crt") or "").encode()
        blocks = _pem.pem_blocks(data) if data.strip() else []
        if all(b in blocks for b in want):
            holds.add(str(cm["metadata"].get("namespace")))
    active = [str(ns["metadata"]["name"]) for ns in namespaces.get("items") or []
              if (ns.get("status") or {}).get("phase", "Active") == "Active"]
    return sorted(ns for ns in active if ns not in holds)


async def get_workload(kc: KubeClient, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        out: dict[str, Any] = await kc.raw("GET", f"/apis/apps/v1/namespaces/{namespace}/{plural}/{name}")
    except NotFound:
        return None
    except KubeError as exc:
        raise ManagedAPIError(f"cannot read {plural}/{name}: {SCRUBBER.exception(exc)}") from None
    return out


async def patch_workload(kc: KubeClient, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
    try:
        await kc.raw("PATCH", f"/apis/apps/v1/namespaces/{namespace}/{plural}/{name}", body=patch,
                     content_type="application/merge-patch+json")
    except KubeError as exc:
        raise ManagedAPIError(f"cannot restart {plural}/{name}: {SCRUBBER.exception(exc)}") from None
