"""A TalosMachine object read into the fields the reconciler decides on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ichord.errors import IchordError


class MachineSpecError(IchordError):
    pass


@dataclass(frozen=True)
class MachineView:
    namespace: str
    name: str
    uid: str
    generation: int
    cluster: str
    role: str
    address: str
    approved: bool
    hostname: str | None
    spec: dict[str, Any] = field(repr=False)
    status: dict[str, Any] = field(repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def is_control_plane(self) -> bool:
        return self.role == "controlplane"

    @classmethod
    def of(cls, obj: dict[str, Any]) -> MachineView:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        cluster = (spec.get("clusterRef") or {}).get("name")
        if not cluster:
            raise MachineSpecError("spec.clusterRef.name is required")
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 0),
            cluster=str(cluster),
            role=str(spec.get("role", "")),
            address=str(spec.get("address") or ""),
            approved=bool(spec.get("approved", False)),
            hostname=spec.get("hostname") or None,
            spec=dict(spec),
            status=dict(obj.get("status") or {}),
        )
