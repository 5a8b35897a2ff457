"""The handles a step of any operation kind works with: the management API, Events, timing, the step's clock, the
trust pool's hooks, the Talos client factory, where an etcd snapshot goes and the managed-cluster clients the kind
keeps across steps.

Built from the cluster actor's ``ClusterScope`` for every step (``context_of``); only the managed-cluster clients
are kept between steps (a connection, no state).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ichord.api.views import MachineView, OperationView
from ichord.kube.client import KubeClient
from ichord.kube.events import EventRecorder
from ichord.operations.etcd_snapshot import DirectorySnapshots, SnapshotPort
from ichord.operations.lock import LockMemo
from ichord.operations.managed.clients import ManagedClients
from ichord.operations.scope import ClusterScope
from ichord.settings import Timing
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

Obj = dict[str, Any]
Clock = Callable[[], dt.datetime]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _no_trust_hook(_new_ca_pem: bytes, _current_ca_pem: bytes) -> None:
    """The trust pool (a later issue) replaces this; the seam is called on every pass that reads rotation.yaml."""


def _talos_client(dial: DialBundle) -> TalosClient:
    return TalosClient(dial, dial_timeout=10.0, rpc_timeout=60.0)


@dataclass
class StepContext:
    kube: KubeClient  # the management API: operations, clusters, machines, the bundle Secret, the lock
    namespace: str  # the controller namespace (the bundle Secret and the lock live in the cluster's namespace)
    recorder: EventRecorder
    timing: Timing
    now: Clock = _utcnow
    #: Called with the new and the current Kubernetes CA certificates (public parts only) on every pass that
    #: reads rotation.yaml.
    trust_hook: Callable[[bytes, bytes], None] = _no_trust_hook
    talos_factory: Callable[[DialBundle], TalosClient] = field(default=_talos_client)
    #: Asked with the current Kubernetes CA before a rotation of it starts: why ichord cannot safely rotate it
    #: (its own client would be locked out at Issuing), or None. The trust pool fills it.
    trust_refusal: Callable[[bytes], str | None] = lambda _current_ca_pem: None
    #: Whether a Kubernetes CA is the one of the API server ichord talks to (TrustHooks.own_cluster).
    own_cluster: Callable[[bytes], bool] = lambda _ca_pem: False
    #: Told of every write of the operation (the step's scope keeps its copy current for the phases after it).
    observe: Callable[[Obj], None] = lambda _obj: None
    #: The cluster's operations as the step's scope listed them (None: list them, e.g. a test driving one step).
    operations: list[OperationView] | None = None
    #: Namespaces other than the cluster's own that its secretsRef may name (--allow-secret-namespace).
    allowed_secret_namespaces: frozenset[str] = frozenset()
    #: The managed-cluster clients the operation kind keeps across steps, by cluster key; None: every read asks a
    #: control plane for a fresh admin kubeconfig.
    managed: ManagedClients | None = None
    #: The cluster lock as this process last wrote it (operations/lock.py LockMemo; None: read before each renewal).
    lock_memo: LockMemo | None = None
    #: Where an operation's etcd snapshot goes (operations/etcd_snapshot.py; ClusterScope.etcd_snapshots).
    etcd_snapshots: SnapshotPort = field(default_factory=DirectorySnapshots)
    #: The TalosMachine created first that names the same node (or hostname) as a machine, or None
    #: (ClusterScope.address_holder): a machine another holds is left out of the step's inputs.
    address_holder: Callable[[MachineView], tuple[str, str] | None] = lambda _m: None


def context_of(scope: ClusterScope, managed: ManagedClients | None = None) -> StepContext:
    """The step's handles from its scope: its trust hooks, its clock, its operations list."""
    return StepContext(scope.kube, scope.controller_namespace, scope.recorder, scope.timing, now=scope.now,
                       trust_hook=scope.trust.trust, trust_refusal=scope.trust.refusal,
                       own_cluster=scope.trust.own_cluster, observe=scope.observe,
                       operations=scope.operations, allowed_secret_namespaces=scope.allowed_secret_namespaces,
                       managed=managed, lock_memo=scope.lock_memo, etcd_snapshots=scope.etcd_snapshots,
                       address_holder=scope.address_holder)


class OperationObject:
    """What ``backbone.Subject`` reads of the operation object a step holds in ``op``: its name, namespace, uid and a
    copy of its status (Inputs for every kind with managed inputs; a test's bare subject for one without)."""

    op: Obj

    @property
    def name(self) -> str:
        return str(self.op["metadata"]["name"])

    @property
    def op_namespace(self) -> str:
        return str(self.op["metadata"]["namespace"])

    @property
    def uid(self) -> str:
        return str(self.op["metadata"]["uid"])

    @property
    def status(self) -> Obj:
        return dict(self.op.get("status") or {})
