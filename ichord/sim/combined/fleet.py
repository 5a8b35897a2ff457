"""A fleet: many simulated Talos clusters managed through ONE Kubernetes API simulator.

This is the shape of production (one management API server, every TalosCluster, TalosMachine and
bundle Secret on it, one ichord) at a scale a single ``SimEnvironment`` cannot reach. Each cluster
gets its own ``127.A.B.0/24`` block so its nodes keep the real apid port, and every node runs
exactly what ``render()`` makes of the cluster's objects, so a daemon finds every machine converged.

The managed clusters' own API servers are not simulated: the cluster endpoint names an address in
the cluster's block that nothing serves (the machine reconciler never dials it).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ichord.api.names import API_VERSION
from ichord.contract import V1_14, VersionContract
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.combined import objects
from ichord.sim.combined.env import SimEnvironmentError, scaled_behaviours
from ichord.sim.combined.loopback import free
from ichord.sim.combined.started import Started
from ichord.sim.kube.rest import WatchSettings
from ichord.sim.kube.server import KubeSimulator, SimSettings
from ichord.sim.talos.cluster import NodeSpec, SimCluster
from ichord.sim.talos.node import Timings
from ichord.sim.talos.run import scaled

#: Blocks are taken in order from 127.<FIRST_A>.0. upwards: away from 127.0.0.0/24 (fixed-address
#: tests, `ichord sim`) and from the low blocks random test environments favour no more than any other.
FIRST_A = 100
API_PORT = 6443


@dataclass
class FleetCluster:
    """One simulated cluster of the fleet: its objects' specs and its Talos nodes."""

    name: str
    prefix: str
    machines: list[objects.MachinePlan]
    cluster_spec: dict[str, Any]
    machine_specs: dict[str, dict[str, Any]]
    talos: SimCluster = field(repr=False)


def loopback_blocks(last_octets: list[int], port: int, *, first_a: int = FIRST_A) -> Iterator[str]:
    """Prefixes ``127.A.B.`` (A from ``first_a``) whose ``last_octets`` all have ``port`` free, in order."""
    for a in range(first_a, 255):
        for b in range(256):
            prefix = f"127.{a}.{b}."
            if all(free(f"{prefix}{o}", port) for o in last_octets):
                yield prefix


