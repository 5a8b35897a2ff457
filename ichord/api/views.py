"""Typed views of the three custom resources: one definition of each question asked of them.

The daemon reads TalosCluster, TalosMachine and TalosOperation objects as the API returns them (dicts);
these views answer what every part of ichord asks of them (which cluster, which kind, is it under way,
is it paused, is it being deleted) in one place, so the actor, the trust sync, the credentials command
and every operation agree. A view is read-only and cheap: it keeps the object it was made from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from ichord.api import names
from ichord.api.conditions import find
from ichord.api.operation_kinds import DONE_STAGE, KindDescription, describe
from ichord.errors import IchordError

Obj = dict[str, Any]


class MachineSpecError(IchordError):
    pass


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _spec(obj: Obj) -> Obj:
    return obj.get("spec") or {}


def cluster_ref(obj: Obj) -> str | None:
    """``spec.clusterRef.name`` of a TalosMachine or TalosOperation (None when unset)."""
    name = (_spec(obj).get("clusterRef") or {}).get("name")
    return str(name) if name else None


@dataclass(frozen=True)
class _ObjectView:
    """The identity every view carries, and the object it was made from."""

    namespace: str
    name: str
    uid: str
    generation: int
    obj: Obj = field(repr=False)

    @classmethod
    def of(cls: type[_V], obj: Obj) -> _V:
        meta = _meta(obj)
        return cls(str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""),
                   int(meta.get("generation") or 0), obj)

    @property
    def spec(self) -> Obj:
        return _spec(self.obj)

    @property
    def status(self) -> Obj:
        return self.obj.get("status") or {}

    @property
    def deleting(self) -> bool:
        return bool(_meta(self.obj).get("deletionTimestamp"))

    @property
    def finalizers(self) -> list[str]:
        return list(_meta(self.obj).get("finalizers") or [])

    @property
    def resource_version(self) -> str:
        return str(_meta(self.obj).get("resourceVersion") or "")


_V = TypeVar("_V", bound=_ObjectView)


@dataclass(frozen=True)
class ClusterView(_ObjectView):

    @property
    def key(self) -> str:
        """``namespace/name``: how a cluster is named in logs and metrics everywhere."""
        return f"{self.namespace}/{self.name}"

    @property
    def cluster_name(self) -> str:
        """The Talos cluster name the configuration carries (spec.clusterName, default metadata.name)."""
        return str(self.spec.get("clusterName") or self.name)

    @property
    def secret_name(self) -> str:
        """``spec.secretsRef.name``: the bundle Secret ('' when unset)."""
        return str((self.spec.get("secretsRef") or {}).get("name") or "")

    @property
    def secret_namespace(self) -> str:
        """Where the bundle Secret is: ``spec.secretsRef.namespace``, else the TalosCluster's own namespace."""
        return str((self.spec.get("secretsRef") or {}).get("namespace") or self.namespace)

    def secret_refusal(self, allowed: frozenset[str]) -> str | None:
        """Why ichord refuses to read this cluster's bundle Secret, or None (cert-manager's Issuer rule).

        A TalosCluster reads a Secret of its own namespace; another namespace only where the administrator
        allows it (``--allow-secret-namespace``), or anyone who may create a TalosCluster anywhere could make
        ichord read, and rotate with, another cluster's CA keys.
        """
        ns = self.secret_namespace
        if ns == self.namespace or ns in allowed:
            return None
        return (f"spec.secretsRef names Secret {ns}/{self.secret_name}, outside the TalosCluster's namespace "
                f"{self.namespace}; ichord reads a bundle from another namespace only where the administrator "
                f"allows it (--allow-secret-namespace {ns}, chart value controller.allowedSecretNamespaces). Nothing "
                f"was read")

    @property
    def cni_preset(self) -> str:
        return str((self.spec.get("cni") or {}).get("preset") or "flannel")


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
    spec: Obj = field(repr=False)
    status: Obj = field(repr=False)
    #: The object's metadata as read (finalizers, deletionTimestamp, resourceVersion).
    metadata: Obj = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def deleting(self) -> bool:
        return bool(self.metadata.get("deletionTimestamp"))

    @property
    def finalizers(self) -> list[str]:
        return list(self.metadata.get("finalizers") or [])

    @property
    def is_control_plane(self) -> bool:
        return self.role == "controlplane"

    @classmethod
    def of(cls, obj: Obj) -> MachineView:
        meta = _meta(obj)
        spec = _spec(obj)
        cluster = cluster_ref(obj)
        if not cluster:
            raise MachineSpecError("spec.clusterRef.name is required")
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 0),
            cluster=cluster,
            role=str(spec.get("role", "")),
            address=str(spec.get("address") or ""),
            approved=bool(spec.get("approved", False)),
            hostname=spec.get("hostname") or None,
            spec=dict(spec),
            status=dict(obj.get("status") or {}),
            metadata=meta,
        )


