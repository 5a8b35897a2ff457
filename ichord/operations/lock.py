"""The cluster lock: one Lease per cluster (``ichord-lock-<cluster>``) held by the running operation.

Holder = the operation's UID, 5 minutes, renewed every step, released at the end. It is taken only
through ``acquire_disruptive_lock``, which refuses, with a reason the operation shows:
- LockHeld: another operation holds an unexpired lock;
- ClusterCARotating: a CA rotation is under way and this is not it (docs/decisions.md#rotation-state: the stage is the
  only record of which CA the nodes accept; nothing else may disturb them meanwhile);
- ClusterOperationExclusive: another operation whose kind excludes others (``KindDescription.excludes_others``) and
  rotates no CA is under way; the message names it by its kind's title;
- ClusterTransitioning: an even number of approved control planes (etcd would lose quorum while
  one member is down; docs/decisions.md#ca-rotation-passes relies on this for the etcd roll).
Expiry is judged from the Lease's own renewTime + duration (the lock outlives processes, so a
process-local clock cannot judge it); a stale lock of a dead operation is taken over.

Renewal as last written (``LockMemo``, kept by the cluster's actor across steps): the holder renews the Lease as
this process last wrote it, one PUT and no GET, with that write's resourceVersion, so the PUT succeeds only if
nobody changed the Lease since (it is then still this operation's); a 409 or a 404 reads the Lease and decides as
every first attempt does (the leader Lease's fast path, leader.py, client-go's). A config rollout renews it on every
step: on a real API server the GET was one more round trip in each (docs/scaling.md).

Upgrades: versions before the ``ichord`` name held ``ichor-lock-<cluster>``. When the new Lease does not exist
yet (the first lock of the cluster since the upgrade, one extra GET per cluster ever) the old one is read: held
unexpired by another operation, it refuses exactly as the new one would; held by this same operation (a rotation
resumed across the upgrade), the new Lease is created and the old one released (best effort: the chart may grant
only ``get`` on it, and it then expires within its 5 minutes). Holders are named by namespace/name where the caller
knows the operation (``name_of``), by UID otherwise.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from ichord.api.names import CLUSTER_LOCK_PREFIX, LEGACY_CLUSTER_LOCK_PREFIX, LockRefusal
from ichord.api.operation_kinds import KindDescription
from ichord.kube.client import KubeClient
from ichord.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from ichord.kube.leases import LeaseRecord, create_lease, get_lease, update_lease

Clock = Callable[[], dt.datetime]
log = structlog.get_logger("ichord.operations.lock")


def _uid(uid: str) -> str:
    return uid


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def lock_name(cluster: str) -> str:
    return f"{CLUSTER_LOCK_PREFIX}{cluster}"


def legacy_lock_name(cluster: str) -> str:
    return f"{LEGACY_CLUSTER_LOCK_PREFIX}{cluster}"


@dataclass(frozen=True)
class LockDecision:
    acquired: bool
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Exclusion:
    """Another operation of the cluster under way whose kind excludes others: the lock is not taken beside it."""

    uid: str
    #: How the refusal names it (namespace/name).
    name: str
    #: Its kind's description; None only when it could not be read again (the refusal then names no kind).
    kind: KindDescription | None

    def refusal(self, cluster: str) -> tuple[str, str]:
        """The reason and message: its kind's title in the message; ClusterCARotating when its kind rotates the
        cluster's CAs (the reason users, the runbook and alerts know), ClusterOperationExclusive for any other."""
        title = self.kind.title if self.kind is not None else "an operation that excludes others"
        reason = (LockRefusal.CLUSTER_CA_ROTATING if self.kind is not None and self.kind.rotates_cas
                  else LockRefusal.CLUSTER_OPERATION_EXCLUSIVE)
        return reason, (f"{title} (operation {self.name}) is under way on cluster {cluster}; this operation waits "
                        "until it completes")


