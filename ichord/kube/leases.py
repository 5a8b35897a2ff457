"""coordination.k8s.io/v1 Lease helpers: read, create and update with optimistic concurrency.

Times are RFC 3339 micro-times in UTC, as client-go writes them (MicroTime).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

from ichord.kube.client import KubeClient
from ichord.kube.errors import NotFound

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


def micro_time(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says; ``resource_version`` is the one read (empty before creation)."""

    holder: str | None
    duration_seconds: int
    acquire_time: dt.datetime | None = None
    renew_time: dt.datetime | None = None
    transitions: int = 0
    resource_version: str = ""

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_seconds,
                                "leaseTransitions": self.transitions}
        spec["acquireTime"] = micro_time(self.acquire_time) if self.acquire_time else None
        spec["renewTime"] = micro_time(self.renew_time) if self.renew_time else None
        return spec

    def with_(self, **changes: Any) -> LeaseRecord:
        return replace(self, **changes)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> LeaseRecord:
        spec = obj.get("spec") or {}
        return cls(holder=spec.get("holderIdentity") or None,
                   duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
                   acquire_time=parse_micro_time(spec.get("acquireTime")),
                   renew_time=parse_micro_time(spec.get("renewTime")),
                   transitions=int(spec.get("leaseTransitions") or 0),
                   resource_version=str((obj.get("metadata") or {}).get("resourceVersion", "")))


async def get_lease(client: KubeClient, namespace: str, name: str) -> LeaseRecord | None:
    try:
        obj = await client.raw("GET", f"{LEASES.format(ns=namespace)}/{name}")
    except NotFound:
        return None
    return LeaseRecord.from_object(obj)


async def create_lease(client: KubeClient, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
    """Create; raises AlreadyExists when another process created it first."""
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace}, "spec": record.spec()}
    obj = await client.raw("POST", LEASES.format(ns=namespace), body=body)
    return LeaseRecord.from_object(obj)


async def update_lease(client: KubeClient, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
    """PUT with ``record.resource_version``: raises Conflict if the Lease changed since it was read."""
    if not record.resource_version:
        raise ValueError("update_lease needs the resourceVersion that was read")
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": record.resource_version},
            "spec": record.spec()}
    obj = await client.raw("PUT", f"{LEASES.format(ns=namespace)}/{name}", body=body)
    return LeaseRecord.from_object(obj)
