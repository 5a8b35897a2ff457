"""The twin: ichord's simulators (Kubernetes API, Talos nodes) seeded with what was read of the live cluster.

Same TalosCluster spec (its endpoint and patches as they are: the daemon renders from them), same TalosMachines
(names, roles, specs; only their addresses are the twin's loopback ones), the live bundle, and each node started
from the configuration it runs now, so a node that waits for a reboot waits in the twin too. The managed cluster
gets the live PodDisruptionBudgets and the Deployments and DaemonSets outside kube-system, whose pods the
simulator schedules (it places them itself: the live placement is shown in the output, not reproduced).

Two kinds of pod the simulator has no controller for are taken closest to what a drain meets on the live cluster:
- a StatefulSet becomes a Deployment of the same name, replicas, selector and template: an evicted pod comes back
  elsewhere (its name and the order of the ordinals are not reproduced), so its PodDisruptionBudget counts alike;
- a pod no controller owns (outside kube-system, not a mirror pod, not finished) is created on its live node:
  ichord's drain refuses it as it would on the live cluster, so that stop is predicted.

The twin writes nothing outside itself: ichord's kubeconfig for it stays in memory (``kubeconfig_data``), and the
operation's steps take their etcd snapshot through the twin's port (``etcd_snapshots``, snapshots.py), which plays
it from the twin's control planes and writes no file, so the live directory is never touched.
"""

from __future__ import annotations

import copy
from typing import Any

from ichord.api.views import MachineView
from ichord.contract import VersionContract
from ichord.operations.managed.drain import skipped, unowned
from ichord.pki.bundle import SecretsBundle
from ichord.rehearsal.live import LiveCluster
from ichord.rehearsal.snapshots import PlayedSnapshots
from ichord.render.config import MachineConfig
from ichord.sim.combined import SimEnvironment, objects
from ichord.sim.kube.podrules import CLIENT_NAMESPACE
from ichord.sim.talos.node import Timings

Obj = dict[str, Any]
#: Metadata the live API server set that a create into the twin must not carry.
_SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink",
                  "ownerReferences", "deletionTimestamp", "deletionGracePeriodSeconds")


def _approved(live: LiveCluster) -> list[MachineView]:
    views = [MachineView.of(o) for o in live.machines]
    return sorted((m for m in views if m.approved and m.name in live.nodes), key=lambda m: (not m.is_control_plane,
                                                                                            m.name))


class Twin(SimEnvironment):
    """A SimEnvironment whose objects, bundle and node configurations are the live cluster's."""

    writes_kubeconfig = False

    def __init__(self, live: LiveCluster, contract: VersionContract, *, time_scale: float, timings: Timings) -> None:
        approved = _approved(live)
        cps = sum(1 for m in approved if m.is_control_plane)
        cni = str(((live.cluster.get("spec") or {}).get("cni") or {}).get("preset") or "flannel")
        super().__init__(control_planes=max(cps, 1), workers=len(approved) - cps, contract=contract,
                         bundle=live.bundle, namespace=live.namespace, cluster_name=live.name, cni=cni,
                         time_scale=time_scale, timings=timings, addons=True,
                         # ichord's objects on an API of their own: the rehearsal's client is not the one a rotation
                         # of the twin's Kubernetes CA must keep trusting (that is the daemon's trust pool's job).
                         management_api="separate")
        self.live = live
        self._approved = approved
        self.secret_name = live.secret_name
        #: Where the operation's etcd snapshot goes in the twin: played, never written (the actor's port).
        self.etcd_snapshots = PlayedSnapshots()

    def _plan_machines(self, prefix: str) -> list[objects.MachinePlan]:
        return [objects.MachinePlan(m.name, m.role, f"{prefix}{self._first + i}", self._talos_port)
                for i, m in enumerate(self._approved)]

    def _specs(self) -> tuple[Obj, dict[str, Obj]]:
        cspec = copy.deepcopy(self.live.cluster.get("spec") or {})
        cspec["secretsRef"] = {"name": self.secret_name}  # the twin's Secret is in the twin's namespace
        return cspec, {m.name: copy.deepcopy(m.spec) for m in self._approved}

    def _node_config(self, bundle: SecretsBundle, cspec: Obj, mspec: Obj,
                     machine: objects.MachinePlan) -> MachineConfig:
        return MachineConfig.parse(self.live.nodes[machine.name].running_config)

    async def start(self) -> None:
        await super().start()
        self._seed_workloads()

    def _seed_workloads(self) -> None:
        store = self.kube.store
        where = {"deployments": ("apps", "v1", "deployments"), "daemonsets": ("apps", "v1", "daemonsets"),
                 "pdbs": ("policy", "v1", "poddisruptionbudgets")}
        for what in ("deployments", "daemonsets", "pdbs"):
            rt = store.resolve(*where[what])
            for obj in self.live.managed.get(what, []):
                meta = obj.get("metadata") or {}
                ns = str(meta.get("namespace") or "default")
                if ns == CLIENT_NAMESPACE and what != "pdbs":
                    continue  # kube-system's clients are the simulator's own addons
                self._namespace(ns)
                clean = {k: v for k, v in meta.items() if k not in _SERVER_FIELDS}
                body = {**copy.deepcopy(obj), "metadata": clean}
                body.pop("status", None)
                store.create(rt, ns, body)
        deployments = store.resolve(*where["deployments"])
        for sts in self.live.managed.get("statefulsets", []):
            meta = sts.get("metadata") or {}
            ns = str(meta.get("namespace") or "default")
            if ns == CLIENT_NAMESPACE:
                continue
            self._namespace(ns)
            spec = sts.get("spec") or {}
            store.create(deployments, ns, {
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": str(meta.get("name") or ""), "namespace": ns,
                             "labels": dict(meta.get("labels") or {})},
                "spec": {"replicas": spec.get("replicas", 1), "selector": copy.deepcopy(spec.get("selector") or {}),
                         "template": copy.deepcopy(spec.get("template") or {})}})
        pods = store.resolve("", "v1", "pods")
        placed = self._twin_node_names()
        for pod in self.live.managed.get("pods", []):
            meta = pod.get("metadata") or {}
            ns = str(meta.get("namespace") or "default")
            node = placed.get(str((pod.get("spec") or {}).get("nodeName") or ""))
            if ns == CLIENT_NAMESPACE or node is None or not unowned(pod) or skipped(pod):
                continue
            self._namespace(ns)
            clean = {k: v for k, v in meta.items() if k not in _SERVER_FIELDS}
            body = {**copy.deepcopy(pod), "metadata": clean}
            body["spec"] = {**body.get("spec", {}), "nodeName": node}
            body["status"] = {"phase": "Running"}
            store.create(pods, ns, body)

    def _namespace(self, ns: str) -> None:
        store = self.kube.store
        ns_rt = store.resolve("", "v1", "namespaces")
        if ("", ns) not in store.objects[ns_rt.key]:
            store.create(ns_rt, None, {"metadata": {"name": ns}})

    def _twin_node_names(self) -> dict[str, str]:
        """A live Node's name -> the twin's Node of the same machine (by its hostname, recorded Node name or name)."""
        out: dict[str, str] = {}
        for obj in self.live.machines:
            m = MachineView.of(obj)
            if m.name not in self.talos.nodes:
                continue
            twin = self.talos.nodes[m.name].nodename
            recorded = str((obj.get("status") or {}).get("nodeName") or "")
            for live_name in (m.name, recorded, m.hostname or ""):
                if live_name:
                    out[live_name] = twin
        return out
