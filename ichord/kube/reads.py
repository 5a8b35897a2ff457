"""Uncached reads of the objects that decide irreversible steps: Secrets, ConfigMaps, Nodes.

Always a GET to the API server, never an informer cache: a stale cache must not decide a reboot.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from ichord.kube.client import KubeClient
from ichord.kube.errors import translate


@dataclass(frozen=True)
class SecretData:
    name: str
    namespace: str
    resource_version: str
    data: dict[str, bytes] = field(repr=False)
    labels: dict[str, str] = field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    deleting: bool = False  # metadata.deletionTimestamp is set (a finalizer holds it)

    def __repr__(self) -> str:  # never print secret values
        return f"SecretData({self.namespace}/{self.name}, keys={sorted(self.data)})"


async def read_secret(client: KubeClient, namespace: str, name: str) -> SecretData:
    with translate():
        raw: dict[str, Any] = await client.raw("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
    data = {k: base64.b64decode(v) for k, v in (raw.get("data") or {}).items()}
    meta = raw.get("metadata") or {}
    return SecretData(name, namespace, str(meta.get("resourceVersion", "")), data,
                      {str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
                      tuple(str(f) for f in meta.get("finalizers") or ()), bool(meta.get("deletionTimestamp")))


async def label_secret(client: KubeClient, namespace: str, name: str, labels: dict[str, str]) -> None:
    """Add ``labels`` to a Secret: a read then an update carrying its resourceVersion (a change made between the
    two is a Conflict, never overwritten). An update, not a patch: ichord's grant on Secrets is get and update."""
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    with translate():
        obj: dict[str, Any] = await client.raw("GET", path)
        meta = obj.setdefault("metadata", {})
        if all((meta.get("labels") or {}).get(k) == v for k, v in labels.items()):
            return
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
        await client.raw("PUT", path, body=obj)


async def read_config_map(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = await client.raw("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    return out


async def read_node(client: KubeClient, name: str) -> dict[str, Any]:
    out: dict[str, Any] = await client.raw("GET", f"/api/v1/nodes/{name}")
    return out


async def list_nodes(client: KubeClient, label_selector: str | None = None) -> list[dict[str, Any]]:
    query = [("labelSelector", label_selector)] if label_selector else []
    out = await client.raw("GET", "/api/v1/nodes", query=query)
    return list(out.get("items") or [])


def node_ready(node: dict[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False
