"""The managed API server following the simulated machines, as a real self-hosted cluster does.

Nodes: one per machine, Ready while its Talos node is up and its kubelet runs; a kubelet restart
(Kubernetes CA change, ServiceRestart) makes it NotReady (False) until the kubelet is back; a
reboot or an unreachable node makes it Unknown (the node-lifecycle controller's NodeStatusUnknown)
until it answers again. Real clusters wait out a grace period first; the simulation flips at once.

CAs: each control plane's kube-apiserver loads its CAs when it (re)starts. The simulated API server
is all of them behind one endpoint: it accepts a client certificate only if every running control
plane's API server would (a request may reach any of them), and serves with the issuing CA of the
API server that restarted last. While no control plane runs a ready API server (a lone control
plane rebooting or restarting kube-apiserver, or none whose own etcd member is healthy and trusts it
each way) the endpoint is down: connections are refused. A
change of serving CA restarts the simulated server (watches drop), re-publishes kube-root-ca.crt
like kube-controller-manager after its restart, and merges every aggregator CA a running API server accepts
into extension-apiserver-authentication (recreated with the latest API server's list when deleted).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ichord.pki.ca import CertificateAuthority
from ichord.sim.kube.scheduling import ensure_mirror_pods
from ichord.sim.kube.server import KubeSimulator
from ichord.sim.kube.status import ApiError
from ichord.sim.kube.store import rfc3339
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.config_view import CAView
from ichord.sim.talos.node import SimNode

#: History kinds after which a control plane's API server runs with the node's current configuration.
APISERVER_STARTS = ("boot", "apiserver_restart")


@dataclass(frozen=True)
class APIServerCAs:
    """What one control plane's kube-apiserver loaded when it last started."""

    seq: int
    issuing: CAView | None
    accepted: tuple[bytes, ...]
    aggregator: CAView | None
    #: Its requestheader-client-ca-file: the issuing aggregator CA and the accepted ones (Talos adds the issuing).
    aggregator_trusted: tuple[bytes, ...] = ()


class Follower:
    def __init__(self, talos: SimCluster, kube: KubeSimulator) -> None:
        self.talos = talos
        self.kube = kube
        self.apiservers: dict[str, APIServerCAs] = {}
        #: Node readiness transitions: {"at", "wall", "node", "status", "reason"}.
        self.readiness: list[dict[str, Any]] = []
        self._ready: dict[str, str] = {}
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # ---- wiring -----------------------------------------------------------------------------

    def attach(self) -> None:
        """Listen to the Talos history (before the nodes boot, so their first boot is seen)."""
        self.talos.history.listeners.append(self.on_event)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-env-ca-follow")

    async def stop(self) -> None:
        if self.on_event in self.talos.history.listeners:
            self.talos.history.listeners.remove(self.on_event)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def on_event(self, event: dict[str, Any]) -> None:
        if event["kind"].startswith("etcd_"):
            self._dirty.set()  # kube-apiserver needs its etcd member: health and quorum change who serves
        node = self.talos.nodes.get(event.get("node") or "")
        if node is None:
            return
        if event["kind"] in APISERVER_STARTS and node.is_control_plane:
            v = node.view
            trusted = [v.aggregator_issuing.signer_pem] if v.aggregator_issuing else []
            trusted += [c for c in v.aggregator_accepted if c not in trusted]
            self.apiservers[node.name] = APIServerCAs(event["seq"], v.k8s_issuing, v.k8s_accepted,
                                                      v.aggregator_issuing, tuple(trusted))
            self._dirty.set()
        elif event["kind"] in ("down", "up", "apiserver_ready", "shutting_down"):
            self._dirty.set()  # the set of running API servers changed
        self.update_node(node)

    async def _loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self.sync()

    # ---- Nodes ------------------------------------------------------------------------------

    def node_condition(self, node: SimNode) -> tuple[str, str, str]:
        """(status, reason, message) of the Node's Ready condition now."""
        if not node.up:
            why = "rebooting" if node.stage == "MACHINE_STAGE_REBOOTING" else "unreachable"
            return "Unknown", "NodeStatusUnknown", f"Kubelet stopped posting node status (node {why})."
        kubelet = node.services.get("kubelet")
        if kubelet is None or not kubelet.healthy:
            return "False", "KubeletNotReady", "kubelet is restarting"
        return "True", "KubeletReady", "kubelet is posting ready status"

    def update_node(self, node: SimNode) -> None:
        status, reason, message = self.node_condition(node)
        if self._ready.get(node.nodename) == status:
            return
        rt = self.kube.store.resolve("", "v1", "nodes")
        try:
            obj = self.kube.store.get(rt, None, node.nodename)
        except ApiError:
            return  # not registered yet
        now = rfc3339(self.kube.store.clock())
        conds = [c for c in obj["status"].get("conditions") or [] if c.get("type") != "Ready"]
        conds.append({"type": "Ready", "status": status, "reason": reason, "message": message,
                      "lastHeartbeatTime": now, "lastTransitionTime": now})
        obj["status"]["conditions"] = conds
        obj["status"].setdefault("nodeInfo", {})["bootID"] = node.boot_id
        self.kube.store.apply(rt, obj, subresource="status")
        self._ready[node.nodename] = status
        if node.is_control_plane and status == "True":
            ensure_mirror_pods(self.kube.store, node.nodename)  # the kubelet mirrors its static pods
        history = self.talos.history
        self.readiness.append({"at": history.events[-1]["at"] if history.events else 0.0,
                               "node": node.nodename, "status": status, "reason": reason})

    # ---- CAs --------------------------------------------------------------------------------

    def running_apiservers(self) -> list[APIServerCAs]:
        return [cas for name, cas in self.apiservers.items()
                if (node := self.talos.nodes.get(name)) is not None and node.up]

    def serving(self) -> bool:
        """True while at least one control plane runs a ready kube-apiserver."""
        return any(n.apiserver_serving for n in self.talos.nodes.values())

    async def _follow_availability(self) -> None:
        # With every control plane down or restarting its API server, the endpoint refuses connections.
        if not self.serving() and not self.kube.down:
            await self.kube.go_down()
        elif self.serving() and self.kube.down:
            await self.kube.come_up()

    def client_cas(self) -> tuple[bytes, ...]:
        """CAs every running control plane's API server accepts client certificates from."""
        running = self.running_apiservers()
        if not running:
            return self.kube.client_auth.cas if self.kube.client_auth else ()
        common = [c for c in running[0].accepted if all(c in other.accepted for other in running[1:])]
        return tuple(common)

    async def sync(self) -> None:
        """Bring the API server's client CAs and serving CA in line with the control planes."""
        async with self._lock:
            await self._follow_availability()
            running = self.running_apiservers()
            if not running:
                return
            if self.kube.client_auth is not None:
                self.kube.set_client_cas(self.client_cas())
            latest = max(running, key=lambda cas: cas.seq)
            issuing = latest.issuing
            if issuing is not None and issuing.key_pem is not None and issuing.signer_pem != self.kube.ca.cert_pem:
                await self.kube.switch_serving_ca(CertificateAuthority(issuing.signer_pem, issuing.key_pem))
                self.kube.behaviours.restart_controller_manager(issuing.signer_pem)
            # kube-apiserver publishes its accepted front-proxy CAs, merged, never removing one.
            published = [pem for cas in sorted(running, key=lambda c: c.seq) for pem in cas.aggregator_trusted]
            if published:
                latest_trusted = list(latest.aggregator_trusted) or published[-1:]
                merged = list(dict.fromkeys(published))
                self.kube.behaviours.set_aggregator_cas(merged, current=latest_trusted)
