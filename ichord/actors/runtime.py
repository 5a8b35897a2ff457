"""What every cluster actor of this process shares: the management API, the informers and the indexes over them,
the Event recorder, timing, the operation kinds' registry, the trust hooks.

Built once by the daemon (or a test); a ``ClusterReconciler`` reads its cluster's machines and operations
through it without a request.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

from ichord.actors.machine_index import ByCluster
from ichord.actors.owners import Owners, bundle_owners, hostname_owners, machine_owners
from ichord.api import names
from ichord.api.views import OperationView, operations_of
from ichord.kube.client import KubeClient
from ichord.kube.events import EventRecorder
from ichord.operations.cert_expiry import DEFAULT_WARNING_DAYS
from ichord.operations.etcd_snapshot import DirectorySnapshots, SnapshotPort
from ichord.operations.kinds import default_registry
from ichord.operations.registry import Registry
from ichord.operations.scope import Clock, TrustHooks, utcnow
from ichord.settings import Timing
from ichord.watchers.informer import Informer
from ichord.watchers.written import ReadYourWrites


@dataclass
class Runtime:
    """What every cluster actor of this process shares."""

    kube: KubeClient
    namespace: str  # the controller namespace: the leader Lease (bundle Secrets and locks: each cluster's own)
    clusters: Informer
    machines: Informer
    operations: Informer
    recorder: EventRecorder
    timing: Timing
    resync: float = 300.0  # how often a converged machine's node is read again (drift)
    warning_days: float = DEFAULT_WARNING_DAYS  # --certificate-expiry-warning-days
    registry: Registry = field(default_factory=default_registry)
    trust: TrustHooks = field(default_factory=TrustHooks)
    #: Namespaces other than a cluster's own that its secretsRef may name (--allow-secret-namespace).
    allowed_secret_namespaces: frozenset[str] = frozenset()
    #: The steps' clock (the wall clock; tests inject a faster one to run maintenance windows in seconds).
    clock: Clock = utcnow
    #: Where an operation's etcd snapshot goes: the daemon's directory (a rehearsal's twin: nowhere).
    etcd_snapshots: SnapshotPort = field(default_factory=DirectorySnapshots)
    #: Tells a cluster's actor (namespace, name) that ``obj`` changed (the Router's tell; set by whoever runs the
    #: actors): what a step waits on outside ichord's own objects (ClusterScope.watch_nodes).
    wake: Callable[[str, str, tuple[str, str], str], None] = lambda _ns, _name, _obj, _reason: None
    #: Each cluster's machines, from the machines informer's events (a step never scans the whole fleet).
    machine_index: ByCluster = field(init=False, repr=False)
    #: Each cluster's operations, likewise.
    operation_index: ByCluster = field(init=False, repr=False)
    #: The operations as this process last wrote them, until the informer has caught up (watchers/written.py).
    operations_written: ReadYourWrites = field(init=False, repr=False)
    #: The TalosMachines by node address and the TalosClusters by bundle Secret: the first of each holds it
    #: (actors/owners.py, docs/decisions.md#one-owner).
    address_owners: Owners = field(init=False, repr=False)
    #: The TalosMachines of each cluster by spec.hostname, likewise.
    hostname_owners: Owners = field(init=False, repr=False)
    bundle_owners: Owners = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.machine_index = ByCluster(self.machines)
        self.operation_index = ByCluster(self.operations)
        self.operations_written = ReadYourWrites(self.operations)
        self.address_owners = machine_owners(self.machines, lambda: self.wake)
        self.hostname_owners = hostname_owners(self.machines, lambda: self.wake)
        self.bundle_owners = bundle_owners(self.clusters, lambda: self.wake)
        self.kube.on_written(names.PLURALS[names.TALOS_OPERATION], self.operations_written.note)

    def operations_of(self, namespace: str, cluster: str) -> list[OperationView]:
        """The cluster's operations, oldest first, from the informer's cache read through this process's own writes:
        no request (docs/architecture.md#read-your-writes says why that is as safe as the LIST it replaced)."""
        keys = self.operation_index.keys(namespace, cluster) | set(self.operations_written.keys(namespace))
        found = (self.operations_written.get(key) for key in keys)
        # Copies, as a LIST gave: a step's kinds may change what they hold; the cache must not change with it.
        return operations_of([copy.deepcopy(obj) for obj in found if obj is not None], namespace, cluster)
