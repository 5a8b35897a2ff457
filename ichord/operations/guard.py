"""Guarded deletes: a TalosCluster, and the TalosMachines an operation covers, do not disappear under it.

While an operation of a cluster runs (started: it holds its own finalizer, or a stage is set, and it is not
finished) the TalosCluster and every TalosMachine the operation covers carry the finalizer
``ichor.maesh.dev/operation-in-progress``. A ``kubectl delete`` of one of them then only sets its
deletionTimestamp: the object says so (condition DeletionHeld=True, reason OperationInProgress, naming the
operation and what ends the hold, with one DeletionHeld Warning Event), the operation runs on, and when it ends
(completed, failed, or deleted and abandoned) the finalizer goes and the delete completes.

    operation starting         -> ``hold_for_start``: the finalizer on the cluster, then on its covered machines,
                                  BEFORE the operation's own finalizer and anything irreversible; a cluster or a
                                  covered machine already being deleted refuses the start (nothing is written)
    every step of the cluster  -> ``reconcile``: held objects that are being deleted say so (once); an object a
                                  running operation covers that lost its finalizer gets it back (an operation
                                  started by an older ichord, or a hand edit); objects no operation covers are let
                                  go, machines first, the cluster last
    the cluster gone           -> ``release_machines``: its machines are let go

Every write is a metadata patch carrying the resourceVersion it decided on (a conflict re-reads and decides
again), so each is idempotent and safe to repeat after a kill; failpoints ``guard.hold.after`` (the cluster held,
the operation's own finalizer not yet written), ``guard.release.before`` and ``guard.release.after`` (around
the cluster's let-go) prove it. Kubernetes refuses a new finalizer on an object being deleted, which is why
the hold comes first and a start on a deleting cluster is refused.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import structlog

from ichord.api import names
from ichord.api.conditions import Condition, find, set_condition
from ichord.api.names import DeletionHeldReason, EventReason
from ichord.api.views import ClusterView, MachineView, OperationView
from ichord.errors import IchordError
from ichord.failpoints import failpoint
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import Conflict, KubeError, NotFound
from ichord.kube.events import EventRecorder, ObjectRef
from ichord.kube.status import update_status
from ichord.operations.backbone import OperationKind
from ichord.pki.scrub import SCRUBBER

log = structlog.get_logger("ichord.operations.guard")

Obj = dict[str, Any]
FINALIZER = names.OPERATION_GUARD_FINALIZER
#: Attempts of a finalizer patch against a moving object (each conflict re-reads it).
_ATTEMPTS = 5


def holds(op: OperationView, kind: OperationKind | None) -> bool:
    """The operation runs: started (its finalizer, or a stage while not being deleted) and not finished.

    A deleted operation whose finalizer is gone is about to vanish (abandoned): it holds nothing any more.
    """
    if kind is None or op.finished:
        return False
    return kind.finalizer in op.finalizers or (bool(op.stage) and not op.deleting)


@dataclass(frozen=True)
class Holder:
    """A running operation and what ends its hold, in words."""

    op: OperationView
    abandonable: bool

    def what_ends_it(self) -> str:
        ref = f"TalosOperation {self.op.namespace}/{self.op.name}"
        where = f" in {self.op.stage}" if self.op.stage else ""
        if self.abandonable:
            return (f"{ref} ({self.op.kind}{where}) is in progress; the delete completes when it completes, or "
                    f"when it is abandoned while still abandonable: `kubectl -n {self.op.namespace} delete "
                    f"talosoperation {self.op.name}`")
        return (f"{ref} ({self.op.kind}{where}) is in progress and past its point of no return (it cannot be "
                f"abandoned now); the delete completes when it completes")


def holders(operations: Iterable[OperationView], kind_of: Callable[[str], OperationKind | None]) -> list[Holder]:
    out = []
    for op in operations:
        kind = kind_of(op.kind)
        if kind is not None and holds(op, kind):
            out.append(Holder(op, kind.abandonable(op)))
    return out


def held_message(what: str, running: list[Holder]) -> str:
    return SCRUBBER.text(f"deletion of {what} held by the finalizer {FINALIZER}: "
                         + "; ".join(h.what_ends_it() for h in running))


# ---- the finalizer writes ---------------------------------------------------------------------------


class HoldRefused(IchordError):
    """The object is being deleted: Kubernetes accepts no new finalizer, and the operation must not start."""


async def _add(objects: crds.CustomObjects, namespace: str, name: str, current: Obj | None) -> Obj | None:
    """The finalizer on the object (None: it does not exist); HoldRefused when it is being deleted without it."""
    obj = current
    for _ in range(_ATTEMPTS):
        if obj is None:
            try:
                obj = await objects.get(namespace, name)
            except NotFound:
                return None
        meta = obj.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER in finalizers:
            return obj
        if meta.get("deletionTimestamp"):
            raise HoldRefused(f"{objects.kind.kind} {namespace}/{name} is being deleted")
        try:
            return await objects.patch(namespace, name, {"metadata": {
                "resourceVersion": meta.get("resourceVersion"), "finalizers": [*finalizers, FINALIZER]}})
        except Conflict:
            obj = None  # changed since read (maybe deleted meanwhile): read again and decide again
        except NotFound:
            return None
    raise KubeError(f"{objects.kind.kind} {namespace}/{name} kept changing while its finalizer was added")


async def _remove(objects: crds.CustomObjects, namespace: str, name: str, current: Obj | None) -> None:
    obj = current
    for _ in range(_ATTEMPTS):
        if obj is None:
            try:
                obj = await objects.get(namespace, name)
            except NotFound:
                return
        meta = obj.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER not in finalizers:
            return
        rest = [f for f in finalizers if f != FINALIZER]
        try:
            await objects.patch(namespace, name, {"metadata": {
                "resourceVersion": meta.get("resourceVersion"), "finalizers": rest or None}})
            return
        except Conflict:
            obj = None
        except NotFound:
            return
    raise KubeError(f"{objects.kind.kind} {namespace}/{name} kept changing while its finalizer was removed")


# ---- before a start ---------------------------------------------------------------------------------


#: Machines held at once when an operation starts.
HOLDS_AT_ONCE = 16


async def hold_for_start(kube: KubeClient, cluster: Obj, machines: Iterable[MachineView]) -> str | None:
    """Hold the cluster, then the machines the starting operation covers; why it may not start, or None.

    Called by every kind's start before its own finalizer: from here on a delete of any of them waits."""
    view = ClusterView.of(cluster)
    try:
        await _add(crds.clusters(kube), view.namespace, view.name, cluster)
    except HoldRefused:
        return (f"TalosCluster {view.key} is being deleted: no operation starts on it (nothing was written). Delete "
                f"this operation, or recreate the cluster once it is gone")
    failpoint("guard.hold.after")
    # Several at once (each its own object): a hundred machines held one after the other delayed a rollout's start
    # by a hundred round trips (docs/scaling.md). The first failure in the machines' order is the answer, as if
    # they had been held in turn; a hold made beside a refused one is let go by reconcile like any other.
    limiter = anyio.CapacityLimiter(HOLDS_AT_ONCE)
    failed: list[tuple[int, MachineView, Exception]] = []

    async def hold(i: int, m: MachineView) -> None:
        async with limiter:
            try:  # the machines as the step listed them (uncached): their resourceVersion saves a GET each
                await _add(crds.machines(kube), m.namespace, m.name, {"metadata": m.metadata} if m.metadata else None)
            except Exception as exc:
                failed.append((i, m, exc))

    async with anyio.create_task_group() as tg:
        for i, m in enumerate(machines):
            tg.start_soon(hold, i, m)
    if not failed:
        return None
    _, m, exc = min(failed, key=lambda f: f[0])
    if isinstance(exc, HoldRefused):
        return (f"TalosMachine {m.namespace}/{m.name} is being deleted: the operation starts once it is gone "
                f"(nothing was written)")
    raise exc


