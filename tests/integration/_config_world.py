"""A simulated cluster driven by the real cluster actor step and the real registry, for the config rollout tests.

Also the invariants read from the simulators' history (docs/decisions.md#config-rollout's "done when"): per-node
reboots, how many machines were down at once per role, and the PodDisruptionBudget's healthy count at every pod change.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from ichord.actors.cluster import ClusterReconciler
from ichord.actors.standalone import standalone_actor
from ichord.api import names
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.operations.outcome import Outcome, next_delay
from ichord.operations.scope import Clock, utcnow
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube.eviction import pod_ready, selector_matches
from ichord.watchers.informer import Informer, Resource

Obj = dict[str, Any]
REBOOT_PATCH = "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: br_netfilter\n"
API_SERVER_PATCH = "cluster:\n  apiServer:\n    extraArgs:\n      audit-log-maxage: \"7\"\n"
APP_NS = "app"
APP_LABELS = {"app": "web"}


def _resource(kind: str) -> Resource:
    return Resource(names.GROUP, names.VERSION, names.PLURALS[kind])


@dataclass
class PdbWatch:
    """The healthy pods of the app at every pod change (the simulator's store, not a poll)."""

    lowest: int | None = None
    samples: int = 0
    evictions_refused: int = 0

    def sample(self, env: SimEnvironment) -> None:
        store = env.kube.store
        pods = store.list(store.resolve("", "v1", "pods"), APP_NS)[0]
        selector = {"matchLabels": APP_LABELS}
        healthy = sum(1 for p in pods if selector_matches(selector, p["metadata"].get("labels") or {}) and pod_ready(p))
        self.samples += 1
        self.lowest = healthy if self.lowest is None else min(self.lowest, healthy)


@dataclass
class World:
    env: SimEnvironment
    kube: KubeClient
    reconciler: ClusterReconciler
    timing: Timing
    pdb: PdbWatch = field(default_factory=PdbWatch)

    async def step(self) -> Outcome:
        return await self.reconciler.step({})

    async def op(self, name: str) -> Obj:
        return await crds.operations(self.kube).get(self.env.namespace, name)

    async def machines(self) -> list[Obj]:
        objs, _ = await crds.machines(self.kube).list_objects(self.env.namespace)
        return objs

    async def run_until(self, done: Callable[[], Awaitable[bool]], *, steps: int = 2000, what: str = "") -> None:
        for _ in range(steps):
            outcome = await self.step()
            if await done():
                return
            await anyio.sleep(min(max(next_delay(outcome) or 0.01, 0.005), 0.1))
        raise AssertionError(f"not there in {steps} steps: {what}")

    async def patch_cluster(self, patches: list[str]) -> None:
        await crds.clusters(self.kube).patch(self.env.namespace, self.env.cluster_name, {"spec": {"patches": patches}})

    async def deploy_app(self, replicas: int, min_available: int) -> None:
        kc = self.kube
        await kc.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": APP_NS}})
        await kc.raw("POST", f"/apis/apps/v1/namespaces/{APP_NS}/deployments", body={
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": APP_NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": APP_LABELS},
                     "template": {"metadata": {"labels": APP_LABELS},
                                  "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}})
        await kc.raw("POST", f"/apis/policy/v1/namespaces/{APP_NS}/poddisruptionbudgets", body={
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": APP_NS},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": APP_LABELS}}})
        env = self.env

        async def available() -> bool:
            return env.workload_available("deployments", "web", APP_NS)

        await self.run_until(available, what="the app's pods Ready")

        def listener(change: Any, rt: Any) -> None:
            if rt.plural == "pods" and (change.new.get("metadata") or {}).get("namespace") == APP_NS:
                self.pdb.sample(env)

        self.pdb.sample(env)  # from here on the budget must hold
        env.kube.store.listeners.append(listener)


def reboots(env: SimEnvironment, since: int = 0) -> dict[str, int]:
    counts = {m: 0 for m in env.machine_names}
    for e in env.talos.history.events[since:]:
        if e["kind"] == "reboot":
            counts[e["node"]] += 1
    return counts


def most_down_at_once(env: SimEnvironment, role_prefix: str, since: int = 0) -> int:
    """The most machines whose names start with ``role_prefix`` that were down (Talos not answering) together."""
    down: set[str] = set()
    most = 0
    for e in env.talos.history.events[since:]:
        node = e.get("node") or ""
        if not node.startswith(role_prefix):
            continue
        if e["kind"] == "down":
            down.add(node)
        elif e["kind"] in ("up", "boot"):
            down.discard(node)
        most = max(most, len(down))
    return most


async def world_on(env: SimEnvironment, timing: Timing, clock: Clock | None = None) -> AsyncIterator[World]:
    """``clock``: the steps' clock (the wall clock when None; a faster one runs maintenance windows in seconds)."""
    async with await from_kubeconfig(env.kubeconfig, timing=timing) as kube, \
            standalone_actor(kube, env.namespace, env.cluster_name, timing, instance="test",
                             clock=clock or utcnow) as reconciler:
        yield World(env, kube, reconciler, timing)


async def cached(informer: Informer, key: tuple[str, str], holds: Callable[[Obj], bool] = lambda _obj: True) -> None:
    """Until the informer's copy of ``key`` exists and ``holds``, at most 10 s (a step reads the cache: in the daemon,
    the event that brings the change is what wakes the actor)."""
    def there() -> bool:
        return key in informer.cache and holds(informer.cache[key])

    with anyio.fail_after(10):
        while not there():
            seen = anyio.Event()
            informer.add_handler(lambda _e, seen=seen: seen.set())  # type: ignore[misc]
            try:
                if not there():
                    await seen.wait()
            finally:
                informer.handlers.pop()
