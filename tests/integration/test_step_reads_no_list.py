"""Issue 32: a cluster step reads its operations from the informer's cache, never older than ichord's own writes.

Counted by the simulator's request log: a fleet converges without a LIST of TalosOperations per cluster, and a
converged fleet's steps write nothing. What replaces the LIST's freshness (docs/architecture.md#read-your-writes):
an operation this process wrote is seen by the next step before its watch event arrives, and a new leader's
``Informer.relist`` brings what a broken watch missed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from ichord.actors.cluster import ClusterReconciler, Runtime
from ichord.api import names
from ichord.api.views import OperationView
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.events import EventRecorder
from ichord.kube.leases import LeaseRecord, create_lease
from ichord.kube.status import update_status
from ichord.operations.lock import lock_name
from ichord.pki.bundle import SecretsBundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.sim.combined.fleet import Fleet
from ichord.watchers.informer import Informer, Resource
from tests.integration._config_world import REBOOT_PATCH, World, cached, world_on

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = replace(Timing().scaled(0.01))
WRITES = ("create", "update", "patch", "delete", "deletecollection")
CLUSTERS = 3


def _informers(kube: KubeClient) -> dict[str, Informer]:
    return {k: Informer(kube, Resource(names.GROUP, names.VERSION, names.PLURALS[k]), timing=TIMING)
            for k in (names.TALOS_CLUSTER, names.TALOS_MACHINE, names.TALOS_OPERATION)}


@contextlib.asynccontextmanager
async def _runtime(kube: KubeClient, namespace: str) -> AsyncIterator[Runtime]:
    """The leader's Runtime over synced informers; the operations informer runs in its own scope (``stop_watch``)."""
    informers = _informers(kube)
    recorder = EventRecorder(kube, instance="test")
    rt = Runtime(kube, namespace, informers[names.TALOS_CLUSTER], informers[names.TALOS_MACHINE],
                 informers[names.TALOS_OPERATION], recorder, TIMING, resync=3600)
    async with anyio.create_task_group() as tg:
        for inf in informers.values():
            tg.start_soon(inf.run)
        tg.start_soon(recorder.run)
        for inf in informers.values():
            await inf.wait_synced()
        try:
            yield rt
        finally:
            await recorder.drain()
            tg.cancel_scope.cancel()


async def test_a_fleet_converges_without_a_list_of_operations_and_idles_without_a_write(
        bundle: SecretsBundle, tmp_path: Path) -> None:
    # Blocks far from the default 127.100.x a benchmark's fleet takes on the same machine.
    async with Fleet(CLUSTERS, control_planes=1, workers=1, bundle=bundle, time_scale=0.02, first_a=231) as fleet, \
            await from_kubeconfig(fleet.write_kubeconfig(tmp_path / "kubeconfig"), timing=TIMING) as kube, \
            _runtime(kube, fleet.namespace) as rt:
        log = fleet.kube.requests
        log.clear()  # the informers' own LIST and WATCH are behind us: one each per kind, not per cluster
        reconcilers = [ClusterReconciler(rt, fleet.namespace, c.name) for c in fleet.clusters]
        try:
            for r in reconcilers:
                await r.step({})
            assert fleet.ready_reasons() == {"True/Converged": fleet.machine_count}
            assert log.count("list", resource="talosoperations") == 0
            assert log.count("get", resource="talosoperations") == 0

            log.clear()
            for _ in range(2):  # a converged fleet, stepped again (a resync, a wake-up with nothing new)
                for r in reconcilers:
                    await r.step({})
            writes = [e for e in log.entries if e.verb in WRITES]
            assert writes == []
            assert log.count("list", resource="talosoperations") == 0
            assert fleet.ready_reasons() == {"True/Converged": fleet.machine_count}

            # A new leader (fresh actors: nothing remembered) over the converged fleet: every status is already
            # what it would write, so it writes none of them.
            log.clear()
            fresh = [ClusterReconciler(rt, fleet.namespace, c.name) for c in fleet.clusters]
            reconcilers += fresh
            for r in fresh:
                await r.step({})
            assert [e for e in log.entries if e.verb in WRITES] == []
            assert log.count("list", resource="talosoperations") == 0
        finally:
            for r in reconcilers:
                r.close()


