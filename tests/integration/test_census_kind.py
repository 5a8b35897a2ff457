"""Issue 29, done when: a made-up operation kind, from new files plus one registration line, runs through the
daemon's own machinery on the simulators: the cluster actor's step (ichord/actors, unchanged) over informers, the
registry and its error policy, the backbone (plan only, finalizer, lock Lease, phase and conditions, the stage
mirrored for the printer columns), and delete: abandoned in an abandonable stage, DeletionHeld past it.

The kind is ``census`` (tests/integration/_census_kind.py): it reads every approved node's Talos version over mutual
TLS, one node per step, and records it. The Kubernetes simulator enforces the CRD's ``spec.kind`` enum as the real
API server does, so the test serves the chart's TalosOperation CRD with ``census`` admitted (built here from the
CRD as served; the chart's file is not edited). The printer columns are read by kubectl itself.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from ichord.actors.cluster import ClusterReconciler
from ichord.actors.standalone import standalone_actor
from ichord.api import names, operation_kinds
from ichord.api.conditions import find
from ichord.api.operation_kinds import KindDescription
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import NotFound
from ichord.kube.leases import get_lease
from ichord.operations.lock import lock_name
from ichord.operations.outcome import Outcome, next_delay
from ichord.operations.registry import Registry
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.watchers.informer import Resource
from tests.integration import _census_kind as census
from tests.integration._daemon import running_daemon, wait_until
from tests.integration._kubectl import KUBECTL, operation_columns

pytestmark = [pytest.mark.integration, pytest.mark.anyio,
              pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed and not built (scripts/tools.sh)")]

Obj = dict[str, Any]
TIMING = Timing().scaled(0.01)
CRD_PATH = ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
            f"{names.PLURALS[names.TALOS_OPERATION]}.{names.GROUP}")


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=3, workers=1) as e:
        yield e


@dataclass
class World:
    env: SimEnvironment
    kube: KubeClient
    reconciler: ClusterReconciler

    async def op(self, name: str) -> Obj:
        return await crds.operations(self.kube).get(self.env.namespace, name)

    async def create(self, name: str, *, paused: bool = False) -> None:
        await crds.operations(self.kube).create(self.env.namespace, {"metadata": {"name": name}, "spec": {
            "clusterRef": {"name": self.env.cluster_name}, "kind": census.KIND, "paused": paused}})

    async def step(self) -> Outcome:
        return await self.reconciler.step({})

    async def run_until(self, name: str, done: Callable[[Obj | None], bool], *, steps: int = 300,
                        seen: Callable[[Obj | None], Awaitable[None]] | None = None) -> Obj | None:
        """Step the actor until ``done`` holds of operation ``name`` (None once it is gone)."""
        for _ in range(steps):
            outcome = await self.step()
            try:
                op: Obj | None = await self.op(name)
            except NotFound:
                op = None
            if seen is not None:
                await seen(op)
            if done(op):
                return op
            await anyio.sleep(min(max(next_delay(outcome) or 0.01, 0.005), 0.2))
        raise AssertionError(f"{name}: not there in {steps} steps")

    async def lease_holder(self) -> str | None:
        lease = await get_lease(self.kube, self.env.namespace, lock_name(self.env.cluster_name))
        return None if lease is None else lease.holder

    async def events(self, name: str) -> list[tuple[str, str]]:
        items = (await self.kube.raw("GET", f"/api/v1/namespaces/{self.env.namespace}/events"))["items"]
        return [(e["type"], e["reason"]) for e in items if e["involvedObject"]["name"] == name]

    async def columns(self, name: str) -> dict[str, str]:
        """``kubectl get talosoperations NAME``: header -> cell, as printed through the CRD's jsonPaths."""
        return await operation_columns(self.env.kubeconfig, self.env.namespace, name)


def _resource(kind: str) -> Resource:
    return Resource(names.GROUP, names.VERSION, names.PLURALS[kind])


@pytest.fixture(autouse=True)
def _kinds_restored() -> Iterator[None]:
    """The table of kinds is process-wide: what a test's registry added to it leaves with the test (the
    CRD-agreement tests expect ichord's own kinds alone)."""
    before = dict(operation_kinds.KINDS)
    yield
    operation_kinds.KINDS.clear()
    operation_kinds.KINDS.update(before)


@pytest.fixture
def description() -> KindDescription:
    """The census's description in ichord's table while the test runs (a test parametrizes another)."""
    return census.DESCRIPTION


@pytest.fixture
async def world(env: SimEnvironment, description: KindDescription) -> AsyncIterator[World]:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        # The served CRD with census admitted (the simulator, like kube-apiserver, refuses a kind not in the enum).
        served = await kube.raw("GET", CRD_PATH)
        await kube.raw("PUT", CRD_PATH, body=census.census_crd(served))
        registry = Registry()
        registry.register(census.census_operation(description))  # the one registration line: behaviour + description
        async with standalone_actor(kube, env.namespace, env.cluster_name, TIMING, instance="test",
                                    registry=registry) as reconciler:
            yield World(env, kube, reconciler)


def _status(op: Obj | None) -> Obj:
    return dict((op or {}).get("status") or {})


