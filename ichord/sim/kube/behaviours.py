"""What a real cluster's own components do that the daemon depends on (README.md, test tiers).

kube-controller-manager publishes ``kube-root-ca.crt`` (the issuing CA only) into every namespace
after its restart, with a lag, and the kubelet refreshes projected ``ca.crt`` files later still;
Deployments and DaemonSets roll their pods on a template change, one at a time, with pods that
start, lose Ready with their Node and, for the known in-cluster clients, keep the CA they started
with (clientpods.py); Nodes go NotReady while their kubelet restarts; kube-apiserver merges
aggregator CAs into extension-apiserver-authentication.
Every delay is a setting so tests can scale it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ichord.pki.ca import CertificateAuthority
from ichord.sim.kube.clientpods import PodModel, PodState
from ichord.sim.kube.events import Change
from ichord.sim.kube.podrules import CLIENT_NAMESPACE, CLIENTS, node_ready, template_hash
from ichord.sim.kube.resources import JSON, ResourceType
from ichord.sim.kube.scheduling import Replacer
from ichord.sim.kube.status import ApiError
from ichord.sim.kube.store import Store, rfc3339

ROOT_CA = "kube-root-ca.crt"
EXT_AUTH = ("kube-system", "extension-apiserver-authentication")


@dataclass
class BehaviourSettings:
    root_ca_publish_lag: float = 5.0
    projected_ca_lag: float = 60.0
    #: The file the kubelet refreshes (a pod's projected ca.crt); None keeps it in memory only.
    projected_ca_path: Path | None = None
    rollout_step: float = 1.0
    kubelet_restart: float = 10.0
    ext_auth_recreate_lag: float = 0.5
    #: A pod is Ready this long after it is scheduled on a Ready Node (0: at once, as before).
    pod_start_delay: float = 0.0
    #: client-go re-reads a refreshed projected ca.crt at most this often (kube-proxy's recovery).
    client_ca_reread: float = 300.0


class ClusterBehaviours:
    def __init__(self, store: Store, settings: BehaviourSettings, ca: CertificateAuthority) -> None:
        self.store = store
        self.settings = settings
        self.issuing_ca_pem = ca.cert_pem
        self.projected_ca_pem = ca.cert_pem
        self.aggregator_cas: list[bytes] = []
        self.current_aggregator_cas: list[bytes] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._rollouts: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self._running = False
        #: Pods of Deployments/DaemonSets and the in-cluster clients among them (clientpods.py).
        self.pods = PodModel(store, ca.cert_pem, start_delay=lambda: self.settings.pod_start_delay,
                             reread_after=lambda: self.settings.client_ca_reread)
        self.pods.replacer = Replacer(store, self.pods, lambda: self.settings.rollout_step)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._running:
            return
        self._running = True
        self.pods.active = True
        self.store.listeners.append(self._on_change)
        for ns in self._namespaces():
            self._publish_root_ca(ns)
        self._write_projected()

    async def stop(self) -> None:
        self._running = False
        if self._on_change in self.store.listeners:
            self.store.listeners.remove(self._on_change)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._rollouts.clear()
        self.pods.active = False

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _rt(self, group: str, plural: str) -> ResourceType:
        return self.store.resolve(group, "v1", plural)

    def _namespaces(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.store.list(self._rt("", "namespaces"), None)[0]]

    # -- CA publishing -----------------------------------------------------------------------
    def restart_controller_manager(self, issuing_ca_pem: bytes) -> None:
        """After the lag every namespace's kube-root-ca.crt holds ``issuing_ca_pem``; the projected later."""
        self.issuing_ca_pem = issuing_ca_pem
        self._spawn(self._publish_later(issuing_ca_pem))

    async def _publish_later(self, pem: bytes) -> None:
        await asyncio.sleep(self.settings.root_ca_publish_lag)
        for ns in self._namespaces():
            self._publish_root_ca(ns)
        await asyncio.sleep(self.settings.projected_ca_lag)
        self.projected_ca_pem = pem
        self._write_projected()

    def _publish_root_ca(self, namespace: str) -> None:
        cm = {"metadata": {"name": ROOT_CA, "namespace": namespace},
              "data": {"ca.crt": self.issuing_ca_pem.decode()}}
        with contextlib.suppress(ApiError):  # the namespace went away meanwhile
            self.store.apply(self._rt("", "configmaps"), cm)

    def _write_projected(self) -> None:
        path = self.settings.projected_ca_path
        if path is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(self.projected_ca_pem)
            tmp.replace(path)  # the kubelet swaps the file atomically (a symlink flip)

    # -- extension-apiserver-authentication ------------------------------------------------------
    def set_aggregator_ca(self, pem: bytes) -> None:
        """kube-apiserver started with ``pem`` as its front-proxy CA: merged in, never removed."""
        self.set_aggregator_cas([pem])

    def set_aggregator_cas(self, pems: list[bytes], current: list[bytes] | None = None) -> None:
        """kube-apiserver started accepting ``pems`` (its requestheader-client-ca-file): each merged in, none ever
        removed; a deleted ConfigMap is recreated with ``current`` alone (default ``pems``: what the API server
        that restarted last accepts; docs/decisions.md#aggregator-ca, as on hardware)."""
        self.current_aggregator_cas = list(pems if current is None else current)
        changed = False
        for pem in pems:
            if pem not in self.aggregator_cas:
                self.aggregator_cas.append(pem)
                changed = True
        if changed or not self._ext_auth_exists():
            self._write_ext_auth(self.aggregator_cas)

    def _ext_auth_exists(self) -> bool:
        try:
            self.store.get(self._rt("", "configmaps"), EXT_AUTH[0], EXT_AUTH[1])
        except ApiError:
            return False
        return True

    def _write_ext_auth(self, cas: list[bytes]) -> None:
        cm = {"metadata": {"name": EXT_AUTH[1], "namespace": EXT_AUTH[0]},
              "data": {"requestheader-client-ca-file": "".join(c.decode() for c in cas),
                       "client-ca-file": self.issuing_ca_pem.decode(),
                       "requestheader-allowed-names": '["front-proxy-client"]',
                       "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
                       "requestheader-group-headers": '["X-Remote-Group"]',
                       "requestheader-username-headers": '["X-Remote-User"]'}}
        self.store.apply(self._rt("", "configmaps"), cm)

    async def _recreate_ext_auth(self) -> None:
        await asyncio.sleep(self.settings.ext_auth_recreate_lag)
        if not self._ext_auth_exists():
            self._write_ext_auth(self.aggregator_cas)

    # -- nodes -------------------------------------------------------------------------------
    def restart_kubelet(self, node: str, duration: float | None = None) -> None:
        self._set_node_ready(node, False)
        self._spawn(self._node_back(node, self.settings.kubelet_restart if duration is None else duration))

    async def _node_back(self, node: str, after: float) -> None:
        await asyncio.sleep(after)
        self._set_node_ready(node, True)

    def _set_node_ready(self, node: str, ready: bool) -> None:
        rt = self._rt("", "nodes")
        obj = self.store.get(rt, None, node)
        status = obj.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"]
        now = rfc3339(self.store.clock())
        conds.append({"type": "Ready", "status": "True" if ready else "False",
                      "reason": "KubeletReady" if ready else "KubeletNotReady",
                      "message": "kubelet is posting ready status" if ready else "kubelet is restarting",
                      "lastHeartbeatTime": now, "lastTransitionTime": now})
        status["conditions"] = conds
        self.store.apply(rt, obj, subresource="status")

    # -- change hooks ------------------------------------------------------------------------
    def _on_change(self, change: Change, rt: ResourceType) -> None:
        if not self._running:
            return
        meta = change.new["metadata"]
        if rt.plural == "pods" and change.type == "DELETED":
            self.pods.on_pod_deleted(meta.get("namespace", ""), meta["name"])
        elif rt.plural in ("nodes", "configmaps") and self.pods.pods:
            self.pods.kick()  # Node readiness, taints and root CAs feed the pod model
        if rt.plural == "nodes" and change.type in ("ADDED", "DELETED"):
            # The DaemonSet controller follows the set of Nodes: a pod for a new one, none for a gone one.
            for plural, ns, name in sorted(self.pods.owners):
                if plural == "daemonsets":
                    self._start_rollout(self._rt("apps", "daemonsets"), ns, name)
        if rt.plural == "namespaces" and change.type == "ADDED":
            self._publish_root_ca(meta["name"])
        elif rt.plural == "configmaps" and change.type == "DELETED":
            if meta["name"] == ROOT_CA and meta.get("namespace") in self._namespaces():
                self._spawn(self._republish(meta["namespace"]))
            elif (meta.get("namespace"), meta["name"]) == EXT_AUTH:
                # The merged history is gone with the deleted object: from now on only what is accepted now.
                self.aggregator_cas = list(self.current_aggregator_cas) or self.aggregator_cas[-1:]
                self._spawn(self._recreate_ext_auth())
        elif rt.plural in ("deployments", "daemonsets") and change.type != "DELETED":
            old_gen = (change.old or {}).get("metadata", {}).get("generation")
            if change.type == "ADDED" or old_gen != meta.get("generation"):
                self._start_rollout(rt, meta["namespace"], meta["name"])

    def _start_rollout(self, rt: ResourceType, namespace: str, name: str) -> None:
        key = (rt.plural, namespace, name)
        previous = self._rollouts.get(key)
        if previous is not None:
            previous.cancel()
        self._rollouts[key] = self._spawn(self._rollout(rt, namespace, name))

    async def _republish(self, namespace: str) -> None:
        await asyncio.sleep(0)
        self._publish_root_ca(namespace)

    # -- rollouts ----------------------------------------------------------------------------
    def serving_ca_changed(self, pem: bytes) -> None:
        """The API server now serves from ``pem``: clients that do not hold it start failing x509."""
        self.pods.serving_ca_changed(pem)

    async def _rollout(self, rt: ResourceType, namespace: str, name: str) -> None:
        """Replace the pods of an old template one at a time (maxUnavailable 1, no surge), each new one Ready first."""
        try:
            obj = self.store.get(rt, namespace, name)
        except ApiError:
            return  # deleted meanwhile
        template = obj["spec"].get("template") or {}
        tpl_hash = template_hash(template)
        owner = (rt.plural, namespace, name)
        self.pods.owners.add(owner)
        owned = self.pods.owned(obj["metadata"]["uid"])
        old = [p for p in owned if p.template_hash != tpl_hash]
        if old and (rt.plural, name) in CLIENTS and namespace == CLIENT_NAMESPACE:
            self._record_client_restart(rt.plural, name)
        self.pods.kick()
        if rt.plural == "daemonsets":
            await self._roll_daemonset(obj, template, tpl_hash, owned)
        else:
            await self._roll_deployment(obj, template, tpl_hash, owned)
        self.pods.kick()

    async def _roll_daemonset(self, obj: JSON, template: JSON, tpl_hash: str, owned: list[PodState]) -> None:
        nodes = sorted(n["metadata"]["name"] for n in self.store.list(self._rt("", "nodes"), None)[0])
        for node in nodes:
            on_node = [p for p in owned if p.node == node]
            if any(p.template_hash == tpl_hash for p in on_node):
                continue
            await asyncio.sleep(self.settings.rollout_step)
            for p in on_node:
                self.pods.delete_pod(p)
            new = self.pods.create_pod(obj, "daemonsets", template, tpl_hash, node)
            if on_node:
                await self.pods.wait_ready(new)
        for p in owned:
            if p.node not in nodes:
                self.pods.delete_pod(p)

    async def _roll_deployment(self, obj: JSON, template: JSON, tpl_hash: str, owned: list[PodState]) -> None:
        replicas = int(obj["spec"].get("replicas", 1))
        old = [p for p in owned if p.template_hash != tpl_hash]
        current = [p for p in owned if p.template_hash == tpl_hash]
        missing = replicas - len(owned)
        if missing > 0:
            await asyncio.sleep(self.settings.rollout_step)
            for _ in range(missing):
                current.append(self.pods.create_pod(obj, "deployments", template, tpl_hash, None))
        while old:
            await asyncio.sleep(self.settings.rollout_step)
            victim = max(old, key=lambda p: p.seq)  # the ReplicaSet scales down its newest pod first
            old.remove(victim)
            self.pods.delete_pod(victim)
            if len(current) < replicas:
                new = self.pods.create_pod(obj, "deployments", template, tpl_hash, None)
                current.append(new)
                await self.pods.wait_ready(new)
        for extra in sorted(current, key=lambda p: p.seq)[replicas:]:
            self.pods.delete_pod(extra)

    def _record_client_restart(self, plural: str, name: str) -> None:
        nodes = self.store.list(self._rt("", "nodes"), None)[0]
        self.pods.record("client_restart", workload=f"{plural}/{name}",
                         nodes_not_ready=sorted(n["metadata"]["name"] for n in nodes if not node_ready(n)),
                         kubelet_restart_pending=sorted(self.pods.pending_kubelet_restarts()),
                         dns_ok=self.pods.dns_ok())
