"""The twin: ichord's simulators (Kubernetes API, Talos nodes) seeded with what was read of the live cluster.

Same TalosCluster spec (its endpoint and patches as they are: the daemon renders from them), same TalosMachines
(names, roles, specs; only their addresses are the twin's loopback ones), the live bundle, and each node started
from the configuration it runs now, so a node that waits for a reboot waits in the twin too. The managed cluster
gets the live PodDisruptionBudgets and the Deployments and DaemonSets outside kube-system, whose pods the
simulator schedules (it places them itself: the live placement is shown in the output, not reproduced).
"""

from __future__ import annotations

import copy
from typing import Any

from ichord.api.views import MachineView
from ichord.contract import VersionContract
from ichord.pki.bundle import SecretsBundle
from ichord.rehearsal.live import LiveCluster
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
        ns_rt = store.resolve("", "v1", "namespaces")
        where = {"deployments": ("apps", "v1", "deployments"), "daemonsets": ("apps", "v1", "daemonsets"),
                 "pdbs": ("policy", "v1", "poddisruptionbudgets")}
        for what in ("deployments", "daemonsets", "pdbs"):
            rt = store.resolve(*where[what])
            for obj in self.live.managed.get(what, []):
                meta = obj.get("metadata") or {}
                ns = str(meta.get("namespace") or "default")
                if ns == CLIENT_NAMESPACE and what != "pdbs":
                    continue  # kube-system's clients are the simulator's own addons
                if ("", ns) not in store.objects[ns_rt.key]:
                    store.create(ns_rt, None, {"metadata": {"name": ns}})
                clean = {k: v for k, v in meta.items() if k not in _SERVER_FIELDS}
                body = {**copy.deepcopy(obj), "metadata": clean}
                body.pop("status", None)
                store.create(rt, ns, body)