class Fleet(Started):
    """``async with Fleet(clusters=100) as fleet``: ``fleet.kube`` holds every object, ``fleet.clusters``."""

    def __init__(self, clusters: int, *, control_planes: int = 3, workers: int = 1,
                 contract: VersionContract = V1_14, bundle: SecretsBundle | None = None,
                 namespace: str = "ichord-system", name_prefix: str = "c", cni: str = "flannel",
                 time_scale: float = 1.0, timings: Timings | None = None, api_host: str = "127.0.0.1",
                 api_port: int = 0, talos_port: int = objects.APID_PORT, first: int = 11,
                 watch_window: int = 200_000, bookmark_interval: float = 60.0, first_a: int = FIRST_A,
                 objects_in_store: bool = True) -> None:
        """``objects_in_store``: False keeps each cluster's objects in ``documents`` instead of the fleet's own API
        simulator, for a caller that creates them on another management API (bench_idle --management real)."""
        if clusters < 1 or control_planes < 1 or workers < 0 or control_planes + workers + first > 254:
            raise SimEnvironmentError("need at least 1 cluster of at least 1 control plane, and every node of a "
                                      "cluster inside one 127.A.B.0/24 block (lower the node count)")
        self.count = clusters
        self.contract = contract
        self.bundle = bundle
        self.namespace = namespace
        self.name_prefix = name_prefix
        self.cni = cni
        self.time_scale = time_scale
        self._counts = (control_planes, workers)
        self._timings = timings or scaled(time_scale)
        self._talos_port = talos_port
        self._first = first
        self._first_a = first_a
        self._token = secrets.token_urlsafe(24)
        # Every machine's status write is a watch event: keep them all so no informer gets 410 mid-run.
        self.kube = KubeSimulator(SimSettings(
            host=api_host, port=api_port, token=self._token, window=watch_window,
            watch=WatchSettings(bookmark_interval=bookmark_interval * time_scale),
            behaviours=scaled_behaviours(time_scale)))
        self.objects_in_store = objects_in_store
        #: Every cluster's objects when they are not in the store, in creation order (``objects.documents``).
        self.documents: list[dict[str, Any]] = []
        self.clusters: list[FleetCluster] = []
        #: Seconds each start phase took: bundle, render, talos (listen), objects.
        self.timing: dict[str, float] = {"bundle": 0.0, "render": 0.0, "talos": 0.0, "objects": 0.0}

    @property
    def machine_count(self) -> int:
        return sum(len(c.machines) for c in self.clusters)

    def cluster_name(self, i: int) -> str:
        return f"{self.name_prefix}{i + 1:04d}"

    async def start(self) -> None:
        t0 = time.perf_counter()
        if self.bundle is None:
            self.bundle = generate_bundle(self.contract)
        self.timing["bundle"] = time.perf_counter() - t0
        try:
            await self.kube.start()
        except OSError as exc:
            raise SimEnvironmentError(f"cannot serve the Kubernetes API on {self.kube.settings.host}:"
                                      f"{self.kube.settings.port}: {exc.strerror}; pick another api port") from None
        cps, workers = self._counts
        octets = list(range(self._first, self._first + cps + workers))
        blocks = loopback_blocks(octets, self._talos_port, first_a=self._first_a) if self._talos_port else None
        for i in range(self.count):
            prefix = next(blocks) if blocks is not None else f"127.{self._first_a + i // 256}.{i % 256}."
            await self._add_cluster(self.cluster_name(i), prefix)

    async def _add_cluster(self, name: str, prefix: str) -> None:
        assert self.bundle is not None
        cps, workers = self._counts
        t0 = time.perf_counter()
        plans = objects.plan_machines(name, cps, workers, prefix, self._first, self._talos_port)
        # Nothing serves the managed API (the reconciler never dials it); the address only goes into configs.
        cspec = objects.cluster_spec(secret=f"{name}-secrets", endpoint=f"https://{plans[0].ip}:{API_PORT}",
                                     contract=self.contract, cni=self.cni)
        mspecs = {m.name: objects.machine_spec(name, m) for m in plans}
        specs = [NodeSpec(m.name, objects.render_machine(self.bundle, name, cspec, mspecs[m.name]), m.ip, m.port)
                 for m in plans]
        t1 = time.perf_counter()
        talos = SimCluster(self.contract, self._timings)
        self.clusters.append(FleetCluster(name, prefix, plans, cspec, mspecs, talos))
        try:
            await talos.start(specs)
            talos.warm()  # the nodes' serving certificates and encodings exist before any daemon dials
        except OSError as exc:
            raise SimEnvironmentError(f"cannot serve cluster {name}'s Talos nodes on {prefix}x:{self._talos_port}: "
                                      f"{exc.strerror} (another fleet on these blocks: pass another first_a; "
                                      "too many open files: raise `ulimit -n`)") from None
        t2 = time.perf_counter()
        if self.objects_in_store:
            objects.create_objects(self.kube.store, namespace=self.namespace, cluster=name,
                                   secret=f"{name}-secrets", bundle=self.bundle, cspec=cspec, mspecs=mspecs)
        else:
            self.documents += objects.documents(namespace=self.namespace, cluster=name, secret=f"{name}-secrets",
                                                bundle=self.bundle, cspec=cspec, mspecs=mspecs)
        t3 = time.perf_counter()
        self.timing["render"] += t1 - t0
        self.timing["talos"] += t2 - t1
        self.timing["objects"] += t3 - t2

    async def stop(self) -> None:
        for cluster in self.clusters:
            await cluster.talos.close()
        await self.kube.stop()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for ichord on the shared API server (bearer token, file mode 0600)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        return self.kube.write_kubeconfig(path, namespace=self.namespace)

    def ready_reasons(self) -> dict[str, int]:
        """How many TalosMachines have each Ready reason now ("" when no Ready condition), read from the store."""
        group, version = API_VERSION.split("/", 1)
        rt = self.kube.store.resolve(group, version, "talosmachines")
        out: dict[str, int] = {}
        for obj in self.kube.store.objects.get(rt.key, {}).values():
            reason = ""
            for cond in (obj.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "Ready":
                    reason = f"{cond.get('status')}/{cond.get('reason')}"
                    break
            out[reason] = out.get(reason, 0) + 1
        return out