def _reason(op: Obj | None, ctype: str = census.CONDITION) -> str | None:
    cond = find(_status(op).get("conditions"), ctype)
    return str(cond["reason"]) if cond else None


def _versions(op: Obj | None) -> dict[str, str]:
    return dict((_status(op).get(census.SECTION) or {}).get("versions") or {})


def _stage(op: Obj | None) -> str:
    return str((_status(op).get(census.SECTION) or {}).get("stage") or "")


async def test_a_fake_kind_runs_plan_steps_status_conditions_and_printer_columns(world: World) -> None:
    env = world.env
    expected = {m: env.node(m).cluster.version_tag(env.node(m).contract) for m in env.machine_names}

    # Plan only: the plan lists every approved machine; no finalizer, no lock, nothing read.
    await world.create("survey", paused=True)
    op = await world.run_until("survey", lambda o: _reason(o) == "Planned")
    assert _status(op)["phase"] == names.Phase.PENDING
    assert [m["name"] for m in _status(op)["plan"]["machines"]] == sorted(expected, key=lambda m: ("cp" not in m, m))
    assert not (op or {})["metadata"].get("finalizers") and await world.lease_holder() is None
    assert not _versions(op)

    # Started: the finalizer, the lock held by this operation, then one node read per step.
    await crds.operations(world.kube).patch(env.namespace, "survey", {"spec": {"paused": False}})
    counts: list[int] = []
    surveying: list[dict[str, str]] = []

    async def seen(o: Obj | None) -> None:
        if _stage(o) == census.SURVEYING:
            counts.append(len(_versions(o)))
            if len(_versions(o)) == 1 and not surveying:
                surveying.append(await world.columns("survey"))
                assert census.DESCRIPTION.finalizer in (o or {})["metadata"]["finalizers"]
                assert await world.lease_holder() == (o or {})["metadata"]["uid"]

    await world.run_until("survey", lambda o: _stage(o) == census.CONFIRMING, seen=seen)
    # One node a step: after each step the census has read one more node (or, on a stale copy, the same one again).
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(counts)), counts
    assert sorted(set(counts)) == list(range(len(expected) + 1)), counts
    # kubectl prints the census's own stage and step (mirrored from status.census for every kind's columns).
    assert surveying and surveying[0]["KIND"] == census.KIND and surveying[0]["PHASE"] == names.Phase.IN_PROGRESS
    assert surveying[0]["STAGE"] == census.SURVEYING and surveying[0]["STEP"].startswith("reading ")

    op = await world.run_until("survey", lambda o: _status(o).get("phase") == names.Phase.COMPLETED
                               and not (o or {})["metadata"].get("finalizers"))
    status = _status(op)
    assert _versions(op) == expected  # every node's version, as each node itself reported it over mutual TLS
    kind_condition, succeeded = (find(status["conditions"], t) or {} for t in (census.CONDITION, names.SUCCEEDED))
    assert (kind_condition.get("status"), kind_condition.get("reason")) == ("True", census.SURVEYED)
    assert succeeded.get("status") == "True"
    assert _stage(op) == "Done" and status["stage"] == "Done"
    assert await world.lease_holder() is None
    done = await world.columns("survey")
    assert (done["KIND"], done["PHASE"], done["STAGE"], done["STEP"]) == (census.KIND, "Completed", "Done", "")
    assert not [e for e in await world.events("survey") if e[0] == "Warning"]


async def test_a_fake_kind_is_abandoned_when_deleted_in_an_abandonable_stage_and_held_past_it(world: World) -> None:
    # Deleted in Surveying (abandonable): let go at once, the lock released, the object gone, unread nodes unread.
    await world.create("early")
    op = await world.run_until("early", lambda o: len(_versions(o)) == 1)
    assert await world.lease_holder() == (op or {})["metadata"]["uid"]
    await crds.operations(world.kube).delete(world.env.namespace, "early")
    await world.run_until("early", lambda o: o is None, steps=20)
    assert await world.lease_holder() is None
    assert await world.events("early") == [("Normal", names.EventReason.OPERATION_ABANDONED)]  # no DeletionHeld

    # Deleted in Confirming (not abandonable): DeletionHeld once, with one Warning; it runs on to Done, then goes.
    # Paused first, so the held state stands still to be read (unpaused it would end within the same step).
    await world.create("late")
    await world.run_until("late", lambda o: _stage(o) == census.CONFIRMING)
    await crds.operations(world.kube).patch(world.env.namespace, "late", {"spec": {"paused": True}})
    await crds.operations(world.kube).delete(world.env.namespace, "late")
    op = await world.run_until("late", lambda o: _reason(o) == "Paused"
                               and _reason(o, names.DELETION_HELD) == names.DeletionHeldReason.PAST_POINT_OF_NO_RETURN)
    assert _stage(op) == census.CONFIRMING and (op or {})["metadata"].get("deletionTimestamp")
    assert census.DESCRIPTION.finalizer in (op or {})["metadata"]["finalizers"]
    assert await world.lease_holder() == (op or {})["metadata"]["uid"]
    await crds.operations(world.kube).patch(world.env.namespace, "late", {"spec": {"paused": False}})
    await world.run_until("late", lambda o: o is None)
    events = await world.events("late")
    assert events.count(("Warning", names.EventReason.DELETION_HELD)) == 1
    assert ("Normal", names.EventReason.OPERATION_ABANDONED) not in events
    assert await world.lease_holder() is None