async def test_an_operation_written_by_this_process_is_seen_before_its_watch_event(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            await from_kubeconfig(env.kubeconfig, timing=TIMING) as someone_else:
        informers = _informers(kube)
        ops = informers[names.TALOS_OPERATION]
        rt = Runtime(kube, env.namespace, informers[names.TALOS_CLUSTER], informers[names.TALOS_MACHINE], ops,
                     EventRecorder(kube, instance="test"), TIMING)
        await crds.operations(someone_else).create(env.namespace, {"metadata": {"name": "rot"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": names.KIND_CA_ROTATION, "paused": True}})
        async with anyio.create_task_group() as tg:
            tg.start_soon(ops.run)
            await ops.wait_synced()
            tg.cancel_scope.cancel()  # the watch stops here: from now on the cache lags every write

        def stage(value: str):  # type: ignore[no-untyped-def]
            def mutate(status: dict[str, object], _obj: object) -> dict[str, object]:
                status["caRotation"] = {"stage": value}
                return status
            return mutate

        [before] = rt.operations_of(env.namespace, env.cluster_name)
        assert not before.holds_machines
        await update_status(crds.operations(kube), env.namespace, "rot", stage("Accepting"))
        [seen] = rt.operations_of(env.namespace, env.cluster_name)
        assert seen.stage == "Accepting" and seen.holds_machines  # ichord's own write, before its event
        assert not (ops.cache[(env.namespace, "rot")].get("status") or {}).get("caRotation")  # the cache lags

        # Another process's write is not ichord's: it arrives with its watch event (or a new leader's relist).
        await update_status(crds.operations(someone_else), env.namespace, "rot", stage("Issuing"))
        [still] = rt.operations_of(env.namespace, env.cluster_name)
        assert still.stage == "Accepting"

        async with anyio.create_task_group() as tg:
            tg.start_soon(ops.run)  # lists again (it never watched past its first list): caught up
            await cached(ops, (env.namespace, "rot"),
                         lambda o: (o.get("status") or {}).get("caRotation", {}).get("stage") == "Issuing")
            [now] = rt.operations_of(env.namespace, env.cluster_name)
            assert now.stage == "Issuing"
            assert len(rt.operations_written) == 0  # the written copy goes once the cache has caught up
            tg.cancel_scope.cancel()


async def test_relist_brings_what_a_broken_watch_missed(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        ops = _informers(kube)[names.TALOS_OPERATION]
        async with anyio.create_task_group() as tg:
            tg.start_soon(ops.run)
            await ops.wait_synced()
            env.management.faults.error_rate = {"watch:talosoperations": 1.0}  # a new watch fails
            env.management.stall_watches()  # the open one stays connected and says nothing: a dead watch
            await crds.operations(kube).create(env.namespace, {"metadata": {"name": "missed"}, "spec": {
                "clusterRef": {"name": env.cluster_name}, "kind": names.KIND_CONFIG, "paused": True}})
            await anyio.sleep(0.2)
            assert (env.namespace, "missed") not in ops.cache

            lists = env.management.requests.count("list", resource="talosoperations")
            with anyio.fail_after(10):
                await ops.relist()
            assert (env.namespace, "missed") in ops.cache
            assert env.management.requests.count("list", resource="talosoperations") == lists + 1

            env.management.faults.error_rate = {}
            await crds.operations(kube).create(env.namespace, {"metadata": {"name": "after"}, "spec": {
                "clusterRef": {"name": env.cluster_name}, "kind": names.KIND_CONFIG, "paused": True}})
            await cached(ops, (env.namespace, "after"))  # the watch resumes from the relist's resourceVersion
            tg.cancel_scope.cancel()


@pytest.fixture
async def world(env: SimEnvironment) -> AsyncIterator[World]:
    async for w in world_on(env, TIMING):
        yield w


async def test_an_operation_about_to_start_is_decided_on_the_api_not_the_cache(env: SimEnvironment,
                                                                                world: World) -> None:
    """The user paused it a moment ago and the watch has not said so yet: the start reads it fresh and holds."""
    if True:
        await world.patch_cluster([REBOOT_PATCH])  # something to roll out

        async def reported() -> bool:
            return all((m.get("status") or {}).get("rebootPaths") for m in await world.machines())

        await world.run_until(reported, what="the machines report the change waiting for a reboot")
        await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "roll"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": names.KIND_CONFIG, "paused": False}})
        await cached(world.reconciler.rt.operations, (env.namespace, "roll"))
        # Its first step takes the finalizer and meets the lock held by another operation: Blocked, not started.
        t = dt.datetime.now(dt.UTC)
        await create_lease(world.kube, env.namespace, lock_name(env.cluster_name), LeaseRecord("other", 3600, t, t))
        await world.step()
        assert "holds the cluster lock" in OperationView.of(await world.op("roll")).condition()["message"]
        await world.kube.coordination().delete_namespaced_lease(lock_name(env.cluster_name), env.namespace)
        env.management.stall_watches()  # from here on the informers' copies lag
        async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as user:  # not ichord's own write
            await crds.operations(user).patch(env.namespace, "roll", {"spec": {"paused": True}})
        assert not world.reconciler.rt.operations.cache[(env.namespace, "roll")]["spec"]["paused"]
        await world.step()
        op = OperationView.of(await world.op("roll"))
        assert not op.stage and op.phase == names.Phase.PENDING, op.status  # planned only: nothing started
