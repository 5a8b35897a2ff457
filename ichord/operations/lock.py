"""The cluster lock: one Lease per cluster (``ichor-lock-<cluster>``) held by the running operation.

Holder = the operation's UID, 5 minutes, renewed every step, released at the end. It is taken only
through ``acquire_disruptive_lock``, which refuses, with a reason the operation shows:
- LockHeld: another operation holds an unexpired lock;
- ClusterCARotating: a CA rotation is under way and this is not it (docs/decisions.md#rotation-state: the stage is the
only
  record of which CA the nodes accept; nothing else may disturb them meanwhile);
- ClusterTransitioning: an even number of approved control planes (etcd would lose quorum while
  one member is down; docs/decisions.md#ca-rotation-passes relies on this for the etcd roll).
Expiry is judged from the Lease's own renewTime + duration (the lock outlives processes, so a
process-local clock cannot judge it); a stale lock of a dead operation is taken over.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from ichord.api.names import CLUSTER_LOCK_PREFIX, LockRefusal
from ichord.kube.client import KubeClient
from ichord.kube.errors import AlreadyExists, Conflict, NotFound
from ichord.kube.leases import LeaseRecord, create_lease, get_lease, update_lease

Clock = Callable[[], dt.datetime]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def lock_name(cluster: str) -> str:
    return f"{CLUSTER_LOCK_PREFIX}{cluster}"


@dataclass(frozen=True)
class LockDecision:
    acquired: bool
    reason: str = ""
    message: str = ""


def _expired(record: LeaseRecord, now: dt.datetime) -> bool:
    if record.holder is None:
        return True
    renewed = record.renew_time or record.acquire_time
    return renewed is None or renewed + dt.timedelta(seconds=record.duration_seconds) <= now


async def acquire_disruptive_lock(
    kube: KubeClient,
    namespace: str,
    cluster: str,
    operation_uid: str,
    *,
    approved_control_planes: int,
    rotating_operation_uid: str | None,
    duration: float,
    now: Clock = _utcnow,
) -> LockDecision:
    """Take (or renew) the cluster lock for ``operation_uid``, or say why not."""
    if rotating_operation_uid is not None and rotating_operation_uid != operation_uid:
        return LockDecision(False, LockRefusal.CLUSTER_CA_ROTATING,
                            f"a CA rotation (operation {rotating_operation_uid}) is under way on cluster {cluster}; "
                            "this operation waits until it completes")
    if approved_control_planes % 2 == 0:
        return LockDecision(False, LockRefusal.CLUSTER_TRANSITIONING,
                            f"cluster {cluster} has {approved_control_planes} approved control planes; etcd keeps "
                            "its quorum through a member's restart only with an odd number: approve or remove one")
    name = lock_name(cluster)
    seconds = max(1, round(duration))
    t = now()
    current = await get_lease(kube, namespace, name)
    if current is None:
        try:
            await create_lease(kube, namespace, name, LeaseRecord(operation_uid, seconds, t, t))
        except AlreadyExists:
            return LockDecision(False, LockRefusal.HELD, f"the cluster lock {name} was just taken by another operation")
        return LockDecision(True)
    if current.holder not in (None, operation_uid) and not _expired(current, t):
        return LockDecision(False, LockRefusal.HELD,
                            f"operation {current.holder} holds the cluster lock {name}; this one waits for it")
    taking_over = current.holder != operation_uid
    record = current.with_(
        holder=operation_uid,
        duration_seconds=seconds,
        renew_time=t,
        acquire_time=t if taking_over else current.acquire_time,
        transitions=current.transitions + (1 if taking_over else 0),
    )
    try:
        await update_lease(kube, namespace, name, record)
    except (Conflict, NotFound):
        return LockDecision(False, LockRefusal.HELD, f"the cluster lock {name} changed while it was taken; retrying")
    return LockDecision(True)


async def release_lock(kube: KubeClient, namespace: str, cluster: str, operation_uid: str) -> bool:
    """Release only while ``operation_uid`` still holds it (an update that fails if the Lease changed)."""
    name = lock_name(cluster)
    current = await get_lease(kube, namespace, name)
    if current is None or current.holder != operation_uid:
        return False
    try:
        await update_lease(kube, namespace, name, current.with_(holder=None, renew_time=None, acquire_time=None))
    except (Conflict, NotFound):
        return False
    return True


async def lock_holder(kube: KubeClient, namespace: str, cluster: str, *, now: Clock = _utcnow) -> str | None:
    """The operation holding an unexpired lock, if any."""
    current = await get_lease(kube, namespace, lock_name(cluster))
    if current is None or _expired(current, now()):
        return None
    return current.holder
