"""The objects a simulated environment starts with, and the configurations rendered from them.

The TalosCluster and TalosMachine specs are built first and every node's configuration is rendered
from those very specs (``ClusterInputs.from_spec`` / ``MachineInputs.from_spec``), so the daemon,
rendering the same objects, finds every node converged.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from ichord.api.names import API_VERSION, BUNDLE_LABEL, SECRETS_KEY, TALOS_CLUSTER, TALOS_MACHINE
from ichord.contract import VersionContract
from ichord.pki.bundle import SecretsBundle
from ichord.render.config import MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.sim.kube.resources import JSON
from ichord.sim.kube.store import Store

KUBERNETES_VERSION = "1.34.1"
APID_PORT = 50000
GROUP = API_VERSION.split("/", 1)[0]


@dataclass(frozen=True)
class MachinePlan:
    """One simulated machine: its TalosMachine name, role, loopback address and apid port."""

    name: str
    role: str
    ip: str
    port: int

    @property
    def address(self) -> str:
        """``spec.address``: the IP alone on the default apid port, ``ip:port`` otherwise."""
        return self.ip if self.port == APID_PORT else f"{self.ip}:{self.port}"


def plan_machines(cluster: str, control_planes: int, workers: int, ip_prefix: str, first: int,
                  port: int) -> list[MachinePlan]:
    """``<cluster>-cp-1..N`` then ``<cluster>-worker-1..M`` on consecutive addresses from ``first``."""
    roles = [("controlplane", f"{cluster}-cp-{i + 1}") for i in range(control_planes)]
    roles += [("worker", f"{cluster}-worker-{i + 1}") for i in range(workers)]
    return [MachinePlan(name, role, f"{ip_prefix}{first + i}", port) for i, (role, name) in enumerate(roles)]


def cluster_spec(*, secret: str, endpoint: str, contract: VersionContract, cni: str,
                 kubernetes_version: str = KUBERNETES_VERSION) -> JSON:
    return {"secretsRef": {"name": secret}, "endpoint": endpoint, "kubernetesVersion": kubernetes_version,
            "talosVersion": str(contract), "cni": {"preset": cni}}


def machine_spec(cluster: str, machine: MachinePlan) -> JSON:
    # No hostname: the node names itself and the daemon reads the name from the node (Nodename).
    return {"clusterRef": {"name": cluster}, "role": machine.role, "address": machine.address, "approved": True}


def render_machine(bundle: SecretsBundle, cluster: str, cspec: JSON, mspec: JSON) -> MachineConfig:
    return render(bundle, ClusterInputs.from_spec(cluster, cspec), MachineInputs.from_spec(mspec))


def documents(*, namespace: str, cluster: str, secret: str, bundle: SecretsBundle, cspec: JSON,
              mspecs: dict[str, JSON]) -> list[JSON]:
    """The bundle Secret, the TalosCluster and its TalosMachines of one cluster, as a client would create them."""
    data = base64.b64encode(bundle.to_yaml().encode()).decode()
    docs: list[JSON] = [{
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": secret, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "ichord",
                                                                      BUNDLE_LABEL: "true"}},
        "type": "Opaque", "data": {SECRETS_KEY: data}}, {
        "apiVersion": API_VERSION, "kind": TALOS_CLUSTER,
        "metadata": {"name": cluster, "namespace": namespace}, "spec": cspec}]
    for name, spec in mspecs.items():
        docs.append({"apiVersion": API_VERSION, "kind": TALOS_MACHINE,
                     "metadata": {"name": name, "namespace": namespace, "labels": {f"{GROUP}/cluster": cluster}},
                     "spec": spec})
    return docs


def create_objects(store: Store, *, namespace: str, cluster: str, secret: str, bundle: SecretsBundle,
                   cspec: JSON, mspecs: dict[str, JSON]) -> None:
    """Namespace, bundle Secret, TalosCluster and TalosMachines, written straight into the store."""
    ns_rt = store.resolve("", "v1", "namespaces")
    if ("", namespace) not in store.objects[ns_rt.key]:
        store.create(ns_rt, None, {"metadata": {"name": namespace}})
    version = API_VERSION.split("/", 1)[1]
    where = {"Secret": ("", "v1", "secrets"), TALOS_CLUSTER: (GROUP, version, "talosclusters"),
             TALOS_MACHINE: (GROUP, version, "talosmachines")}
    for doc in documents(namespace=namespace, cluster=cluster, secret=secret, bundle=bundle, cspec=cspec,
                         mspecs=mspecs):
        store.create(store.resolve(*where[doc["kind"]]), namespace, doc)


def node_object(name: str, ip: str, role: str, *, kubelet_version: str, os_image: str, boot_id: str,
                taint_control_plane: bool) -> JSON:
    """A Node as the kubelet registers it (status written separately, as the kubelet does)."""
    machine_id = hashlib.sha256(name.encode()).hexdigest()[:32]
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}
    spec: dict[str, Any] = {}
    if role == "controlplane":
        labels["node-role.kubernetes.io/control-plane"] = ""
        if taint_control_plane:
            spec["taints"] = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            # Every field the typed clients require (kubernetes-asyncio refuses a Node missing one).
            "nodeInfo": {"kubeletVersion": f"v{kubelet_version}", "kubeProxyVersion": "", "osImage": os_image,
                         "bootID": boot_id, "operatingSystem": "linux", "architecture": "amd64",
                         "containerRuntimeVersion": "containerd://2.1.4", "kernelVersion": "6.12.48-talos",
                         "machineID": machine_id, "systemUUID": machine_id},
            "capacity": {"cpu": "2", "memory": "4026532Ki", "pods": "110"},
            "allocatable": {"cpu": "1950m", "memory": "3604644Ki", "pods": "110"},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "conditions": [],
        },
    }
