"""What a rehearsal knows of the live cluster: read with GET/LIST and read-only Talos calls, never written.

Management API: the TalosCluster, its TalosMachines and TalosOperations, and the bundle Secret (parsed in memory,
never written to a file). Each approved machine, over mutual TLS with the bundle's OS CA: its Talos version, its
running configuration and, on control planes, etcd's member list. The managed cluster, through the admin
kubeconfig a control plane issues (the Kubeconfig RPC signs a client certificate in memory and changes nothing on
the node): its Nodes, PodDisruptionBudgets, the pods on each node and the Deployments, DaemonSets and
StatefulSets that own them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ichord.api import names
from ichord.api.views import ClusterView, MachineView, operations_of
from ichord.errors import IchordError, RuntimeFailure
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError, NotFound
from ichord.kube.reads import read_secret
from ichord.operations.managed.clients import ManagedAPIError, admin_client
from ichord.pki.bundle import SecretsBundle
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosError

Obj = dict[str, Any]

#: The managed cluster's objects a twin takes (path, what it is); LIST only.
MANAGED_READS = (("/api/v1/nodes", "nodes"), ("/apis/policy/v1/poddisruptionbudgets", "pdbs"),
                 ("/api/v1/pods", "pods"), ("/apis/apps/v1/deployments", "deployments"),
                 ("/apis/apps/v1/daemonsets", "daemonsets"), ("/apis/apps/v1/statefulsets", "statefulsets"))


class RehearsalInputError(IchordError):
    """What to rehearse cannot be read or is not an operation of this cluster (bad input; nothing was written)."""


@dataclass(frozen=True)
class LiveNode:
    """One approved machine as its node reports it."""

    machine: str
    role: str
    address: str
    talos_version: str
    running_config: bytes = field(repr=False)
    etcd_members: tuple[str, ...] = ()  # hostnames in etcd's member list, as this control plane reports it


@dataclass
class LiveCluster:
    """Everything the twin is built from (held in memory only)."""

    namespace: str
    name: str
    cluster: Obj
    machines: list[Obj]
    operations: list[Obj]
    bundle: SecretsBundle = field(repr=False)
    secret_name: str = ""
    nodes: dict[str, LiveNode] = field(default_factory=dict)
    managed: dict[str, list[Obj]] = field(default_factory=dict)
    #: Why the managed cluster could not be read (the twin then has no workloads), or "".
    managed_error: str = ""
    #: What the live cluster shows that the twin cannot (said in the output).
    notes: list[str] = field(default_factory=list)

    def pods_per_node(self) -> Counter[str]:
        return Counter(str((p.get("spec") or {}).get("nodeName") or "") for p in self.managed.get("pods", [])
                       if (p.get("spec") or {}).get("nodeName"))


async def read_live(kube: KubeClient, namespace: str, name: str, talos_factory: Any = TalosClient) -> LiveCluster:
    """The live cluster ``namespace/name``, read only. ``talos_factory(dial)``: a TalosClient (tests count on it)."""
    try:
        cluster = await crds.clusters(kube).get(namespace, name)
    except NotFound:
        raise RehearsalInputError(f"TalosCluster {namespace}/{name} not found; check the name and -n. "
                                  "Nothing was written.") from None
    view = ClusterView.of(cluster)
    machine_objs, _ = await crds.machines(kube).list_objects(namespace)
    machines = []
    for obj in machine_objs:
        try:
            m = MachineView.of(obj)
        except IchordError:
            continue  # a malformed machine is in no plan; the reconciler reports it
        if m.cluster == name:
            machines.append(obj)
    op_objs, _ = await crds.operations(kube).list_objects(namespace)
    operations = [o.obj for o in operations_of(op_objs, namespace, name)]
    if not view.secret_name:
        raise RehearsalInputError(f"TalosCluster {namespace}/{name} has no spec.secretsRef.name; there is no bundle "
                                  "to rehearse with")
    try:
        secret = await read_secret(kube, view.secret_namespace, view.secret_name)
    except NotFound:
        raise RehearsalInputError(f"the bundle Secret {view.secret_namespace}/{view.secret_name} does not exist; "
                                  "check the TalosCluster's spec.secretsRef") from None
    raw = secret.data.get(names.SECRETS_KEY)
    if raw is None:
        raise RehearsalInputError(f"Secret {view.secret_namespace}/{view.secret_name} has no {names.SECRETS_KEY}")
    bundle = SecretsBundle.from_yaml(raw, f"Secret {view.secret_namespace}/{view.secret_name}")
    live = LiveCluster(namespace, name, cluster, machines, operations, bundle, secret_name=view.secret_name)
    if names.ROTATION_KEY in secret.data:
        live.notes.append(f"the bundle Secret holds {names.ROTATION_KEY}: a CA rotation is under way")
    approved = [MachineView.of(o) for o in machines if MachineView.of(o).approved]
    if not approved:
        raise RehearsalInputError(f"TalosCluster {namespace}/{name} has no approved TalosMachine; nothing to rehearse")
    talos = talos_factory(DialBundle.from_bundle(bundle))
    try:
        for m in approved:
            live.nodes[m.name] = await _read_node(talos, m)
        control_planes = [m for m in approved if m.is_control_plane]
        live.notes += membership_notes(live, control_planes)
        try:
            async with admin_client(talos, control_planes, [bundle.k8s.cert_pem]) as managed:
                for path, what in MANAGED_READS:
                    live.managed[what] = (await managed.raw("GET", path)).get("items") or []
        except (ManagedAPIError, KubeError) as exc:
            live.managed_error = SCRUBBER.exception(exc)
            live.notes.append(f"the managed cluster's API could not be read ({live.managed_error}): the twin has no "
                              "workloads, so no drain is rehearsed")
    finally:
        talos.close()
    return live


def membership_notes(live: LiveCluster, control_planes: list[MachineView]) -> list[str]:
    """What the twin does not reproduce: Talos versions that differ between nodes (the twin runs the cluster's
    contract on every node) and etcd members that differ from the control planes (the twin's etcd has one member
    per control plane; the real run's etcd check would see the live membership)."""
    notes = []
    versions = sorted({n.talos_version for n in live.nodes.values()})
    if len(versions) > 1:
        notes.append(f"the nodes run different Talos versions ({', '.join(versions)}); the twin runs the cluster's "
                     "contract on every node")
    views = {n.etcd_members for n in live.nodes.values() if n.role == "controlplane"}
    if len(views) > 1:
        notes.append("the control planes do not agree on etcd's members; the real run's etcd check may stop where "
                     "the twin's does not")
    elif views:
        (members,) = views
        if len(members) != len(control_planes):
            notes.append(f"etcd has {len(members)} member(s) for {len(control_planes)} control plane(s); the twin has "
                         "one per control plane")
    return notes


async def _read_node(talos: TalosClient, m: MachineView) -> LiveNode:
    try:
        version = await talos.version(m.address)
        running = await talos.machine_config(m.address)
        members: tuple[str, ...] = ()
        if m.is_control_plane:
            members = tuple(sorted(str(x.hostname) for x in await talos.etcd_member_list(m.address)))
    except TalosError as exc:
        raise RehearsalUnreachable(f"TalosMachine {m.name} ({m.address}) cannot be read: "
                                   f"{SCRUBBER.exception(exc)}") from None
    return LiveNode(m.name, m.role, m.address, version.tag, running, members)


class RehearsalUnreachable(RuntimeFailure):
    """A node of the live cluster does not answer a read: there is nothing to build its twin from."""
