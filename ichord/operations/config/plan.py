"""The ``config`` operation's plan: which machines wait, for what, in which order (docs/decisions.md#config-rollout).

Pure functions, table-tested (tests/unit/test_config_plan.py). The machine reconciler classifies each
machine's difference (``status.rebootPaths``, ``status.apiServerRestartPaths``, from render/fieldmeta) and
the plan only reads that report, so the two never disagree on what needs what:

    rebootPaths non-empty                 -> Reboot            (any role)
    apiServerRestartPaths, control plane  -> APIServerRestart  (no reboot, no drain)
    anything else                         -> not in the plan   (a worker's restart paths are applied as safe)

Order: control planes one at a time first, then workers, each tier by the order label then the name; the
machine whose Node is the one ichord runs on (NODE_NAME) goes last of all. The persisted plan is the order
run: the executor reads ``status.plan.machines``, never recomputes it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ichord.api import names
from ichord.api.max_unavailable import WorkerBound
from ichord.api.views import OperationView

#: Label on a TalosMachine: its place in its tier (lower first; unlabelled machines follow, by name).
ORDER_LABEL = f"{names.GROUP}/order"
#: Annotation on a TalosMachine: the rollout waits at this machine while it is present.
HOLD_ANNOTATION = f"{names.GROUP}/upgrade-hold"

Obj = dict[str, Any]


class Change(enum.StrEnum):
    REBOOT = "Reboot"
    API_SERVER_RESTART = "APIServerRestart"


@dataclass(frozen=True)
class Candidate:
    """What the plan reads of one approved machine (its TalosMachine object)."""

    name: str
    role: str
    reboot_paths: tuple[str, ...] = ()
    restart_paths: tuple[str, ...] = ()
    node_name: str = ""
    order: int | None = None

    @property
    def is_control_plane(self) -> bool:
        return self.role == "controlplane"

    @classmethod
    def of(cls, obj: Obj) -> Candidate:
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        raw = (meta.get("labels") or {}).get(ORDER_LABEL)
        try:
            order = int(raw) if raw is not None else None
        except ValueError:
            order = None  # a label that is not a number orders like no label
        return cls(name=str(meta.get("name", "")), role=str(spec.get("role", "")),
                   reboot_paths=tuple(str(p) for p in status.get("rebootPaths") or ()),
                   restart_paths=tuple(str(p) for p in status.get("apiServerRestartPaths") or ()),
                   node_name=str(spec.get("hostname") or status.get("nodeName") or ""), order=order)


@dataclass(frozen=True)
class PlannedMachine:
    name: str
    role: str
    order: int
    change: Change
    paths: tuple[str, ...]

    @property
    def reboots(self) -> bool:
        return self.change is Change.REBOOT

    @property
    def is_control_plane(self) -> bool:
        return self.role == "controlplane"

    def to_status(self) -> Obj:
        return {"name": self.name, "role": self.role, "order": self.order, "reboots": self.reboots,
                "change": self.change.value, "paths": list(self.paths)}

    @classmethod
    def from_status(cls, item: Mapping[str, Any]) -> PlannedMachine:
        change = Change(str(item.get("change") or (Change.REBOOT if item.get("reboots") else
                                                   Change.API_SERVER_RESTART)))
        return cls(str(item["name"]), str(item.get("role") or ""), int(item.get("order") or 0), change,
                   tuple(str(p) for p in item.get("paths") or ()))


def change_of(c: Candidate) -> Change | None:
    if c.reboot_paths:
        return Change.REBOOT
    if c.restart_paths and c.is_control_plane:
        return Change.API_SERVER_RESTART
    return None


def plan_machines(candidates: Sequence[Candidate], own_node: str | None = None) -> list[PlannedMachine]:
    """The machines that wait, in the order they will be changed (1-based ``order``)."""
    waiting = [(c, ch) for c in candidates if (ch := change_of(c)) is not None]

    def key(item: tuple[Candidate, Change]) -> tuple[bool, bool, bool, int, str]:
        c, _ = item
        own = bool(own_node) and c.node_name == own_node
        return (own, not c.is_control_plane, c.order is None, c.order or 0, c.name)

    ordered = sorted(waiting, key=key)
    return [PlannedMachine(c.name, c.role, i + 1, ch, c.reboot_paths if ch is Change.REBOOT else c.restart_paths)
            for i, (c, ch) in enumerate(ordered)]


def reboots_control_plane(planned: Sequence[PlannedMachine]) -> bool:
    """Does the rollout reboot a control plane (and so restart its etcd member)?"""
    return any(p.reboots and p.is_control_plane for p in planned)


def plan_status(planned: Sequence[PlannedMachine], control_planes: int, worker_bound: WorkerBound, *,
                etcd_snapshot: Obj | None = None,
                snapshot_hint: str = "take an etcd snapshot first (ichord cluster etcd-snapshot NAME -f FILE)") -> Obj:
    """``status.plan``: what `kubectl get -o yaml` shows for consent before anything runs; ``worker_bound`` is
    maxUnavailable as resolved now (each step resolves it again: a changed value applies to workers not begun).
    When a control plane reboots, ``etcd_snapshot`` (operations/etcd_snapshot.plan_entry) says where ichord takes a
    snapshot first; without a destination the warning is ``snapshot_hint``."""
    reboots = any(p.reboots for p in planned)
    touches_cp = any(p.is_control_plane for p in planned)
    warnings = []
    if reboots:
        warnings.append(f"machines in the plan reboot, one control plane at a time, then {worker_bound.describe()}, "
                        "each cordoned and drained first")
    else:
        warnings.append("restarts the Kubernetes API server on each control plane, one at a time; no reboot")
    snapshot = reboots_control_plane(planned) and etcd_snapshot is not None
    if reboots_control_plane(planned):
        warnings.append(snapshot_hint if etcd_snapshot is None else
                        f"an etcd snapshot is taken to {etcd_snapshot['directory']} before the first reboot "
                        f"(keeping the cluster's newest {etcd_snapshot['retain']}); etcdSnapshot.file names it")
    plan = {"machines": [p.to_status() for p in planned], "warnings": warnings,
            "stages": ["Rolling"], "kubernetesAPIUnavailable": control_planes == 1 and touches_cp,
            "workerBound": worker_bound.to_status()}
    if snapshot:
        plan["etcdSnapshot"] = etcd_snapshot
    return plan


def planned_from_status(status: Mapping[str, Any]) -> list[PlannedMachine]:
    items = (status.get("plan") or {}).get("machines") or []
    return sorted((PlannedMachine.from_status(i) for i in items), key=lambda p: p.order)


class Refusal(enum.StrEnum):
    NOTHING_TO_DO = "NothingToDo"
    CLUSTER_CA_ROTATING = "ClusterCARotating"
    OPERATION_UNFINISHED = "OperationUnfinished"
    INVALID_CONFIG = "InvalidConfig"  # a planned machine's render holds what Talos's decoder refuses


def refusal(planned: Sequence[PlannedMachine], operations: Sequence[OperationView],
            uid: str) -> tuple[Refusal, str] | None:
    """Why a ``config`` operation must not start (docs/decisions.md#config-rollout: refused, nothing written), or None.

    Any other unfinished operation of the cluster blocks it, a plan-only one included: it may start any moment."""
    for other in operations:
        if other.uid == uid or other.finished:
            continue
        if other.description is not None and other.description.rotates_cas:  # the cluster's CAs are rotating
            return (Refusal.CLUSTER_CA_ROTATING,
                    f"a CA rotation ({other.namespace}/{other.name}) of the cluster is unfinished; a config rollout "
                    "waits for no rotation: create it again once that one completed")
        return (Refusal.OPERATION_UNFINISHED,
                f"operation {other.namespace}/{other.name} (kind {other.kind}) of the cluster is unfinished; create "
                "this one again once it completed")
    if not planned:
        return (Refusal.NOTHING_TO_DO,
                "no machine waits for a reboot or an API server restart (no TalosMachine reports rebootPaths, "
                "nor a control plane apiServerRestartPaths); nothing to roll out")
    return None
