"""Guarded deletes (issue 26) on the simulators, run by the real cluster actor step and registry: a TalosCluster and a
TalosMachine the operation covers, deleted in each stage of each operation kind, are held (finalizer
ichor.maesh.dev/operation-in-progress, DeletionHeld naming the operation, one Warning), the operation completes, and
then the deletes complete. Nothing is held when no operation runs; no operation starts on a cluster being deleted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from ichord.api import names
from ichord.api.abandonable import rotation_abandonable
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.errors import NotFound
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.pki.bundle import SecretsBundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._ca_rotation_driver import TIMING as ROTATION_TIMING
from tests.integration._config_world import REBOOT_PATCH, World, world_on

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
GUARD = names.OPERATION_GUARD_FINALIZER
#: The operations' timings scaled down; the client's call timeout kept at seconds (a loaded machine is slow, and a
#: timed-out call is not what these tests are about).
_CALLS = {"kube_request_timeout": 30.0, "min_call_timeout": 5.0}
CONFIG_TIMING = replace(Timing().scaled(0.01), **_CALLS)

#: (kind, the stage the cluster is deleted in): every stage of a default ca-rotation, and a config rollout.
CASES = [("ca-rotation", s) for s in ("Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing")] + [
    ("config", "Rolling")]


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    # A separate management API: ichord's own client needs no trust pool across the Kubernetes CA's rotation.
    async with SimEnvironment(bundle=bundle, time_scale=0.02, management_api="separate", workers=1) as e:
        yield e


@pytest.fixture
async def world(env: SimEnvironment, request: pytest.FixtureRequest) -> AsyncIterator[World]:
    """The cluster actor over synced informers; the timing of the kind under test (``kind`` parameter)."""
    params = request.node.callspec.params if hasattr(request.node, "callspec") else {}
    kind = params.get("kind", "ca-rotation")
    async for w in world_on(env, replace(ROTATION_TIMING, **_CALLS) if kind == "ca-rotation" else CONFIG_TIMING):
        yield w


def _stage(op: Obj) -> str:
    status = op.get("status") or {}
    return str((status.get("caRotation") or {}).get("stage") or status.get("stage") or "")


async def _get(world: World, objects: crds.CustomObjects, name: str) -> Obj | None:
    try:
        return await objects.get(world.env.namespace, name)
    except NotFound:
        return None


async def _acknowledging_until(world: World, name: str, what: str, done: Any) -> None:
    """Step the actor, playing the operator at the hand-off, until ``done(op)`` holds."""
    ops = crds.operations(world.kube)

    async def there() -> bool:
        op = await _get(world, ops, name)
        if op is not None and _stage(op) == "AwaitingCredentials":
            token = handoff_token(op["status"]["caRotation"]["certificates"])
            if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                await ops.patch(world.env.namespace, name, {"metadata": {"annotations": {
                    names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
        return bool(done(op))

    await world.run_until(there, what=what, steps=3000)


def _events(env: SimEnvironment, kind: str, name: str, reason: str) -> list[Obj]:
    store = env.management.store
    return [e for e in store.list(store.resolve("", "v1", "events"), env.namespace)[0]
            if e.get("reason") == reason and e["involvedObject"]["kind"] == kind
            and e["involvedObject"]["name"] == name]


@pytest.mark.parametrize(("kind", "stage"), CASES, ids=[f"{k}-{s}" for k, s in CASES])
async def test_a_cluster_and_a_covered_machine_deleted_in_each_stage_are_held_until_the_operation_completes(
        env: SimEnvironment, world: World, kind: str, stage: str) -> None:
    ns = env.namespace
    clusters, machines, ops = crds.clusters(world.kube), crds.machines(world.kube), crds.operations(world.kube)
    await world.step()  # converge first: nothing runs, nothing is held
    assert GUARD not in ((await clusters.get(ns, env.cluster_name))["metadata"].get("finalizers") or [])
    if kind == "config":
        await world.patch_cluster([REBOOT_PATCH])

        async def reported() -> bool:
            return all((m.get("status") or {}).get("rebootPaths") for m in await world.machines())

        await world.run_until(reported, what="every machine reporting the reboot")
    spec: Obj = {"clusterRef": {"name": env.cluster_name}, "kind": kind}
    await ops.create(ns, {"metadata": {"name": "op"}, "spec": spec})
    await _acknowledging_until(world, "op", f"{kind} in {stage}", lambda o: o is not None and _stage(o) == stage)
    worker = next(m for m in env.machine_names if "worker" in m)

    await clusters.delete(ns, env.cluster_name)
    await machines.delete(ns, worker)

    async def said() -> bool:  # the informers bring the deletes to the next steps
        objs = [await clusters.get(ns, env.cluster_name), await machines.get(ns, worker)]
        return all(find((o.get("status") or {}).get("conditions"), names.DELETION_HELD) for o in objs)

    await world.run_until(said, what="DeletionHeld on the cluster and the machine", steps=50)
    assert _stage(await ops.get(ns, "op")) == stage or kind == "ca-rotation"
    cluster = await clusters.get(ns, env.cluster_name)
    machine = await machines.get(ns, worker)
    for obj in (cluster, machine):
        assert obj["metadata"].get("deletionTimestamp") and GUARD in obj["metadata"]["finalizers"]
        held = find(obj["status"]["conditions"], names.DELETION_HELD)
        assert held is not None and (held["status"], held["reason"]) == ("True", "OperationInProgress")
        assert f"TalosOperation {ns}/op ({kind}" in held["message"]
        assert "completes when it completes" in held["message"]
    now = _stage(await ops.get(ns, "op"))  # the rotation runs on: the message follows its stage
    assert f"in {now})" in held["message"], (now, held["message"])
    if kind == "config" or rotation_abandonable(now, ["talos", "kubernetes"]):
        assert f"kubectl -n {ns} delete talosoperation op" in held["message"]  # still abandonable
    else:
        assert "past its point of no return" in held["message"]

    await _acknowledging_until(world, "op", f"{kind} completed",
                               lambda o: o is not None and o["status"].get("phase") in ("Completed", "Failed"))
    op = await ops.get(ns, "op")
    assert op["status"]["phase"] == "Completed", op["status"]

    async def gone() -> bool:
        return await _get(world, clusters, env.cluster_name) is None and await _get(world, machines, worker) is None

    await world.run_until(gone, what="the cluster and the machine deleted once the operation completed")
    await world.reconciler.rt.recorder.drain()
    assert len(_events(env, "TalosCluster", env.cluster_name, "DeletionHeld")) == 1  # said once
    assert len(_events(env, "TalosMachine", worker, "DeletionHeld")) == 1
    # The other machines lost their hold too (nothing is left held once nothing runs).
    for m in await world.machines():
        assert GUARD not in (m["metadata"].get("finalizers") or []), m["metadata"]["name"]


async def test_nothing_is_held_without_an_operation_and_none_starts_on_a_cluster_being_deleted(
        env: SimEnvironment, world: World) -> None:
    ns = env.namespace
    clusters, ops = crds.clusters(world.kube), crds.operations(world.kube)
    # A plan-only operation runs nothing, so it holds nothing.
    await ops.create(ns, {"metadata": {"name": "plan"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "paused": True}})
    await world.step()
    assert (await ops.get(ns, "plan"))["status"]["phase"] == "Pending"
    cluster = await clusters.get(ns, env.cluster_name)
    assert GUARD not in (cluster["metadata"].get("finalizers") or [])
    for m in await world.machines():
        assert GUARD not in (m["metadata"].get("finalizers") or [])

    # Another finalizer keeps the deleted cluster readable; ichord must not add its own, nor start.
    await clusters.patch(ns, env.cluster_name, {"metadata": {"finalizers": ["example.com/keep"]}})
    await clusters.delete(ns, env.cluster_name)
    await ops.patch(ns, "plan", {"spec": {"paused": False}})
    await world.step()
    op = await ops.get(ns, "plan")
    cond = find(op["status"]["conditions"], names.CA_ROTATION)
    assert op["status"]["phase"] == "Paused" and "is being deleted" in cond["message"], op["status"]
    assert not (op["status"].get("caRotation") or {}).get("stage")
    assert names.CA_ROTATION_FINALIZER not in (op["metadata"].get("finalizers") or [])
    cluster = await clusters.get(ns, env.cluster_name)
    assert cluster["metadata"]["finalizers"] == ["example.com/keep"]
    assert env.applies(env.machine_names[0]) == []  # nothing reached a node


@pytest.mark.parametrize("kind", ["ca-rotation", "config"])
async def test_abandoning_the_operation_releases_the_hold_and_the_delete_completes(
        env: SimEnvironment, world: World, kind: str) -> None:
    ns = env.namespace
    clusters, ops = crds.clusters(world.kube), crds.operations(world.kube)
    await world.step()
    if kind == "config":
        await world.patch_cluster([REBOOT_PATCH])

        async def reported() -> bool:
            return all((m.get("status") or {}).get("rebootPaths") for m in await world.machines())

        await world.run_until(reported, what="every machine reporting the reboot")
    await ops.create(ns, {"metadata": {"name": "op"}, "spec": {"clusterRef": {"name": env.cluster_name}, "kind": kind}})
    stage = "Accepting" if kind == "ca-rotation" else "Rolling"
    await world.run_until(lambda: _at(world, stage), what=f"{kind} in {stage}")
    await clusters.delete(ns, env.cluster_name)

    async def held() -> bool:
        return bool(find(((await clusters.get(ns, env.cluster_name)).get("status") or {}).get("conditions"),
                         names.DELETION_HELD))

    await world.run_until(held, what="the cluster's delete held", steps=50)
    await ops.delete(ns, "op")  # abandon: still abandonable in this stage

    async def gone() -> bool:
        return await _get(world, clusters, env.cluster_name) is None and await _get(world, ops, "op") is None

    await world.run_until(gone, what="the operation abandoned and the cluster's delete completed", steps=200)
    for m in await world.machines():
        assert GUARD not in (m["metadata"].get("finalizers") or []), m["metadata"]["name"]


async def _at(world: World, stage: str) -> bool:
    op = await _get(world, crds.operations(world.kube), "op")
    return op is not None and _stage(op) == stage
