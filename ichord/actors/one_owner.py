"""A machine whose node, or a cluster whose bundle Secret, another object holds (docs/decisions.md#one-owner).

    a TalosMachine whose address another TalosMachine, created first, names
        -> Ready=False/AddressInUse naming it, one Warning; its node is not dialled, nothing applied, and no
           operation's inputs hold it (ClusterScope.address_holder)
    a TalosMachine whose spec.hostname another TalosMachine of its cluster, created first, has
        -> Ready=False/HostnameInUse naming it, the same way (two nodes would register as one Kubernetes Node)
    a TalosCluster whose bundle Secret another TalosCluster, created first, names
        -> Ready=False/BundleInUse naming it, one Warning; its machines say so; every unfinished operation of it
           is held (Pending, or Paused once started) with the same reason; nothing else of the step runs

The holder is asked of the informers' indexes (actors/owners.py): no request.
"""

from __future__ import annotations

from ichord.actors import missing_cluster
from ichord.actors.owners import Key
from ichord.actors.runtime import Runtime
from ichord.actors.status_writes import StatusWrites
from ichord.api import names
from ichord.api.conditions import Condition
from ichord.api.names import ReadyReason
from ichord.api.views import ClusterView, MachineView, cluster_ref
from ichord.machines.reconciler import MachineResult
from ichord.operations.cert_expiry import forget_cluster
from ichord.operations.outcome import Outcome, Requeue
from ichord.operations.scope import ClusterScope


def address_holder(rt: Runtime, m: MachineView) -> Key | None:
    """The TalosMachine (namespace, name) created before ``m`` that names the same node, or None."""
    return rt.address_owners.holder(m.key, {"metadata": m.metadata, "spec": m.spec})


def hostname_holder(rt: Runtime, m: MachineView) -> Key | None:
    """The TalosMachine (namespace, name) of ``m``'s cluster created before it with the same spec.hostname, or None."""
    return rt.hostname_owners.holder(m.key, {"metadata": m.metadata, "spec": m.spec})


def machine_holder(rt: Runtime, m: MachineView) -> Key | None:
    """The machine that holds ``m``'s node or its hostname, or None: a machine held is in no operation's inputs."""
    return address_holder(rt, m) or hostname_holder(rt, m)


def machine_refusal(rt: Runtime, m: MachineView) -> MachineResult | None:
    """What ``m`` says when another machine holds its node or its hostname (checked again at the resync; the
    holder's going wakes the cluster sooner), or None when both are its own."""
    holder = address_holder(rt, m)
    if holder is None:
        return _hostname_refusal(rt, m)
    held = rt.machines.cache.get(holder)
    of = f" of TalosCluster {holder[0]}/{cluster_ref(held)}" if held is not None and cluster_ref(held) else ""
    message = (f"spec.address {m.address} reaches the node of TalosMachine {holder[0]}/{holder[1]}{of}, which was "
               f"created first and holds it; nothing is applied to it for this machine. Correct the address "
               f"(`kubectl -n {m.namespace} edit talosmachine {m.name}`) or delete the machine that should not be "
               f"there; the other one's going hands the node over")
    return _refused(rt, ReadyReason.ADDRESS_IN_USE, message)


def _hostname_refusal(rt: Runtime, m: MachineView) -> MachineResult | None:
    holder = hostname_holder(rt, m)
    if holder is None:
        return None
    message = (f"spec.hostname {m.hostname} is TalosMachine {holder[0]}/{holder[1]}'s too, which was created first "
               f"in TalosCluster {m.namespace}/{m.cluster}; two nodes with one name would register as one Kubernetes "
               f"Node, so nothing is applied to this machine's node. Give it a hostname of its own "
               f"(`kubectl -n {m.namespace} edit talosmachine {m.name}`) or delete the machine that should not be "
               f"there; the other one's going hands the name over")
    return _refused(rt, ReadyReason.HOSTNAME_IN_USE, message)


def _refused(rt: Runtime, reason: str, message: str) -> MachineResult:
    """A machine another holds: Ready=False with one Warning, no reboot or restart left for a rollout to plan."""
    return MachineResult(Condition(names.READY, "False", reason, message),
                         fields={"rebootPaths": [], "apiServerRestartPaths": []},
                         event=("Warning", reason, message), requeue_after=rt.resync)


def bundle_holder(rt: Runtime, cluster: ClusterView) -> Key | None:
    """The TalosCluster (namespace, name) created before ``cluster`` whose secretsRef names the same Secret, or None.
    A cluster refused the Secret's namespace (CrossNamespaceRefused) holds nothing and is refused nothing here."""
    allowed = rt.allowed_secret_namespaces
    if cluster.secret_refusal(allowed) is not None:
        return None
    return rt.bundle_owners.holder((cluster.namespace, cluster.name), cluster.obj,
                                   may_hold=lambda obj: ClusterView.of(obj).secret_refusal(allowed) is None)


async def refuse_cluster(rt: Runtime, writes: StatusWrites, scope: ClusterScope, holder: Key) -> Outcome:
    """The cluster, its machines and its unfinished operations say who holds the bundle; nothing else is done."""
    cluster = scope.cluster
    assert cluster is not None
    forget_cluster(scope.namespace, scope.name)  # its expiry series would repeat the holder's CAs
    message = (f"the bundle Secret {cluster.secret_namespace}/{cluster.secret_name} is TalosCluster "
               f"{holder[0]}/{holder[1]}'s (created first); a rotation of either cluster would replace the other's "
               f"CAs, so ichord applies no machine and runs no operation of this one. Give it a bundle of its own in "
               f"spec.secretsRef (`kubectl -n {scope.namespace} edit taloscluster {scope.name}`), or delete it")
    await writes.blocked(cluster, scope.machines, ReadyReason.BUNDLE_IN_USE, message)
    await missing_cluster.hold_operations(rt, scope, ReadyReason.BUNDLE_IN_USE, message)
    return Requeue(rt.resync, "bundle in use")
