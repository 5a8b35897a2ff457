"""``ClusterScope``: what one step of a cluster's actor works with, read once (cluster-api's scope).

The cluster and its machines come from the informers (they only route work and decide nothing
irreversible); so do the cluster's operations, read through this process's own writes (a copy older than
ichord's own last write, one that showed no rotation, would let the machine reconciler revert a rotation's
stage), and an operation about to start is read fresh (``reread``; docs/architecture.md#read-your-writes); the
bundle Secret is read (uncached) at most once per step, on first use, through the BundleSource. Operations update
the scope's copy of an operation whenever they write it, so the phases after them in the same step see the new
stage.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from ichord.api.views import ClusterView, MachineView, OperationView
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import NotFound
from ichord.kube.events import EventRecorder
from ichord.operations import op_status
from ichord.operations.bundle_source import BundleRead, BundleSourceError, read_cluster_bundle
from ichord.operations.etcd_snapshot import DirectorySnapshots, SnapshotPort
from ichord.operations.lock import LockMemo
from ichord.operations.managed.clients import NodeWatcher
from ichord.pki.scrub import SCRUBBER
from ichord.settings import Timing

T = TypeVar("T")

log = structlog.get_logger("ichord.operations")

Obj = dict[str, Any]
Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _no_trust_hook(_new_ca_pem: bytes, _current_ca_pem: bytes) -> None:
    """Without a trust pool (tests driving operations in-process) nothing is trusted ahead of a switch."""


@dataclass(frozen=True)
class TrustHooks:
    """The trust pool's part in an operation, handed in by whoever composes the process (never a global)."""

    #: Called with the new and the current Kubernetes CA certificates on every step that reads rotation.yaml.
    trust: Callable[[bytes, bytes], None] = _no_trust_hook
    #: Why a rotation of this Kubernetes CA must not start (ichord would lock itself out), or None.
    refusal: Callable[[bytes], str | None] = lambda _current_ca_pem: None
    #: Whether this Kubernetes CA is the one of the API server ichord talks to (a self-managed cluster, ``ichord
    #: sim``): then the operator's own kubeconfig needs the minted one after a rotation, and the hints say so.
    own_cluster: Callable[[bytes], bool] = lambda _ca_pem: False


@dataclass
class ClusterScope:
    kube: KubeClient  # the management API
    controller_namespace: str  # where the leader Lease lives (bundle Secrets and locks: the cluster's namespace)
    namespace: str
    name: str
    cluster: ClusterView | None
    machines: list[MachineView]  # every machine naming the cluster, approved or not, by name
    operations: list[OperationView]  # the cluster's operations, oldest first (Runtime.operations_of)
    recorder: EventRecorder
    timing: Timing
    trust: TrustHooks = field(default_factory=TrustHooks)
    #: Namespaces other than the cluster's own that a secretsRef may name (--allow-secret-namespace).
    allowed_secret_namespaces: frozenset[str] = frozenset()
    now: Clock = utcnow
    #: Starts a watch of the managed cluster's Nodes through a client, waking this cluster's actor when one is back
    #: from its reboot (watchers/managed_nodes.py; None: no watch, the step's requeue alone).
    watch_nodes: NodeWatcher | None = None
    #: The cluster lock as this process last wrote it, kept by the cluster's actor across steps (operations/lock.py:
    #: a holder renews it with one PUT).
    lock_memo: LockMemo | None = None
    #: Where an operation's etcd snapshot goes (operations/etcd_snapshot.py): the daemon's directory; a rehearsal's
    #: twin hands in one that writes nothing.
    etcd_snapshots: SnapshotPort = field(default_factory=DirectorySnapshots)
    #: The TalosMachine (namespace, name) created first that names the same node as a machine (or, in its cluster,
    #: the same hostname), or None: a machine another holds is in no operation's inputs (actors/one_owner.py,
    #: docs/decisions.md#one-owner).
    address_holder: Callable[[MachineView], tuple[str, str] | None] = lambda _m: None
    _bundle: BundleRead | BundleSourceError | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        """``namespace/name``, the cluster's label in logs and metrics everywhere."""
        return f"{self.namespace}/{self.name}"

    @property
    def approved_machines(self) -> list[MachineView]:
        """Approved machines, control planes first, then workers, by name (the order every pass follows)."""
        return sorted((m for m in self.machines if m.approved), key=lambda m: (not m.is_control_plane, m.name))

    @property
    def machines_held_by(self) -> OperationView | None:
        """The operation under way that holds the machine reconciler off the cluster's nodes (its kind's
        description), if any."""
        return next((op for op in self.operations if op.holds_machines), None)

    async def transition(self, op: OperationView, change: op_status.Transition, *, from_copy: bool = True) -> bool:
        """Write ``change`` (operations/op_status.py) to one of the cluster's operations, on the scope's clock; True
        when the condition transitioned (its Event posted). Best effort: gone is False; an API error is logged and
        False (the next step tries again). ``from_copy``: decide on the scope's copy first (one 409 if it went stale)
        rather than on a GET."""
        result = await self._best_effort(op, op_status.transition(self.kube, self.recorder, self.now, op.obj, change,
                                                                  current=op.obj if from_copy else None))
        if result is None:
            return False
        written, moved = result
        self.observe(written)
        return moved

    async def _best_effort(self, op: OperationView, write: Awaitable[T]) -> T | None:
        """``write``'s result; None when the operation is gone or the API refused (logged: the next step tries
        again)."""
        try:
            return await write
        except NotFound:
            return None
        except IchordError as exc:
            log.warning("operation status write failed", cluster=self.key, operation=f"{op.namespace}/{op.name}",
                        error=SCRUBBER.exception(exc))
            return None

    async def reread(self, op: OperationView) -> OperationView | None:
        """``op`` read fresh from the API (one GET) and kept as the scope's copy; None when it is gone (or is now
        another object of the same name)."""
        try:
            obj = await crds.operations(self.kube).get(op.namespace, op.name)
        except NotFound:
            return None
        fresh = OperationView.of(obj)
        if fresh.uid != op.uid:
            return None
        self.observe(obj)
        return fresh

    def observe(self, obj: Obj) -> None:
        """An operation was written: keep the scope's copy current for the phases that follow in this step."""
        view = OperationView.of(obj)
        self.operations = [view if op.uid == view.uid else op for op in self.operations]

    async def bundle(self) -> BundleRead:
        """The cluster's bundle Secret, read once per step; a failure is raised again to every caller."""
        if self._bundle is None:
            try:
                if self.cluster is None:
                    raise BundleSourceError(BundleSourceError.INVALID, f"TalosCluster {self.key} does not exist")
                self._bundle = await read_cluster_bundle(self.kube, self.cluster, self.allowed_secret_namespaces)
            except BundleSourceError as exc:
                self._bundle = exc
        if isinstance(self._bundle, BundleSourceError):
            raise self._bundle
        return self._bundle
