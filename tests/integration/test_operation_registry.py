"""Issue 13: a new operation kind is a plain addition. A toy kind, defined and registered here, is driven by the
real cluster actor step (ichord/actors, unchanged) through the backbone (unchanged): plan only while paused,
the lock, pause and resume while running, a two-node reboot roll on a simulated 3+1 cluster, and completion.

The CRD admits the kinds ca-rotation and config; the toy registers under ``config`` in this test's own registry
(ichord's default registry runs the real one, ichord/operations/config, tested in test_config_rollout.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from ichord.actors.cluster import ClusterReconciler
from ichord.actors.standalone import standalone_actor
from ichord.api import names, operation_kinds
from ichord.api.conditions import find
from ichord.api.views import OperationView
from ichord.contract import V1_14
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.events import EventRecorder
from ichord.kube.leases import get_lease
from ichord.operations import backbone
from ichord.operations.backbone import OperationKind
from ichord.operations.lock import lock_name
from ichord.operations.outcome import Blocked, Done, Outcome, Requeue, next_delay
from ichord.operations.registry import Operation, Registry
from ichord.operations.roll import KubeNodes, RollTarget, TalosNodes, advance_roll
from ichord.operations.roll_store import MarkerFields, StatusMarkerStore
from ichord.operations.scope import ClusterScope
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.watchers.informer import Informer, Resource
from tests.integration._subject import OperationSubject

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
#: The toy's own description (api/operation_kinds.py's fields): what the backbone reads of it.
#: The served CRD admits only ichord's kinds, so the toy plays config under config's own description (a name has
#: one description: Registry.register refuses another; test_census_kind.py registers a kind of its own).
TOY = OperationKind(operation_kinds.CONFIG)
ROLL_FIELDS = MarkerFields(section="roll", rebooting="rebooting", boot_id="rebootBootID",
                           requested_at="requestedAt", done="done")
TIMING = Timing().scaled(0.01)


# ---- the toy kind: everything a new kind writes (its stage table is one stage, a two-node roll) ------------


@dataclass
class ToyContext:
    """backbone.Context over the step's scope."""

    scope: ClusterScope

    @property
    def kube(self) -> KubeClient:
        return self.scope.kube

    @property
    def namespace(self) -> str:
        return self.scope.controller_namespace

    @property
    def recorder(self) -> EventRecorder:
        return self.scope.recorder

    @property
    def timing(self) -> Timing:
        return self.scope.timing

    def now(self) -> dt.datetime:
        return self.scope.now()

    def observe(self, obj: Obj) -> None:
        self.scope.observe(obj)


def toy_kind(env: SimEnvironment, talos: TalosClient, managed: KubeClient) -> Operation:
    async def advance(scope: ClusterScope, view: OperationView) -> Outcome:
        ctx, subject = ToyContext(scope), OperationSubject(view.obj)
        if view.finished:
            await backbone.let_go(ctx, TOY, view.obj)
            return Done()
        targets = [RollTarget(m.name, m.address, env.node(m.name).nodename)
                   for m in scope.approved_machines if m.is_control_plane][:2]
        plan = {"machines": [{"name": t.machine, "role": "controlplane", "order": i + 1, "reboots": True}
                             for i, t in enumerate(targets)]}
        control_planes = sum(1 for m in scope.approved_machines if m.is_control_plane)
        other = backbone.other_under_way(scope.operations, subject.uid)
        if not view.stage:
            if view.paused:
                await backbone.plan_only(ctx, TOY, subject, plan)
                return Done()
            await backbone.ensure_finalizer(ctx, TOY, subject)
            refusal = await backbone.lock(ctx, TOY, subject, approved_control_planes=control_planes,
                                          other_under_way=other)
            if refusal is not None:
                return refusal
            await backbone.write(ctx, subject, lambda s: s.update(stage="Rolling", plan=plan),
                                 *backbone.in_progress(ctx, TOY, "Rolling", "rolling the control planes"))
            return Requeue(0.0, "stage Rolling")
        refusal = await backbone.lock(ctx, TOY, subject, approved_control_planes=control_planes,
                                      other_under_way=other)
        if refusal is not None:
            return refusal
        if view.paused:
            return await backbone.hold_paused(ctx, TOY, subject, view.stage)
        await backbone.resume_if_paused(ctx, TOY, subject, view.stage)
        store = StatusMarkerStore(crds.operations(scope.kube), view.namespace, view.name, ROLL_FIELDS)
        rolled = await advance_roll(targets, store, TalosNodes(talos, V1_14), KubeNodes(managed), timing=scope.timing)
        if rolled.pause:
            return await backbone.blocked(ctx, TOY, subject, rolled.message)
        if not rolled.finished:
            return rolled.outcome
        await backbone.write(ctx, subject, lambda s: s.update(stage="Done"),
                             backbone.phase(ctx, names.Phase.COMPLETED, "rolled"),
                             backbone.condition(ctx, TOY, "True", "Rolled", "rolled"))
        await backbone.let_go(ctx, TOY, subject.op)
        return Done()

    return Operation(TOY, advance)