# ---- every step -------------------------------------------------------------------------------------


@dataclass
class GuardScope:
    """What ``reconcile`` reads: the step's cluster, machines and operations (no request of its own)."""

    kube: KubeClient
    recorder: EventRecorder
    cluster: ClusterView
    machines: list[MachineView]
    operations: list[OperationView]
    kind_of: Callable[[str], OperationKind | None]
    covers: Callable[[OperationView, list[MachineView]], set[str]]
    now: Callable[[], dt.datetime]


async def reconcile(scope: GuardScope) -> None:
    """Say why a deleted object is held; heal a missing hold; let go of what no running operation covers."""
    running = holders(scope.operations, scope.kind_of)
    covered: dict[str, list[Holder]] = {}
    for h in running:
        for name in scope.covers(h.op, scope.machines):
            covered.setdefault(name, []).append(h)
    for m in scope.machines:
        await _machine(scope, m, covered.get(m.name, []))
    await _cluster(scope, running)


async def _machine(scope: GuardScope, m: MachineView, running: list[Holder]) -> None:
    objects = crds.machines(scope.kube)
    if not running:
        if FINALIZER in m.finalizers:  # the informer's copy: a stale one costs a 409 and a fresh read
            await _remove(objects, m.namespace, m.name, {"metadata": m.metadata})
            log.info("machine let go", machine=f"{m.namespace}/{m.name}", deleting=m.deleting)
        return
    if FINALIZER not in m.finalizers:
        if not m.deleting:
            with contextlib.suppress(HoldRefused):  # deleted meanwhile: the next step says it is held, or not
                await _add(objects, m.namespace, m.name, None)
        return
    if m.deleting:
        message = held_message(f"TalosMachine {m.namespace}/{m.name}", running)
        await _say_held(scope, objects, m.namespace, m.name, m.status,
                        ObjectRef(names.TALOS_MACHINE, m.namespace, m.name, m.uid, names.API_VERSION), message)


