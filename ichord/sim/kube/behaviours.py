"""What a real cluster's own components do that the daemon depends on (simulators.md).

kube-controller-manager publishes ``kube-root-ca.crt`` (the issuing CA only) into every namespace
after its restart, with a lag, and the kubelet refreshes projected ``ca.crt`` files later still;
Deployments and DaemonSets roll their pods on a template change; Nodes go NotReady while their
kubelet restarts; kube-apiserver merges aggregator CAs into extension-apiserver-authentication.
Every delay is a setting so tests can scale it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ichord.pki.ca import CertificateAuthority
from ichord.sim.kube.events import Change
from ichord.sim.kube.resources import JSON, ResourceType
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


class ClusterBehaviours:
    def __init__(self, store: Store, settings: BehaviourSettings, ca: CertificateAuthority) -> None:
        self.store = store
        self.settings = settings
        self.issuing_ca_pem = ca.cert_pem
        self.projected_ca_pem = ca.cert_pem
        self.aggregator_cas: list[bytes] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._rollouts: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self._running = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._running:
            return
        self._running = True
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
        if pem not in self.aggregator_cas:
            self.aggregator_cas.append(pem)
        self._write_ext_auth(self.aggregator_cas)

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
        # Recreated with the current CA only: the merged history is gone with the deleted object.
        self.aggregator_cas = self.aggregator_cas[-1:]
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
        if rt.plural == "namespaces" and change.type == "ADDED":
            self._publish_root_ca(meta["name"])
        elif rt.plural == "configmaps" and change.type == "DELETED":
            if meta["name"] == ROOT_CA and meta.get("namespace") in self._namespaces():
                self._spawn(self._republish(meta["namespace"]))
            elif (meta.get("namespace"), meta["name"]) == EXT_AUTH:
                self._spawn(self._recreate_ext_auth())
        elif rt.plural in ("deployments", "daemonsets") and change.type != "DELETED":
            old_gen = (change.old or {}).get("metadata", {}).get("generation")
            if change.type == "ADDED" or old_gen != meta.get("generation"):
                key = (rt.plural, meta["namespace"], meta["name"])
                previous = self._rollouts.get(key)
                if previous is not None:
                    previous.cancel()
                self._rollouts[key] = self._spawn(self._rollout(rt, meta["namespace"], meta["name"]))

    async def _republish(self, namespace: str) -> None:
        await asyncio.sleep(0)
        self._publish_root_ca(namespace)

    # -- rollouts ----------------------------------------------------------------------------
    async def _rollout(self, rt: ResourceType, namespace: str, name: str) -> None:
        pods_rt = self._rt("", "pods")
        obj = self.store.get(rt, namespace, name)
        template = obj["spec"].get("template") or {}
        tpl_hash = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        daemon = rt.plural == "daemonsets"
        nodes = [n["metadata"]["name"] for n in self.store.list(self._rt("", "nodes"), None)[0]]
        targets: list[str | None] = list(nodes) if daemon else [None] * int(obj["spec"].get("replicas", 1))
        uid = obj["metadata"]["uid"]
        owned = [p for p in self.store.list(pods_rt, namespace)[0]
                 if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]
        old = [p for p in owned if (p["metadata"].get("labels") or {}).get("pod-template-hash") != tpl_hash]
        updated = len(owned) - len(old)
        self._rollout_status(rt, namespace, name, len(targets), updated, len(owned))
        for i, node in enumerate(targets[updated:]):
            await asyncio.sleep(self.settings.rollout_step)
            if old:
                victim = old.pop(0)
                with contextlib.suppress(ApiError):
                    self.store.delete(pods_rt, namespace, victim["metadata"]["name"])
            self._create_pod(obj, template, tpl_hash, node or (nodes[i % len(nodes)] if nodes else None))
            self._rollout_status(rt, namespace, name, len(targets), updated + i + 1, len(targets))
        for victim in old:
            with contextlib.suppress(ApiError):
                self.store.delete(pods_rt, namespace, victim["metadata"]["name"])
        self._rollout_status(rt, namespace, name, len(targets), len(targets), len(targets))

    def _create_pod(self, owner: JSON, template: JSON, tpl_hash: str, node: str | None) -> None:
        meta = copy.deepcopy(template.get("metadata") or {})
        labels = {**(meta.get("labels") or {}), "pod-template-hash": tpl_hash}
        name = owner["metadata"]["name"]
        pod = {
            "metadata": {"name": f"{name}-{tpl_hash[:5]}-{secrets.token_hex(3)[:5]}",
                         "namespace": owner["metadata"]["namespace"], "labels": labels,
                         "annotations": meta.get("annotations") or {},
                         "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                              "name": name, "uid": owner["metadata"]["uid"], "controller": True}]},
            "spec": {**copy.deepcopy(template.get("spec") or {}), **({"nodeName": node} if node else {})},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        self.store.create(self._rt("", "pods"), owner["metadata"]["namespace"], pod)

    def _rollout_status(self, rt: ResourceType, namespace: str, name: str, desired: int, updated: int,
                        ready: int) -> None:
        try:
            obj = self.store.get(rt, namespace, name)
        except ApiError:
            return
        gen = obj["metadata"].get("generation", 1)
        if rt.plural == "daemonsets":
            obj["status"] = {"observedGeneration": gen, "desiredNumberScheduled": desired,
                             "currentNumberScheduled": desired, "updatedNumberScheduled": updated,
                             "numberReady": ready, "numberAvailable": ready,
                             "numberUnavailable": max(0, desired - ready), "numberMisscheduled": 0}
        else:
            done = updated >= desired and ready >= desired
            obj["status"] = {"observedGeneration": gen, "replicas": desired, "updatedReplicas": updated,
                             "readyReplicas": ready, "availableReplicas": ready,
                             "unavailableReplicas": max(0, desired - ready),
                             "conditions": [{"type": "Available", "status": "True" if ready >= desired else "False",
                                             "reason": "MinimumReplicasAvailable"},
                                            {"type": "Progressing", "status": "True",
                                             "reason": "NewReplicaSetAvailable" if done else "ReplicaSetUpdated"}]}
        self.store.apply(rt, obj, subresource="status")