@dataclass
class LockMemo:
    """The cluster lock as this process last wrote it: its namespace, name and the record the server returned."""

    written: tuple[str, str, LeaseRecord] | None = None

    def remember(self, namespace: str, name: str, record: LeaseRecord) -> None:
        self.written = (namespace, name, record)

    def held(self, namespace: str, name: str, operation_uid: str) -> LeaseRecord | None:
        """The record to renew, when this process last wrote the Lease held by ``operation_uid``."""
        if self.written is None or self.written[:2] != (namespace, name) or self.written[2].holder != operation_uid:
            return None
        return self.written[2]


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
    excluding: Exclusion | None,
    duration: float,
    now: Clock = _utcnow,
    name_of: Callable[[str], str] = _uid,
    memo: LockMemo | None = None,
) -> LockDecision:
    """Take (or renew) the cluster lock for ``operation_uid``, or say why not (``excluding``: another operation of
    the cluster under way whose kind excludes others; ``name_of``: an operation's UID -> how the message names it,
    namespace/name; ``memo``: the lock as this process last wrote it, renewed with one PUT when it still is)."""
    if excluding is not None and excluding.uid != operation_uid:
        return LockDecision(False, *excluding.refusal(cluster))
    if approved_control_planes % 2 == 0:
        return LockDecision(False, LockRefusal.CLUSTER_TRANSITIONING,
                            f"cluster {cluster} has {approved_control_planes} approved control planes; etcd keeps "
                            "its quorum through a member's restart only with an odd number: approve or remove one")
    name = lock_name(cluster)
    seconds = max(1, round(duration))
    t = now()
    memo = memo or LockMemo()
    last = memo.held(namespace, name, operation_uid)
    if last is not None:
        try:
            memo.remember(namespace, name, await update_lease(kube, namespace, name, last.with_(
                renew_time=t, duration_seconds=seconds)))
            return LockDecision(True)
        except (Conflict, NotFound):
            memo.written = None  # changed since this process wrote it: read it and decide
    current = await get_lease(kube, namespace, name)
    if current is None:
        legacy = await get_lease(kube, namespace, legacy_lock_name(cluster))
        if legacy is not None and legacy.holder not in (None, operation_uid) and not _expired(legacy, t):
            return LockDecision(False, LockRefusal.HELD,
                                f"operation {name_of(legacy.holder or '')} holds the cluster lock "
                                f"{legacy_lock_name(cluster)} (taken by an earlier version of ichord); this one waits "
                                "for it")
        try:
            memo.remember(namespace, name, await create_lease(kube, namespace, name,
                                                              LeaseRecord(operation_uid, seconds, t, t)))
        except AlreadyExists:
            return LockDecision(False, LockRefusal.HELD, f"the cluster lock {name} was just taken by another operation")
        if legacy is not None and legacy.holder == operation_uid:
            await _release_legacy(kube, namespace, cluster, operation_uid)
        return LockDecision(True)
    if current.holder not in (None, operation_uid) and not _expired(current, t):
        return LockDecision(False, LockRefusal.HELD,
                            f"operation {name_of(current.holder or '')} holds the cluster lock {name}; this one waits "
                            "for it")
    taking_over = current.holder != operation_uid
    record = current.with_(
        holder=operation_uid,
        duration_seconds=seconds,
        renew_time=t,
        acquire_time=t if taking_over else current.acquire_time,
        transitions=current.transitions + (1 if taking_over else 0),
    )
    try:
        memo.remember(namespace, name, await update_lease(kube, namespace, name, record))
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


async def _release_legacy(kube: KubeClient, namespace: str, cluster: str, operation_uid: str) -> None:
    """The old-named lock this operation held before the upgrade: released, or left to expire if that is refused."""
    name = legacy_lock_name(cluster)
    try:
        current = await get_lease(kube, namespace, name)
        if current is not None and current.holder == operation_uid:
            await update_lease(kube, namespace, name, current.with_(holder=None, renew_time=None, acquire_time=None))
    except KubeError as exc:
        log.info("the old-named cluster lock was not released; it expires on its own", lease=f"{namespace}/{name}",
                 error=str(exc))


async def lock_holder(kube: KubeClient, namespace: str, cluster: str, *, now: Clock = _utcnow) -> str | None:
    """The operation holding an unexpired lock, if any."""
    current = await get_lease(kube, namespace, lock_name(cluster))
    if current is None or _expired(current, now()):
        return None
    return current.holder