async def _cluster(scope: GuardScope, running: list[Holder]) -> None:
    cluster = scope.cluster
    objects = crds.clusters(scope.kube)
    if not running:
        if FINALIZER in cluster.finalizers:
            failpoint("guard.release.before")
            await _remove(objects, cluster.namespace, cluster.name, cluster.obj)
            failpoint("guard.release.after")
            log.info("cluster let go", cluster=cluster.key, deleting=cluster.deleting)
        return
    if FINALIZER not in cluster.finalizers:
        if not cluster.deleting:
            with contextlib.suppress(HoldRefused):
                await _add(objects, cluster.namespace, cluster.name, cluster.obj)
        return
    if cluster.deleting:
        message = held_message(f"TalosCluster {cluster.key}", running)
        ref = ObjectRef(names.TALOS_CLUSTER, cluster.namespace, cluster.name, cluster.uid, names.API_VERSION)
        await _say_held(scope, objects, cluster.namespace, cluster.name, cluster.status, ref, message)


async def _say_held(scope: GuardScope, objects: crds.CustomObjects, namespace: str, name: str, status: Obj,
                    ref: ObjectRef, message: str) -> None:
    """DeletionHeld=True naming the operation (rewritten when the message changes); one Warning, when first held."""
    current = find(status.get("conditions"), names.DELETION_HELD)
    if current is not None and (current.get("status"), current.get("message")) == ("True", message):
        return
    cond = Condition(names.DELETION_HELD, "True", DeletionHeldReason.OPERATION_IN_PROGRESS, message)
    now = scope.now()

    def mutate(st: Obj, _obj: Obj) -> Obj:
        st["conditions"] = set_condition(st.get("conditions"), cond, now=now)
        return st

    try:
        await update_status(objects, namespace, name, mutate)
    except NotFound:
        return
    if current is None or current.get("status") != "True":
        scope.recorder.record(ref, "Warning", EventReason.DELETION_HELD, message)
        log.warning("deletion held", object=f"{ref.kind} {namespace}/{name}")


async def release_machines(kube: KubeClient, machines: Iterable[MachineView]) -> None:
    """The cluster is gone: no operation of it runs, so none of its machines stays held."""
    for m in machines:
        if FINALIZER in m.finalizers:
            await _remove(crds.machines(kube), m.namespace, m.name, {"metadata": m.metadata})
