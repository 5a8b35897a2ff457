"""The pods of Deployments and DaemonSets, and the in-cluster API clients among them
(docs/decisions.md#client-restarts).

What real hardware showed, modelled so a test can reproduce it and show ichord prevents it:
- A pod starts ``pod_start_delay`` after it is scheduled on a Ready Node and loses Ready while its
  Node is not Ready (a kubelet restart). Deployment pods are scheduled on a Node whose NoSchedule
  taints they tolerate (fewest pods of the same owner first), else they stay Pending unscheduled
  and are retried; DaemonSet pods go to every Node (the cluster agents tolerate every taint).
- The known clients (``CLIENTS``) keep the Kubernetes CA(s) their projected ``ca.crt`` held when
  they were created (their namespace's ``kube-root-ca.crt``). While the API server serves from a CA
  a pod does not hold, the pod is x509-failing (recorded). flannel, kube-proxy and CoreDNS stay
  Running and Ready (CoreDNS cannot resolve new Services); cilium's agent and operator go NotReady
  and an agent that is not Ready taints its Node ``node.cilium.io/agent-not-ready:NoSchedule``.
  kube-proxy re-reads the refreshed file after ``client_ca_reread`` (client-go's 5-minute reload).
- A CoreDNS pod answers while it is Ready and the CNI and kube-proxy pods on its Node are present and
  Ready; DNS is up (``dns_ok``) while one answers, and resolves new Services (``resolves_new_services``)
  while one of those is not x509-failing. Every outage after DNS first came up is recorded.
- Rollouts (behaviours.py) replace one pod at a time, deleting an old pod (a Deployment its newest,
  a DaemonSet Node by Node in name order) and waiting for the new one to be Ready (maxUnavailable 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ichord.jsoncopy import copy_json
from ichord.sim.kube.podrules import (
    CILIUM_TAINT,
    CLIENT_NAMESPACE,
    CLIENTS,
    ROOT_CA,
    ClientKind,
    Recorder,
    node_ready,
    pem_blocks,
    template_hash,
    tolerates,
)
from ichord.sim.kube.resources import JSON, ResourceType
from ichord.sim.kube.scheduling import schedulable
from ichord.sim.kube.status import ApiError
from ichord.sim.kube.store import Store


@dataclass
class PodState:
    namespace: str
    name: str
    owner: tuple[str, str, str]  # (plural, namespace, name)
    owner_uid: str
    template_hash: str
    tolerations: list[JSON]
    node: str | None
    held: frozenset[bytes]
    seq: int
    kind: ClientKind | None
    runnable_since: float | None = None
    ready: bool = False
    phase: str = "Pending"
    x509_since: float | None = None  # loop time
    x509_at: float | None = None  # model time, for inspection
    reread_at: float | None = None
    ready_event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodModel:
    def __init__(self, store: Store, serving_ca_pem: bytes, *, start_delay: Callable[[], float],
                 reread_after: Callable[[], float]) -> None:
        self.store = store
        self.serving_ca_pem = serving_ca_pem
        self._start_delay = start_delay
        self._reread_after = reread_after
        self.pods: dict[tuple[str, str], PodState] = {}
        self.owners: set[tuple[str, str, str]] = set()
        #: Everything this model recorded: {"at", "kind", ...}.
        self.events: list[dict[str, Any]] = []
        self.dns_outages: list[dict[str, float | None]] = []
        self.record_hook: Recorder | None = None
        #: Told of a pod deleted by anyone but this model (an eviction): the ReplicaSet's replacement (scheduling.py).
        self.replacer: Callable[[PodState], None] | None = None
        #: Nodes whose kubelet restart is already decided but not begun (the combined environment sets it).
        self.pending_kubelet_restarts: Callable[[], list[str]] = list
        self._dns_up: bool | None = None
        self._seq = 0
        self._t0 = time.monotonic()
        self._kicked = False
        self._timer: asyncio.TimerHandle | None = None
        self._active = True  # off while the simulator is stopped: nothing is re-evaluated

    # ---- recording ----------------------------------------------------------------------------
    def now(self) -> float:
        return round(time.monotonic() - self._t0, 6)

    def record(self, kind: str, **data: Any) -> None:
        self.events.append({"at": self.now(), "kind": kind, **data})
        if self.record_hook is not None:
            self.record_hook(kind, data)

    def _rt(self, group: str, plural: str) -> ResourceType:
        return self.store.resolve(group, "v1", plural)

    # ---- pods -------------------------------------------------------------------------------
    def owned(self, uid: str) -> list[PodState]:
        return sorted((p for p in self.pods.values() if p.owner_uid == uid), key=lambda p: p.seq)

    def create_pod(self, owner: JSON, plural: str, template: JSON, tpl_hash: str, node: str | None) -> PodState:
        meta = owner["metadata"]
        ns, name = meta["namespace"], meta["name"]
        spec = template.get("spec") or {}
        tolerations = list(spec.get("tolerations") or [])
        if node is None and plural == "deployments":
            node = self._pick_node(meta["uid"], tolerations)
        self._seq += 1
        pod_name = f"{name}-{tpl_hash[:5]}-{self._seq:05d}"
        tpl_meta = template.get("metadata") or {}
        pod = {
            "metadata": {"name": pod_name, "namespace": ns,
                         "labels": {**(tpl_meta.get("labels") or {}), "pod-template-hash": tpl_hash},
                         "annotations": dict(tpl_meta.get("annotations") or {}),
                         "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": name,
                                              "uid": meta["uid"], "controller": True}]},
            "spec": {**json.loads(json.dumps(spec)), **({"nodeName": node} if node else {})},
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]},
        }
        kind = CLIENTS.get((plural, name)) if ns == CLIENT_NAMESPACE else None
        state = PodState(ns, pod_name, (plural, ns, name), meta["uid"], tpl_hash, tolerations, node,
                         self._root_ca(ns), self._seq, kind)
        self.pods[(ns, pod_name)] = state
        self.store.create(self._rt("", "pods"), ns, pod)
        self.kick()
        return state

    def delete_pod(self, state: PodState) -> None:
        self._forget(state)
        with contextlib.suppress(ApiError):
            self.store.delete(self._rt("", "pods"), state.namespace, state.name)
        self.kick()

    def _forget(self, state: PodState) -> None:
        if self.pods.pop((state.namespace, state.name), None) is None:
            return
        if state.x509_since is not None:
            self.record("client_x509_ended", pod=state.ref, on_node=state.node, why="pod deleted")
        state.ready_event.set()  # a rollout waiting on it moves on

    async def wait_ready(self, state: PodState) -> None:
        await state.ready_event.wait()

    def _root_ca(self, namespace: str) -> frozenset[bytes]:
        try:
            cm = self.store.get(self._rt("", "configmaps"), namespace, ROOT_CA)
        except ApiError:
            return frozenset()
        return pem_blocks((cm.get("data") or {}).get("ca.crt") or "")

    def _nodes(self) -> dict[str, JSON]:
        return {n["metadata"]["name"]: n for n in self.store.peek(self._rt("", "nodes"), None)}

    def _pick_node(self, owner_uid: str, tolerations: list[JSON],
                   nodes: dict[str, JSON] | None = None) -> str | None:
        nodes = self._nodes() if nodes is None else nodes
        fits = [name for name, n in nodes.items() if schedulable(n)
                and all(tolerates(tolerations, t) for t in (n.get("spec") or {}).get("taints") or []
                       if t.get("effect") in ("NoSchedule", "NoExecute"))]
        if not fits:
            return None
        load = {name: sum(1 for p in self.pods.values() if p.owner_uid == owner_uid and p.node == name)
                for name in fits}
        return min(fits, key=lambda name: (load[name], name))

    def on_pod_deleted(self, namespace: str, name: str) -> None:
        state = self.pods.get((namespace, name))
        if state is not None:
            self._forget(state)
            self.kick()
            if self.replacer is not None:
                self.replacer(state)

    # ---- the model's pass ---------------------------------------------------------------------
    def kick(self) -> None:
        """Re-evaluate soon (never inside the store write that triggered it)."""
        if not self._kicked and self.active:
            self._kicked = True
            asyncio.get_running_loop().call_soon(self.sync)

    def serving_ca_changed(self, pem: bytes) -> None:
        self.serving_ca_pem = pem
        self.kick()

    @property
    def active(self) -> bool:
        return self._active

    @active.setter
    def active(self, on: bool) -> None:
        self._active = on
        if not on and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sync(self) -> None:
        self._kicked = False
        if not self._active:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        nodes = self._nodes()
        serving = next(iter(pem_blocks(self.serving_ca_pem)), b"")
        wake = math.inf
        for p in list(self.pods.values()):
            if p.node is None and nodes:
                p.node = self._pick_node(p.owner_uid, p.tolerations, nodes)
                if p.node is not None:
                    self._write_pod(p, node=p.node)
            wake = min(wake, self._x509(p, serving, now))
            wake = min(wake, self._readiness(p, nodes, now))
        if self._taints(nodes):
            self.kick()  # a taint lifted: Pending pods may fit now
        for owner in list(self.owners):
            self._owner_status(owner, nodes)
        self._dns()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if wake < math.inf:
            self._timer = loop.call_at(wake, self.kick)

    def _x509(self, p: PodState, serving: bytes, now: float) -> float:
        if p.kind is None:
            return math.inf
        failing = serving not in p.held
        if failing and p.reread_at is not None and now >= p.reread_at:
            root = self._root_ca(p.namespace)
            if serving in root:
                p.held, failing = root, False
            else:
                p.reread_at = now + self._reread_after()  # client-go tries again on a later request
        if failing and p.x509_since is None:
            p.x509_since, p.x509_at = now, self.now()
            p.reread_at = now + self._reread_after() if p.kind.rereads_ca else None
            self.record("client_x509_failing", pod=p.ref, workload=f"{p.owner[0]}/{p.owner[2]}", on_node=p.node,
                        error="x509: certificate signed by unknown authority")
        elif not failing and p.x509_since is not None:
            p.x509_since = p.x509_at = p.reread_at = None
            self.record("client_x509_ended", pod=p.ref, on_node=p.node, why="re-read the refreshed ca.crt")
        return p.reread_at if failing and p.reread_at is not None else math.inf

    def _readiness(self, p: PodState, nodes: dict[str, JSON], now: float) -> float:
        node = nodes.get(p.node) if p.node is not None else None
        # A simulator without Nodes runs pods nowhere, as before the pod model existed.
        runnable = (node is not None and node_ready(node)) or (p.node is None and not nodes)
        if not runnable:
            p.runnable_since = None
        elif p.runnable_since is None:
            p.runnable_since = now
        wake = math.inf
        started = False
        if p.runnable_since is not None:
            due = p.runnable_since + self._start_delay()
            started = now >= due
            if not started:
                wake = due
        ready = started and not (p.kind is not None and p.kind.x509_not_ready and p.x509_since is not None)
        phase = "Running" if started or p.phase == "Running" else "Pending"
        if (phase, ready) != (p.phase, p.ready):
            p.phase, p.ready = phase, ready
            self._write_pod(p, phase=phase, ready=ready)
        if ready:
            p.ready_event.set()
        else:
            p.ready_event.clear()
        return wake

    def _write_pod(self, p: PodState, *, node: str | None = None, phase: str | None = None,
                   ready: bool | None = None) -> None:
        rt = self._rt("", "pods")
        obj = self.store.peek_object(rt, p.namespace, p.name)  # read only: the store copies what it is given
        if obj is None:
            return
        if node is not None:
            obj = self.store.apply(rt, {**obj, "spec": {**obj["spec"], "nodeName": node}})
        if phase is not None:
            status = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
            self.store.apply(rt, {**obj, "status": status}, subresource="status")

    def _taints(self, nodes: dict[str, JSON]) -> bool:
        """cilium: a Node whose agent is not Ready gets the agent-not-ready taint, a Ready agent lifts it."""
        lifted = False
        by_node: dict[str, list[PodState]] = {}  # one pass over the pods, not one per Node
        for p in self.pods.values():
            if p.kind is not None and p.kind.taints_node and p.node is not None:
                by_node.setdefault(p.node, []).append(p)
        for name, node in nodes.items():
            agents = by_node.get(name, [])
            if not agents:
                continue  # no agent (being replaced): the taint stays as it is
            taints = list((node.get("spec") or {}).get("taints") or [])
            has = any(t.get("key") == CILIUM_TAINT["key"] for t in taints)
            want = not any(a.ready for a in agents)
            if want == has:
                continue
            if want:
                taints.append(dict(CILIUM_TAINT))
            else:
                taints = [t for t in taints if t.get("key") != CILIUM_TAINT["key"]]
                lifted = True
            changed = copy_json(node)  # the store's own object (Store.peek): written only through the store
            changed.setdefault("spec", {})["taints"] = taints
            with contextlib.suppress(ApiError):
                self.store.apply(self._rt("", "nodes"), changed)
            self.record("node_taint", on_node=name, taint=CILIUM_TAINT["key"], present=want)
        return lifted

    def _owner_status(self, owner: tuple[str, str, str], nodes: dict[str, JSON]) -> None:
        plural, ns, name = owner
        rt = self._rt("apps", plural)
        obj = self.store.peek_object(rt, ns, name)  # read only; copied below when its status changes
        if obj is None:
            self.owners.discard(owner)
            return
        current = template_hash(obj["spec"].get("template") or {})
        pods = self.owned(obj["metadata"]["uid"])
        updated = sum(1 for p in pods if p.template_hash == current)
        ready = sum(1 for p in pods if p.ready)
        gen = obj["metadata"].get("generation", 1)
        if plural == "daemonsets":
            desired = len(nodes) if nodes else len(pods)
            status: JSON = {"observedGeneration": gen, "desiredNumberScheduled": desired,
                            "currentNumberScheduled": len(pods), "updatedNumberScheduled": updated,
                            "numberReady": ready, "numberAvailable": ready,
                            "numberUnavailable": max(0, desired - ready), "numberMisscheduled": 0}
        else:
            desired = int(obj["spec"].get("replicas", 1))
            done = updated >= desired and ready >= desired
            status = {"observedGeneration": gen, "replicas": len(pods), "updatedReplicas": updated,
                      "readyReplicas": ready, "availableReplicas": ready,
                      "unavailableReplicas": max(0, desired - ready),
                      "conditions": [{"type": "Available", "status": "True" if ready >= desired else "False",
                                      "reason": "MinimumReplicasAvailable"},
                                     {"type": "Progressing", "status": "True",
                                      "reason": "NewReplicaSetAvailable" if done else "ReplicaSetUpdated"}]}
        if obj.get("status") != status:
            # The store copies what it is given: its own object is never changed here.
            self.store.apply(rt, {**obj, "status": status}, subresource="status")

    # ---- DNS ----------------------------------------------------------------------------------
    def _on_node(self, role: str, node: str | None) -> list[PodState]:
        return [p for p in self.pods.values() if p.kind is not None and p.kind.role == role and p.node == node]

    def _role_present(self, role: str) -> bool:
        return any(kind.role == role and (CLIENT_NAMESPACE, name) in self._owner_names()
                   for (_, name), kind in CLIENTS.items())

    def _owner_names(self) -> set[tuple[str, str]]:
        return {(ns, name) for _, ns, name in self.owners}

    def serving_dns_pods(self) -> list[PodState]:
        """CoreDNS pods that answer: Ready, with the CNI and kube-proxy pods on their Node present and Ready."""
        needs = [role for role in ("cni", "proxy") if self._role_present(role)]
        return [p for p in self.pods.values()
                if p.kind is not None and p.kind.role == "dns" and p.ready
                and all(any(q.ready for q in self._on_node(role, p.node)) for role in needs)]

    def dns_ok(self) -> bool:
        """Some CoreDNS pod answers (existing names resolve)."""
        return bool(self.serving_dns_pods())

    def resolves_new_services(self) -> bool:
        """Some answering CoreDNS pod also watches the API: one x509-failing cannot learn new Services."""
        return any(p.x509_since is None for p in self.serving_dns_pods())

    def _dns(self) -> None:
        if not self._role_present("dns"):
            return
        up = self.dns_ok()
        if up == self._dns_up or (self._dns_up is None and not up):
            return  # unchanged, or not up yet since the cluster started (no outage)
        self._dns_up = up
        if not up:
            self.dns_outages.append({"start": self.now(), "end": None})
            self.record("dns_outage_start")
        elif self.dns_outages and self.dns_outages[-1]["end"] is None:
            self.dns_outages[-1]["end"] = self.now()
            self.record("dns_outage_end")

    # ---- inspection ---------------------------------------------------------------------------
    def x509_failing(self) -> list[dict[str, Any]]:
        return [{"pod": p.ref, "workload": f"{p.owner[0]}/{p.owner[2]}", "node": p.node, "since": p.x509_at}
                for p in sorted(self.pods.values(), key=lambda p: p.seq) if p.x509_since is not None]

    def state(self) -> dict[str, Any]:
        return {"x509_failing": self.x509_failing(), "dns_ok": self.dns_ok(),
                "resolves_new_services": self.resolves_new_services(), "dns_outages": list(self.dns_outages),
                "pods": [{"pod": p.ref, "node": p.node, "ready": p.ready, "phase": p.phase}
                         for p in sorted(self.pods.values(), key=lambda p: p.seq)],
                "events": list(self.events)}