async def test_a_fake_kind_runs_to_completion_under_the_daemon_itself(env: SimEnvironment) -> None:
    """The whole daemon in this process (leader election, informers, the router, the supervisor and the cluster's
    mailbox actor): nothing steps it but the census's own outcomes and the watch events they cause."""
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        await kube.raw("PUT", CRD_PATH, body=census.census_crd(await kube.raw("GET", CRD_PATH)))
        registry = Registry()
        registry.register(census.census_operation())  # the one registration line: behaviour + description
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "daemon-run"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": census.KIND}})
        async with running_daemon(env, kube, TIMING, identity="census-test", registry=registry):
            op = await wait_until(lambda: crds.operations(kube).get(env.namespace, "daemon-run"),
                                  lambda o: _status(o).get("phase") == names.Phase.COMPLETED
                                  and not o["metadata"].get("finalizers"))
            lock = await get_lease(kube, env.namespace, lock_name(env.cluster_name))
    assert lock is not None and lock.holder is None  # taken by the census, then released
    expected = {m: env.node(m).cluster.version_tag(env.node(m).contract) for m in env.machine_names}
    assert _versions(op) == expected and _reason(op) == census.SURVEYED


async def test_a_fake_kind_blocked_by_a_node_that_does_not_answer_resumes_where_it_stood(world: World) -> None:
    """A Talos error in a step goes through the backbone: Paused/Blocked naming the node, one Warning, retried;
    answered again, the census goes on from the nodes it had read (none read twice into the record)."""
    env = world.env
    silent = next(m for m in env.machine_names if "worker" in m)  # read last: the plan puts control planes first
    await env.set_unreachable(silent)
    await world.create("outage")
    op = await world.run_until("outage", lambda o: _reason(o) == "Blocked")
    assert _status(op)["phase"] == names.Phase.PAUSED and silent in str(find(
        _status(op)["conditions"], census.CONDITION))
    assert set(_versions(op)) == set(env.machine_names) - {silent}
    for _ in range(3):
        await world.step()
    assert (await world.events("outage")).count(("Warning", names.EventReason.OPERATION_BLOCKED)) == 1
    await env.set_unreachable(silent, False)
    op = await world.run_until("outage", lambda o: _status(o).get("phase") == names.Phase.COMPLETED)
    assert set(_versions(op)) == set(env.machine_names) and _reason(op) == census.SURVEYED


@pytest.mark.parametrize("description", [census.HOLDING])
async def test_a_holding_and_excluding_kind_is_named_in_its_own_words(world: World) -> None:
    """Issue 29: a census that holds the machines and excludes others (and rotates no CA): under way, every machine
    reads Ready=Unknown/OperationUnderWay naming it, and a second census is refused the lock (Blocked) in words
    naming it, not "a CA rotation". Once it is done, the second runs."""
    env = world.env
    silent = next(m for m in env.machine_names if "worker" in m)  # holds the census in Surveying, Blocked
    await env.set_unreachable(silent)
    await world.create("holder")
    await world.run_until("holder", lambda o: _reason(o) == "Blocked")
    await world.step()  # the machine phase, after the operations phase of the same step

    def ready(machine: Obj) -> tuple[str, str, str]:
        cond = find(_status(machine).get("conditions"), names.READY) or {}
        return str(cond.get("status")), str(cond.get("reason")), str(cond.get("message"))

    machines = [m for m in (await crds.machines(world.kube).list_objects(env.namespace))[0]
                if m["metadata"]["name"] in env.machine_names]
    assert {m["metadata"]["name"] for m in machines} == set(env.machine_names)
    for machine in machines:
        status, reason, message = ready(machine)
        assert (status, reason) == ("Unknown", names.ReadyReason.OPERATION_UNDER_WAY), (machine, message)
        assert message.startswith(f"a census (TalosOperation {env.namespace}/holder) is under way"), message

    await world.create("second")
    # The lock's refusal (ClusterOperationExclusive, tests/integration/test_cluster_lock.py) as the user reads it:
    # Blocked, its message naming the census under way by its kind's title.
    op = await world.run_until("second", lambda o: _reason(o) == "Blocked")
    message = str((find(_status(op)["conditions"], census.CONDITION) or {}).get("message"))
    assert message == (f"a census (operation {env.namespace}/holder) is under way on cluster {env.cluster_name}; "
                       "this operation waits until it completes")
    assert _status(op)["phase"] == names.Phase.PAUSED and await world.lease_holder() != (op or {})["metadata"]["uid"]

    await env.set_unreachable(silent, False)
    await world.run_until("holder", lambda o: _status(o).get("phase") == names.Phase.COMPLETED)
    op = await world.run_until("second", lambda o: _status(o).get("phase") == names.Phase.COMPLETED)
    assert set(_versions(op)) == set(env.machine_names)