# ---- the world: a simulated 3+1 cluster and the real actor step over informers ---------------------------


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=3, workers=1) as e:
        yield e


def _resource(kind: str) -> Resource:
    return Resource(names.GROUP, names.VERSION, names.PLURALS[kind])


@dataclass
class World:
    env: SimEnvironment
    kube: KubeClient
    reconciler: ClusterReconciler
    operations: Informer

    async def step(self) -> Outcome:
        return await self.reconciler.step({})

    async def op(self) -> Obj:
        return await crds.operations(self.kube).get(self.env.namespace, "toy")

    async def run_until(self, done: Any, *, steps: int = 600) -> None:
        for _ in range(steps):
            outcome = await self.step()
            if await done(await self.op()):
                return
            await anyio.sleep(min(max(next_delay(outcome) or 0.01, 0.005), 0.2))
        raise AssertionError(f"not there in {steps} steps: {(await self.op()).get('status')}")


@pytest.fixture
async def world(env: SimEnvironment) -> AsyncIterator[World]:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            TalosClient(DialBundle.from_bundle(env.bundle), dial_timeout=2, rpc_timeout=5) as talos:  # type: ignore[arg-type]
        registry = Registry()
        registry.register(toy_kind(env, talos, kube))
        async with standalone_actor(kube, env.namespace, env.cluster_name, TIMING, instance="test",
                                    registry=registry) as reconciler:
            yield World(env, kube, reconciler, reconciler.rt.operations)


def _reason(op: Obj) -> str | None:
    cond = find((op.get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT)
    return str(cond["reason"]) if cond else None


async def test_a_toy_kind_runs_through_plan_pause_lock_a_two_node_roll_and_completion(world: World) -> None:
    env = world.env
    boots_before = {m: env.node(m).boots for m in env.machine_names}
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "toy"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": True}})

    # Plan only: the plan is written, nothing runs, no lock.
    async def planned(op: Obj) -> bool:
        return _reason(op) == "Planned"

    await world.run_until(planned)
    op = await world.op()
    assert op["status"]["phase"] == "Pending" and [m["order"] for m in op["status"]["plan"]["machines"]] == [1, 2]
    assert await get_lease(world.kube, env.namespace, lock_name(env.cluster_name)) is None
    assert {m: env.node(m).boots for m in env.machine_names} == boots_before

    # Start: the finalizer and the lock, then the roll; pause it once the first node is done.
    await crds.operations(world.kube).patch(env.namespace, "toy", {"spec": {"paused": False}})

    async def first_rolled(op: Obj) -> bool:
        return len(((op.get("status") or {}).get("roll") or {}).get("done") or []) == 1

    await world.run_until(first_rolled)
    op = await world.op()
    assert TOY.finalizer in op["metadata"]["finalizers"]
    lease = await get_lease(world.kube, env.namespace, lock_name(env.cluster_name))
    assert lease is not None and lease.holder == op["metadata"]["uid"]
    await crds.operations(world.kube).patch(env.namespace, "toy", {"spec": {"paused": True}})

    async def paused(op: Obj) -> bool:
        return _reason(op) == "Paused"

    await world.run_until(paused)
    held = {m: env.node(m).boots for m in env.machine_names}
    # Held: steps run as the actor runs them (each after the last one's delay) reboot nothing, and once the machines
    # phase has nothing sooner (the node rolled just before the pause is read again at its own retry, not at once
    # for ichord's own status write of it), the step's outcome is the pause.
    outcomes: list[Outcome] = []
    for _ in range(6):
        outcomes.append(await world.step())
        assert _reason(await world.op()) == "Paused"
        await anyio.sleep(min(max(next_delay(outcomes[-1]) or 0.01, 0.005), 0.5))
    assert isinstance(outcomes[-1], Blocked) and outcomes[-1].reason == "Paused", outcomes
    assert {m: env.node(m).boots for m in env.machine_names} == held

    # Resume and finish: two control planes rebooted exactly once each, the rest not at all, nothing cordoned.
    await crds.operations(world.kube).patch(env.namespace, "toy", {"spec": {"paused": False}})

    async def completed(op: Obj) -> bool:
        return (op.get("status") or {}).get("phase") == "Completed" and not op["metadata"].get("finalizers")

    await world.run_until(completed)
    op = await world.op()
    cps = [m for m in env.machine_names if "cp" in m]
    rebooted = {m: env.node(m).boots - boots_before[m] for m in env.machine_names}
    assert rebooted == {m: (1 if m in cps[:2] else 0) for m in env.machine_names}, rebooted
    assert op["status"]["roll"]["done"] == cps[:2]
    assert find(op["status"]["conditions"], names.SUCCEEDED)["status"] == "True"
    lease = await get_lease(world.kube, env.namespace, lock_name(env.cluster_name))
    assert lease is None or lease.holder is None  # released
    nodes = (await world.kube.raw("GET", "/api/v1/nodes"))["items"]
    assert not [n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")]
    events = [e["reason"] for e in (await world.kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
              if e["involvedObject"]["name"] == "toy"]
    assert "OperationPaused" in events and "OperationResumed" in events