FINISHED_PHASES = frozenset({names.Phase.COMPLETED, names.Phase.FAILED})


@dataclass(frozen=True)
class OperationView(_ObjectView):

    @property
    def kind(self) -> str:
        """``spec.kind`` (ca-rotation, config, ...)."""
        return str(self.spec.get("kind") or "")

    @property
    def cluster(self) -> str | None:
        return cluster_ref(self.obj)

    @property
    def description(self) -> KindDescription | None:
        """What ichord knows of this operation's kind (api/operation_kinds.py); None for a kind it does not know."""
        return describe(self.kind)

    @property
    def condition_type(self) -> str:
        """The condition this kind reports its progress in (Succeeded for a kind ichord does not know)."""
        d = self.description
        return d.condition_type if d is not None else names.SUCCEEDED

    @property
    def phase(self) -> str:
        return str(self.status.get("phase") or "")

    @property
    def paused(self) -> bool:
        return bool(self.spec.get("paused"))

    @property
    def stage(self) -> str:
        """The stage under way ('' before the start), where the kind keeps it (status.<section>.stage)."""
        d = self.description
        return d.stage_in(self.status) if d is not None else str(self.status.get("stage") or "")

    @property
    def step(self) -> str:
        d = self.description
        return (d.step_in(self.status) if d is not None else "") or str(self.status.get("step") or "")

    @property
    def finished(self) -> bool:
        """Completed or Failed: nothing more runs (the finalizer may still have to go)."""
        return self.phase in FINISHED_PHASES

    @property
    def unfinished(self) -> bool:
        return not self.finished

    @property
    def under_way(self) -> bool:
        """Started and not completed: a stage is set, the phase is not Completed and the stage is not Done.

        A Failed operation with a stage set still counts: it failed mid-way, so its nodes may run a mixed
        state (for a ca-rotation the new CA may be serving); only Completed (or Done) lets go.
        """
        return bool(self.stage) and self.phase != names.Phase.COMPLETED and self.stage != DONE_STAGE

    @property
    def holds_machines(self) -> bool:
        """Under way, of a kind that holds the machine reconciler off the cluster's nodes
        (docs/decisions.md#rotation-state: for a ca-rotation the stage is the only record of which CAs nodes accept)."""
        d = self.description
        return d is not None and d.holds_machines and self.under_way

    @property
    def excludes_others(self) -> bool:
        """Under way, of a kind beside which no other disruptive operation of the cluster may start."""
        d = self.description
        return d is not None and d.excludes_others and self.under_way

    @property
    def created(self) -> str:
        return str(_meta(self.obj).get("creationTimestamp") or "")


    def condition(self, ctype: str | None = None) -> Obj | None:
        return find(self.status.get("conditions"), ctype or self.condition_type)

    def of_cluster(self, namespace: str, cluster: str) -> bool:
        return self.namespace == namespace and self.cluster == cluster


def operations_of(objs: list[Obj], namespace: str, cluster: str) -> list[OperationView]:
    """The cluster's operations, oldest first (creation time, then name)."""
    views = [OperationView.of(o) for o in objs]
    return sorted((v for v in views if v.of_cluster(namespace, cluster)), key=lambda v: (v.created, v.name))
