"""SimEnvironment: a simulated Talos cluster, its own Kubernetes API, and ichord's objects on it.

``async with SimEnvironment() as env`` starts, on one loopback block ``127.A.B.``:
- the managed cluster's API server (self-hosted: serving certificate from the bundle's Kubernetes
  CA, x509 client authentication against the CAs the control planes accept, a Node per machine);
- with ``management_api="separate"``, a second, independent API server for ichord's objects;
- one Talos node per machine, each running exactly what ``render()`` makes of the objects;
- the controller namespace with the bundle Secret, the TalosCluster and one TalosMachine per node;
- a kubeconfig for ichord (bearer token generated per environment, file mode 0600) and, when
  ``state_port`` is set, the combined state/history JSON over HTTP.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from ichord.contract import V1_14, VersionContract
from ichord.errors import IchordError
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.render.config import MachineConfig
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.safefile import write_file
from ichord.sim.combined import objects
from ichord.sim.combined.addons import install_addons
from ichord.sim.combined.follow import Follower
from ichord.sim.combined.loopback import free_loopback_block
from ichord.sim.combined.readyz import ReadyzServers
from ichord.sim.combined.started import Started
from ichord.sim.kube.behaviours import BehaviourSettings
from ichord.sim.kube.clientpods import PodModel
from ichord.sim.kube.podrules import CLIENT_NAMESPACE
from ichord.sim.kube.server import DEFAULT_CRD_DIR, KubeSimulator, SimSettings
from ichord.sim.kube.status import ApiError
from ichord.sim.talos.cluster import NodeSpec, SimCluster
from ichord.sim.talos.node import SimNode, Timings
from ichord.sim.talos.run import scaled, state_app

ManagementAPI = Literal["self", "separate"]
API_PORT = 6443


class SimEnvironmentError(IchordError):
    """The environment cannot start as asked; the message says what to change."""


def scaled_behaviours(scale: float) -> BehaviourSettings:
    b = BehaviourSettings()
    return replace(b, root_ca_publish_lag=b.root_ca_publish_lag * scale, projected_ca_lag=b.projected_ca_lag * scale,
                   rollout_step=b.rollout_step * scale, kubelet_restart=b.kubelet_restart * scale,
                   ext_auth_recreate_lag=b.ext_auth_recreate_lag * scale)


class SimEnvironment(Started):
    #: Whether ``start`` writes ichord's kubeconfig to a file (``kubeconfig``); one that writes nothing (a
    #: rehearsal's twin) hands it out in memory (``kubeconfig_data``).
    writes_kubeconfig = True

    def __init__(self, *, control_planes: int = 3, workers: int = 1, contract: VersionContract = V1_14,
                 bundle: SecretsBundle | None = None, namespace: str = "ichord-system", cluster_name: str = "demo",
                 cni: str = "flannel", time_scale: float = 1.0, timings: Timings | None = None,
                 management_api: ManagementAPI = "self", ip_prefix: str | None = None, first: int = 11,
                 talos_port: int = objects.APID_PORT, api_port: int = API_PORT, state_port: int | None = None,
                 state_host: str = "127.0.0.1", kubeconfig: Path | None = None, replace_kubeconfig: bool = True,
                 kubernetes_version: str = objects.KUBERNETES_VERSION, projected_ca_path: Path | None = None,
                 projected_ca_lag: float | None = None, addons: bool = False, pod_start_delay: float | None = None,
                 kubelet_restart_lag: float | None = None, client_ca_reread: float | None = None) -> None:
        """``projected_ca_path``: the file the simulated kubelet keeps as a pod's projected ``ca.crt`` (the
        managed cluster's issuing Kubernetes CA), refreshed ``projected_ca_lag`` seconds (unscaled; default
        BehaviourSettings') after kube-root-ca.crt is republished following a serving-CA switch.

        ``addons``: run the CNI's workloads, kube-proxy and CoreDNS in kube-system (addons.py), started and
        available before ``start`` returns. ``pod_start_delay`` (a pod's start), ``kubelet_restart_lag`` (a
        Kubernetes CA change restarts the kubelet this much later: stale Ready) and ``client_ca_reread``
        (client-go's CA reload) are unscaled seconds, multiplied by ``time_scale``; None keeps the defaults
        (0, 0 and 300 s)."""
        if control_planes < 1 or workers < 0 or control_planes + workers + first > 254:
            raise SimEnvironmentError("need at least 1 control plane, 0 or more workers, and every node address "
                                      "inside one 127.A.B.0/24 block (lower --first-address or the node count)")
        if management_api not in ("self", "separate"):
            raise SimEnvironmentError(f"management API {management_api!r} is neither 'self' nor 'separate'")
        self.contract = contract
        self.bundle = bundle
        self.namespace = namespace
        self.cluster_name = cluster_name
        self.secret_name = f"{cluster_name}-secrets"
        self.cni = cni
        self.management_api = management_api
        self.time_scale = time_scale
        self.kubernetes_version = kubernetes_version
        self._timings = timings or scaled(time_scale)
        self._counts = (control_planes, workers)
        self._ip_prefix = ip_prefix
        self._first = first
        self._talos_port = talos_port
        self._api_port = api_port
        self._state = (state_host, state_port)
        self._kubeconfig_out = kubeconfig
        self._replace_kubeconfig = replace_kubeconfig  # False: an existing file is refused (the `ichord sim` CLI)
        self._projected = (projected_ca_path, projected_ca_lag)
        self._addons = addons
        self._pod_start_delay = pod_start_delay
        self._client_ca_reread = client_ca_reread
        if kubelet_restart_lag is not None:
            self._timings = replace(self._timings, kubelet_restart_lag=kubelet_restart_lag * time_scale)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._runner: web.AppRunner | None = None
        self._token = secrets.token_urlsafe(24)
        self.machines: list[objects.MachinePlan] = []
        self.cluster_spec: dict[str, Any] = {}
        self.machine_specs: dict[str, dict[str, Any]] = {}
        self.kube: KubeSimulator
        self.management: KubeSimulator
        self.talos: SimCluster
        self.follower: Follower
        self.readyz: ReadyzServers | None = None
        self.kubeconfig: Path
        self.state_url: str | None = None
        self.started_in: float = 0.0

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        t0 = time.perf_counter()
        cps, workers = self._counts
        n = cps + workers
        octets = list(range(self._first - 1, self._first + n))
        prefix = self._ip_prefix or free_loopback_block(octets, [p for p in (self._talos_port, self._api_port) if p])
        self.machines = self._plan_machines(prefix)
        if self.bundle is None:
            self.bundle = generate_bundle(self.contract)
        bundle = self.bundle
        endpoint_ip = self.machines[0].ip  # the cluster endpoint is the first control plane's address
        behaviours = scaled_behaviours(self.time_scale)
        management_behaviours = behaviours
        projected_path, projected_lag = self._projected
        if projected_path is not None or projected_lag is not None:
            # Only the managed cluster's kubelet refreshes the file: a separate management API never switches CA.
            behaviours = replace(behaviours, projected_ca_path=projected_path, projected_ca_lag=(
                behaviours.projected_ca_lag if projected_lag is None else projected_lag * self.time_scale))
        if self._pod_start_delay is not None:
            behaviours = replace(behaviours, pod_start_delay=self._pod_start_delay * self.time_scale)
        if self._client_ca_reread is not None:
            behaviours = replace(behaviours, client_ca_reread=self._client_ca_reread * self.time_scale)
        self.kube = KubeSimulator(SimSettings(
            host=endpoint_ip, port=self._api_port, serving_hosts=(endpoint_ip, "127.0.0.1"),
            token=self._token, client_cas=(bundle.k8s.cert_pem,), behaviours=behaviours,
            # ichord's CRDs live where ichord runs: on a separate management API, not on the managed one.
            crd_dir=DEFAULT_CRD_DIR if self.management_api == "self" else None), ca=bundle.k8s)
        self.management = self.kube
        await self._listen(self.kube)
        if self.management_api == "separate":
            self.management = KubeSimulator(SimSettings(host=f"{prefix}{self._first - 1}", port=self._api_port,
                                                        token=self._token, behaviours=management_behaviours))
            await self._listen(self.management)

        cspec, mspecs = self._specs()
        self.cluster_spec, self.machine_specs = cspec, mspecs
        specs = [NodeSpec(m.name, self._node_config(bundle, cspec, mspecs[m.name], m), m.ip, m.port)
                 for m in self.machines]
        self.talos = SimCluster(self.contract, self._timings)
        self.talos.kubeconfig_server = self.kube.url
        self.follower = Follower(self.talos, self.kube)
        self.follower.attach()
        try:
            await self.talos.start(specs)
        except OSError as exc:
            raise SimEnvironmentError(f"cannot serve a Talos node on {prefix}x:{self._talos_port}: {exc.strerror}; "
                                      "pick another --ip-prefix or --talos-port 0") from None
        # With port 0 every node listens on a port of its own choosing: the objects must name it.
        self.machines = [replace(m, port=self.talos.nodes[m.name].port) if m.port == 0 else m
                         for m in self.machines]
        for m in self.machines:
            mspecs[m.name]["address"] = m.address
        self._register_nodes()
        self._watch_clients()
        objects.create_objects(self.management.store, namespace=self.namespace, cluster=self.cluster_name,
                               secret=self.secret_name, bundle=bundle, cspec=cspec, mspecs=mspecs)
        await self.follower.sync()
        self.follower.start()
        self.readyz = ReadyzServers(self.talos, self.kube, int(cspec.get("localAPIServerPort") or API_PORT))
        await self.readyz.start()
        if self._addons:
            await self._start_addons()
        if self.writes_kubeconfig:
            self.kubeconfig = self._write_kubeconfig()
        await self._serve_state()
        self.started_in = time.perf_counter() - t0

    # The three things a twin of another cluster (ichord/rehearsal) takes from that cluster instead.

    def _plan_machines(self, prefix: str) -> list[objects.MachinePlan]:
        cps, workers = self._counts
        return objects.plan_machines(self.cluster_name, cps, workers, prefix, self._first, self._talos_port)

    def _specs(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        cspec = objects.cluster_spec(secret=self.secret_name, endpoint=self.kube.url, contract=self.contract,
                                     cni=self.cni, kubernetes_version=self.kubernetes_version)
        return cspec, {m.name: objects.machine_spec(self.cluster_name, m) for m in self.machines}

    def _node_config(self, bundle: SecretsBundle, cspec: dict[str, Any], mspec: dict[str, Any],
                     machine: objects.MachinePlan) -> MachineConfig:
        return objects.render_machine(bundle, self.cluster_name, cspec, mspec)

    async def stop(self) -> None:
        if self.readyz is not None:
            await self.readyz.stop()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if hasattr(self, "follower"):
            await self.follower.stop()
        if hasattr(self, "talos"):
            await self.talos.close()
        if hasattr(self, "management") and self.management is not self.kube:
            await self.management.stop()
        if hasattr(self, "kube"):
            await self.kube.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def _listen(self, kube: KubeSimulator) -> None:
        try:
            await kube.start()
        except OSError as exc:
            raise SimEnvironmentError(f"cannot serve the Kubernetes API on {kube.settings.host}:{kube.settings.port}: "
                                      f"{exc.strerror}; pick another --ip-prefix or --api-port 0") from None

    def _register_nodes(self) -> None:
        rt = self.kube.store.resolve("", "v1", "nodes")
        for plan in self.machines:
            node = self.talos.nodes[plan.name]
            self.kube.store.create(rt, None, objects.node_object(
                node.nodename, node.ip, plan.role, kubelet_version=self.kubernetes_version,
                os_image=f"Talos ({self.talos.version_tag(self.contract)})", boot_id=node.boot_id,
                taint_control_plane=True))
            self.follower.update_node(node)

    def _watch_clients(self) -> None:
        # The pod model's events go into the one ordered history, next to the nodes' kubelet restarts.
        pods = self.kube.behaviours.pods
        history = self.talos.history
        pods.record_hook = lambda kind, data: history.record(kind, None, **data)
        pods.pending_kubelet_restarts = lambda: [n.nodename for n in self.talos.nodes.values()
                                                 if n.kubelet_restarts_pending]

    async def _start_addons(self) -> None:
        made = install_addons(self.kube.store, self.cni)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0 + 20 * (self.kube.behaviours.settings.pod_start_delay
                                              + self.kube.behaviours.settings.rollout_step)
        while not_available := [f"{p}/{n}" for p, n in made if not self.workload_available(p, n)]:
            if loop.time() > deadline:
                raise SimEnvironmentError(f"the simulated addons did not become available: {', '.join(not_available)}")
            await asyncio.sleep(0.01)

    def workload_available(self, plural: str, name: str, namespace: str = CLIENT_NAMESPACE) -> bool:
        """The workload's rollout is done: every pod of its current template Ready (the status the model writes)."""
        store = self.kube.store
        try:
            obj = store.get(store.resolve("apps", "v1", plural), namespace, name)
        except ApiError:
            return False
        st = obj.get("status") or {}
        if int(st.get("observedGeneration") or 0) < int(obj["metadata"].get("generation") or 0):
            return False
        if plural == "daemonsets":
            desired = int(st.get("desiredNumberScheduled") or 0)
            return (int(st.get("updatedNumberScheduled") or 0) >= desired
                    and int(st.get("numberAvailable") or 0) >= desired)
        want = int(obj["spec"].get("replicas", 1))
        return int(st.get("updatedReplicas") or 0) >= want and int(st.get("availableReplicas") or 0) >= want

    @property
    def clients(self) -> PodModel:
        """The managed cluster's pods and in-cluster clients: x509 failures, DNS, outages (clientpods.py)."""
        return self.kube.behaviours.pods

    def kubeconfig_data(self) -> bytes:
        """ichord's kubeconfig for the environment's management API, in memory."""
        return self.management.kubeconfig_data(namespace=self.namespace)

    def _write_kubeconfig(self) -> Path:
        path = self._kubeconfig_out
        if path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ichord-sim-env-")
            path = Path(self._tmp.name) / "kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_file(path, self.kubeconfig_data(), force=self._replace_kubeconfig)

    async def _serve_state(self) -> None:
        host, port = self._state
        if port is None:
            return
        runner = web.AppRunner(state_app(self.talos, self.state), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise SimEnvironmentError(f"cannot serve the state on {host}:{port}: {exc.strerror}; pick another "
                                      "--state-port (0: any free port)") from None
        self._runner = runner
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.state_url = f"http://{host}:{bound}/state"

    # ---- handles for tests ------------------------------------------------------------------

    @property
    def machine_names(self) -> list[str]:
        return [m.name for m in self.machines]

    @property
    def endpoints(self) -> dict[str, str]:
        """Machine name -> the Talos API endpoint ``ip:port`` it listens on."""
        return {name: node.endpoint for name, node in self.talos.nodes.items()}

    def cluster_inputs(self) -> ClusterInputs:
        """The render inputs of the TalosCluster as created (what the daemon reads from it)."""
        return ClusterInputs.from_spec(self.cluster_name, self.cluster_spec)

    def machine_inputs(self, machine: str) -> MachineInputs:
        return MachineInputs.from_spec(self.machine_specs[machine])

    def node(self, machine: str) -> SimNode:
        node = self.talos.nodes.get(machine)
        if node is None:
            raise KeyError(f"no simulated machine {machine!r}; machines: {', '.join(self.machine_names)}")
        return node

    def applies(self, machine: str) -> list[tuple[str, str]]:
        """(configuration hash, mode) of every apply the node accepted, in order (dry runs never count)."""
        return [(e["config_hash"], e["mode"]) for e in self.talos.history.of("apply", self.node(machine).name)]

    async def set_unreachable(self, machine: str, unreachable: bool = True) -> None:
        """Fault injection: the node stops answering (connection refused) or answers again."""
        await self.node(machine).set_unreachable(unreachable)

    async def sync_from_nodes(self) -> None:
        """Follow the control planes now (client CAs, serving CA); the background task does it too."""
        await self.follower.sync()

    def node_ready(self, machine: str) -> str | None:
        """The Node's Ready condition status ("True", "False", "Unknown") on the managed API server."""
        obj = self.kube.store.get(self.kube.store.resolve("", "v1", "nodes"), None, self.node(machine).nodename)
        for cond in obj["status"].get("conditions") or []:
            if cond.get("type") == "Ready":
                return str(cond["status"])
        return None

    # ---- state ------------------------------------------------------------------------------

    def _kube_state(self, kube: KubeSimulator) -> dict[str, Any]:
        counts: dict[str, dict[str, int]] = {}
        for (verb, status), count in sorted(kube.requests.counts().items()):
            counts.setdefault(verb, {})[str(status)] = count
        return {"url": kube.url, "down": kube.down, "requests": counts, "outages": kube.outages,
                "x509_failures": kube.x509_failures, "open_watches": kube.open_watches}

    def state(self) -> dict[str, Any]:
        managed = self._kube_state(self.kube)
        managed["client_cas"] = len(self.kube.client_auth.cas) if self.kube.client_auth else 0
        managed["node_readiness"] = self.follower.readiness
        managed["clients"] = self.clients.state()
        doc: dict[str, Any] = {
            "cluster": self.cluster_name, "namespace": self.namespace, "management_api": self.management_api,
            "kubeconfig": str(self.kubeconfig), "machines": {m.name: {"role": m.role, "address": m.address}
                                                             for m in self.machines},
            "talos": self.talos.state(), "kubernetes": {"managed": managed}}
        if self.management is not self.kube:
            doc["kubernetes"]["management"] = self._kube_state(self.management)
        return doc

    def summary(self) -> list[dict[str, Any]]:
        """What `ichord sim` prints: one JSON-ready line per thing to find."""
        lines: list[dict[str, Any]] = [{"kubernetes_api": self.kube.url, "role": "managed"}]
        if self.management is not self.kube:
            lines.append({"kubernetes_api": self.management.url, "role": "management"})
        lines.append({"kubeconfig": str(self.kubeconfig), "namespace": self.namespace, "cluster": self.cluster_name})
        lines += [{"node": m.name, "role": m.role, "endpoint": self.talos.nodes[m.name].endpoint}
                  for m in self.machines]
        if self.state_url is not None:
            lines.append({"state": self.state_url})
        return lines
