"""docs/decisions.md#config-rollout on the simulators: the ``config`` operation run by the real cluster actor step and
registry.

A reboot-class patch rolled out on 3 control planes + 2 workers with a PDB-protected app: plan only while
paused, each node rebooted exactly once, never two control planes (nor more than one worker) down at once,
the PDB never violated (read at every pod change), nothing left cordoned, every TalosMachine Ready=True
after. Then the refusals (nothing to do; a rotation unfinished), a drain a PDB never allows (bounded, paused
naming the pod, uncordoned, nothing rebooted), an unowned pod, and the API-server-restart class.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.api.max_unavailable import MaxUnavailable
from ichord.kube import crds
from ichord.kube.nodes import CORDONED_BY_ICHORD_ANNOTATION
from ichord.operations.config.cli import config_apply, format_plan
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CAKind
from ichord.pki.fingerprint import ca_fingerprint
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.sim.talos.run import scaled
from tests.integration._config_world import (
    API_SERVER_PATCH,
    APP_NS,
    REBOOT_PATCH,
    World,
    most_down_at_once,
    reboots,
    world_on,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
TIMING = Timing().scaled(0.01)


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=3, workers=2,
                              pod_start_delay=2.0) as e:
        yield e


@pytest.fixture
async def world(env: SimEnvironment) -> AsyncIterator[World]:
    async for w in world_on(env, TIMING):
        yield w


def _cond(obj: Obj, ctype: str = names.CONFIG_ROLLOUT) -> Obj:
    return find((obj.get("status") or {}).get("conditions"), ctype) or {}


async def _create(world: World, name: str, *, paused: bool, **spec: Any) -> None:
    await crds.operations(world.kube).create(world.env.namespace, {"metadata": {"name": name}, "spec": {
        "clusterRef": {"name": world.env.cluster_name}, "kind": "config", "paused": paused, **spec}})


async def _reported(world: World, field: str, count: int) -> None:
    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get(field)) == count

    await world.run_until(reported, what=f"{count} machines reporting {field}")


async def _phase(world: World, name: str, *phases: str) -> Obj:
    async def there() -> bool:
        return (await world.op(name)).get("status", {}).get("phase") in phases

    await world.run_until(there, what=f"{name} in {phases}")
    return await world.op(name)


async def _cordoned(world: World) -> list[str]:
    nodes = (await world.kube.raw("GET", "/api/v1/nodes"))["items"]
    return [n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")
            or CORDONED_BY_ICHORD_ANNOTATION in (n["metadata"].get("annotations") or {})]


async def test_a_reboot_patch_rolls_out_one_node_at_a_time_with_a_drain_under_a_pdb(world: World) -> None:
    env = world.env
    await world.deploy_app(replicas=2, min_available=1)
    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    boots_before = {m: env.node(m).boots for m in env.machine_names}

    await _create(world, "roll", paused=True)
    op = await _phase(world, "roll", "Pending")
    assert _cond(op)["reason"] == "Planned"
    plan = op["status"]["plan"]
    assert [m["role"] for m in plan["machines"]] == ["controlplane"] * 3 + ["worker"] * 2
    assert all(m["reboots"] and m["change"] == "Reboot" for m in plan["machines"])
    assert plan["kubernetesAPIUnavailable"] is False
    assert {m: env.node(m).boots for m in env.machine_names} == boots_before  # plan only: nothing ran

    since = len(env.talos.history.events)
    await crds.operations(world.kube).patch(env.namespace, "roll", {"spec": {"paused": False}})
    op = await _phase(world, "roll", "Completed", "Failed", "Paused")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == {m: 1 for m in env.machine_names}
    assert most_down_at_once(env, f"{env.cluster_name}-cp-", since) == 1
    assert most_down_at_once(env, f"{env.cluster_name}-worker-", since) == 1
    assert op["status"]["roll"]["done"] == [m["name"] for m in plan["machines"]]
    assert world.pdb.lowest is not None and world.pdb.lowest >= 1, world.pdb
    assert env.clients.events and any(e["kind"] == "pod_replaced" for e in env.clients.events)  # evictions happened
    assert await _cordoned(world) == []
    assert not op["metadata"].get("finalizers")
    mirrors = (await world.kube.raw("GET", "/api/v1/namespaces/kube-system/pods"))["items"]
    assert len([p for p in mirrors if "kubernetes.io/config.mirror" in p["metadata"].get("annotations", {})]) == 9

    # The machine reconciler and the operation agree: every machine converged, Ready=True.
    async def all_ready() -> bool:
        return all(_cond(m, names.READY).get("status") == "True" for m in await world.machines())

    await world.run_until(all_ready, what="every TalosMachine Ready=True")
    assert all(_cond(m)["reason"] == "RolledOut" for m in await world.machines())
    stages = [e["kind"] for e in env.talos.history.events[since:] if e["kind"] == "apply"]
    modes = {e.get("mode") for e in env.talos.history.events[since:] if e["kind"] == "apply"}
    assert stages and modes == {"STAGED"}, modes  # never AUTO, never REBOOT


async def test_refusals_nothing_to_do_and_a_rotation_unfinished(world: World) -> None:
    await _create(world, "idle", paused=False)
    op = await _phase(world, "idle", "Failed")
    assert _cond(op)["reason"] == "NothingToDo"

    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    await crds.operations(world.kube).create(world.env.namespace, {"metadata": {"name": "rot"}, "spec": {
        "clusterRef": {"name": world.env.cluster_name}, "kind": "ca-rotation", "paused": True}})
    await _create(world, "late", paused=False)
    op = await _phase(world, "late", "Failed")
    assert _cond(op)["reason"] == "ClusterCARotating", op["status"]
    assert sum(reboots(world.env).values()) == 0


async def test_a_pdb_that_never_allows_an_eviction_pauses_naming_the_pod(world: World) -> None:
    env = world.env
    await world.deploy_app(replicas=1, min_available=1)
    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    pods = (await world.kube.raw("GET", f"/api/v1/namespaces/{APP_NS}/pods"))["items"]
    pinned = pods[0]["spec"]["nodeName"]
    worker = next(m for m in env.machine_names if env.node(m).nodename == pinned)
    # Only that worker waits: hold the rest by rolling out its own plan (the others converge as they are).
    await _create(world, "stuck", paused=False)
    op = await _phase(world, "stuck", "Paused")

    async def blocked_on_pod() -> bool:
        o = await world.op("stuck")
        return "did not drain" in str(o["status"].get("message"))

    await world.run_until(blocked_on_pod, what="the drain bound")
    op = await world.op("stuck")
    assert pods[0]["metadata"]["name"] in op["status"]["message"]
    assert env.node(worker).boots == 1  # never rebooted
    assert await _cordoned(world) == []  # ichord's cordon released


async def test_an_unowned_pod_is_refused_and_nothing_reboots(world: World) -> None:
    env = world.env
    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    first_worker = f"{env.cluster_name}-worker-1"
    node = env.node(first_worker).nodename
    await world.kube.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": APP_NS}})
    await world.kube.raw("POST", f"/api/v1/namespaces/{APP_NS}/pods", body={
        "metadata": {"name": "pet", "namespace": APP_NS},
        "spec": {"nodeName": node, "containers": [{"name": "pet", "image": "busybox"}]}})
    await _create(world, "pets", paused=False)

    async def refused() -> bool:
        return "no controller owns" in str((await world.op("pets")).get("status", {}).get("message"))

    await world.run_until(refused, what="the unowned pod refusal")
    assert env.node(first_worker).boots == 1
    assert node not in await _cordoned(world)


async def test_an_api_server_restart_patch_restarts_each_control_plane_once_without_a_reboot(world: World) -> None:
    env = world.env
    await world.patch_cluster([API_SERVER_PATCH])
    await _reported(world, "apiServerRestartPaths", 3)
    since = len(env.talos.history.events)
    await _create(world, "restart", paused=False)
    op = await _phase(world, "restart", "Completed", "Failed", "Paused")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert [m["change"] for m in op["status"]["plan"]["machines"]] == ["APIServerRestart"] * 3
    assert sum(reboots(env, since).values()) == 0
    restarts = [e["node"] for e in env.talos.history.events[since:] if e["kind"] == "apiserver_restart"]
    assert sorted(restarts) == sorted(m for m in env.machine_names if "-cp-" in m)
    # one at a time: each restart is ready before the next starts
    ready_or_restart = [e["kind"] for e in env.talos.history.events[since:]
                        if e["kind"] in ("apiserver_restart", "apiserver_ready")]
    assert ready_or_restart == ["apiserver_restart", "apiserver_ready"] * 3


async def test_config_apply_creates_a_plan_only_operation_and_prints_the_plan(world: World) -> None:
    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    boots = {m: world.env.node(m).boots for m in world.env.machine_names}
    got: list[Obj] = []

    async def apply() -> None:
        got.append(await config_apply(world.kube, world.env.cluster_name, world.env.namespace,
                                      max_unavailable=MaxUnavailable(count=2),
                                      wait=30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(apply)

        async def answered() -> bool:
            return bool(got)

        await world.run_until(answered, what="config-apply's plan")
    op = got[0]
    assert op["spec"]["paused"] is True and op["spec"]["maxUnavailable"] == 2
    text = format_plan(op)
    lines = text.splitlines()
    assert lines[1].split() == ["ORDER", "MACHINE", "ROLE", "CHANGE", "FIELDS"]
    assert [ln.split()[1] for ln in lines[2:7]] == [m for m in world.env.machine_names if "-cp-" in m] + \
        [m for m in world.env.machine_names if "-worker-" in m]
    assert "KernelModuleConfig" in lines[2]
    assert (f"plan only; start it with: kubectl -n {world.env.namespace} patch talosoperation "
            f"{op['metadata']['name']} --type merge -p '{{\"spec\":{{\"paused\":false}}}}'") in text
    assert {m: world.env.node(m).boots for m in world.env.machine_names} == boots


async def test_workers_go_up_to_max_unavailable_at_once_and_the_last_alone(bundle: SecretsBundle) -> None:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=1, workers=5,
                              management_api="separate") as env, contextlib.asynccontextmanager(world_on)(
                                  env, TIMING) as world:
        if True:
            await world.patch_cluster([REBOOT_PATCH])
            await _reported(world, "rebootPaths", 6)
            since = len(env.talos.history.events)
            cordoned: list[int] = []

            def count(_change: Any, rt: Any) -> None:
                if rt.plural == "nodes":
                    nodes = env.kube.store.list(rt, None)[0]
                    cordoned.append(sum(1 for n in nodes if (n.get("spec") or {}).get("unschedulable")))

            env.kube.store.listeners.append(count)
            # The cluster's maxUnavailable, a percentage: 40% of 5 workers, rounded down, is 2.
            await crds.clusters(world.kube).patch(env.namespace, env.cluster_name, {"spec": {"maxUnavailable": "40%"}})
            await _create(world, "wide", paused=False)
            op = await _phase(world, "wide", "Completed", "Failed", "Paused")
            assert op["status"]["phase"] == "Completed", op["status"]
            assert op["status"]["plan"]["workerBound"] == {
                "atOnce": 2, "maxUnavailable": "40%", "source": "cluster", "workers": 5,
                "message": "workers 2 at a time (maxUnavailable 40% of 5 workers, the TalosCluster's)"}
            assert op["status"]["plan"]["kubernetesAPIUnavailable"] is True
            assert reboots(env, since) == {m: 1 for m in env.machine_names}
            assert most_down_at_once(env, f"{env.cluster_name}-worker-", since) <= 2
            assert max(cordoned) == 2  # two workers out of service together, never three
            done = op["status"]["roll"]["done"]
            assert done[0] == f"{env.cluster_name}-cp-1" and done[-1] == f"{env.cluster_name}-worker-5"
            # the last one went alone: nothing else was down while it was
            downs = [e for e in env.talos.history.events[since:] if e["kind"] == "down"]
            assert downs[-1]["node"] == f"{env.cluster_name}-worker-5"
            assert await _cordoned(world) == []
            assert not op["status"].get("workerRolls")


async def test_a_node_that_does_not_come_back_pauses_naming_it(world: World) -> None:
    env = world.env
    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    first = f"{env.cluster_name}-cp-1"

    def never_back(event: dict[str, Any]) -> None:
        if event["kind"] == "down" and event.get("node") == first:
            env.node(first).faults.unreachable = True  # it went down for the reboot and does not come up

    env.talos.history.listeners.append(never_back)
    await _create(world, "stuck", paused=False)

    async def timed_out() -> bool:
        o = await world.op("stuck")
        return "did not come back" in str((o.get("status") or {}).get("message"))

    await world.run_until(timed_out, steps=4000, what="the node action bound")
    op = await world.op("stuck")
    assert op["status"]["phase"] == "Paused" and first in op["status"]["message"]
    assert all(env.node(m).boots == (2 if m == first else 1) for m in env.machine_names)  # nothing else went


async def test_no_control_plane_reboots_while_etcd_is_not_whole_by_the_etcd_rolls_own_check(world: World) -> None:
    """The gate is managed.etcd_health: kube-apiserver not ready on another control plane holds the first
    reboot (a check the config gate of its own did not make), and an alarm is named first; cleared, it goes on."""
    env = world.env
    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    third = f"{env.cluster_name}-cp-3"
    since = len(env.talos.history.events)
    env.node(third).apiserver_ready = False
    await _create(world, "whole", paused=False)

    def held_on(text: str) -> Callable[[], Awaitable[bool]]:
        async def there() -> bool:
            return text in str(((await world.op("whole")).get("status") or {}).get("message"))
        return there

    await world.run_until(held_on(f"kube-apiserver on {third} is not ready"), what="the etcd gate")
    for _ in range(10):
        await world.step()
    op = await world.op("whole")
    assert f"{env.cluster_name}-cp-1: etcd is not whole" in op["status"]["message"], op["status"]["message"]
    assert set(reboots(env, since).values()) == {0}  # nothing rebooted while etcd is not whole

    env.node(f"{env.cluster_name}-cp-2").raise_etcd_alarm(2)
    await world.run_until(held_on("the alarm CORRUPT"), what="the alarm named")
    first_named = op_message(await world.op("whole")).split("reboots now: ", 1)[1].split(";")[0]
    assert "alarm CORRUPT" in first_named, first_named  # what waiting will not clear comes first
    assert set(reboots(env, since).values()) == {0}

    env.talos.etcd.disarm(f"{env.cluster_name}-cp-2")
    env.node(third).apiserver_ready = True
    op = await _phase(world, "whole", "Completed", "Failed", "Paused")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == {m: 1 for m in env.machine_names}


def op_message(op: Obj) -> str:
    return str((op.get("status") or {}).get("message") or "")


async def test_a_node_that_boots_without_the_staged_configuration_fails_and_is_uncordoned(world: World) -> None:
    env = world.env
    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    first = f"{env.cluster_name}-cp-1"
    node = env.node(first)

    def lose_the_stage(event: dict[str, Any]) -> None:
        if event["kind"] == "down" and event.get("node") == first:
            node.persistent = node.running  # the staged configuration does not survive to the next boot

    env.talos.history.listeners.append(lose_the_stage)
    await _create(world, "wrong", paused=False)

    async def failed_verify() -> bool:
        o = await world.op("wrong")
        return "does not run the rendered configuration" in str((o.get("status") or {}).get("message"))

    await world.run_until(failed_verify, what="the verification failure")
    op = await world.op("wrong")
    assert op["status"]["phase"] == "Paused" and first in op["status"]["message"]
    assert node.boots == 2  # rebooted once, never twice
    assert env.node(f"{env.cluster_name}-cp-2").boots == 1  # the rollout stopped there
    assert await _cordoned(world) == []
    machine = next(m for m in await world.machines() if m["metadata"]["name"] == first)
    assert _cond(machine)["reason"] == "Failed"


async def test_deleted_mid_rollout_it_releases_its_cordon_and_the_lock(world: World) -> None:
    """A rollout deleted while a node is cordoned (draining under a PDB that never allows) gives the Node back
    before it lets go of the lock: no Node is left cordoned by ichord, the operation is gone."""
    env = world.env
    await world.deploy_app(replicas=1, min_available=1)
    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    await _create(world, "gone", paused=False)

    async def cordoned() -> bool:
        return bool(await _cordoned(world))

    await world.run_until(cordoned, what="a Node cordoned by the rollout")
    await crds.operations(world.kube).delete(env.namespace, "gone")

    async def gone() -> bool:
        ops, _ = await crds.operations(world.kube).list_objects(env.namespace)
        return not any(o["metadata"]["name"] == "gone" for o in ops)

    await world.run_until(gone, what="the operation gone")
    assert await _cordoned(world) == []


async def test_a_worker_is_dialled_once_per_boot_not_once_per_step(bundle: SecretsBundle,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollout keeps the cluster's Talos client across steps (its channels and its minted certificate) and drops
    a node's channel once it is asked to reboot: a worker's Talos API sees a connection before its reboot and one
    after, whatever the number of steps in between (a client per step dialled every worker under way, every step:
    here about ten while each node takes a second to shut down)."""
    from ichord.sim.talos import server as talos_server

    timings = dataclasses.replace(scaled(0.01), reboot_shutdown=1.0)
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=1, workers=4, timings=timings,
                              management_api="separate") as env, contextlib.asynccontextmanager(world_on)(
                                  env, TIMING) as world:
        await world.patch_cluster([REBOOT_PATCH])
        await _reported(world, "rebootPaths", 5)
        dialled: dict[str, int] = {}
        made = talos_server._Connection.connection_made

        def counted(conn: Any, transport: Any) -> None:
            node = next((n for n, s in env.talos._servers.items() if s is conn.server), "?")
            dialled[node] = dialled.get(node, 0) + 1
            made(conn, transport)

        monkeypatch.setattr(talos_server._Connection, "connection_made", counted)
        await _create(world, "kept", paused=False, maxUnavailable=2)
        op = await _phase(world, "kept", "Completed", "Failed", "Paused")
        assert op["status"]["phase"] == "Completed", op["status"]
        workers = [n for n in env.talos.nodes if "-worker-" in n]
        # The rollout's own connections (before the reboot, once more after asking for it, after the new boot) and
        # the machine reconciler's (its own client: one a boot).
        assert all(dialled.get(w, 0) <= 5 for w in workers), dialled


async def _put_secrets(world: World, bundle: SecretsBundle) -> None:
    """Replace secrets.yaml in the cluster's bundle Secret (a restore from the wrong file, a copy-paste)."""
    env = world.env
    data = base64.b64encode(bundle.to_yaml().encode()).decode()
    await world.kube.raw("PATCH", f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}",
                         body={"data": {names.SECRETS_KEY: data}}, content_type="application/merge-patch+json")


async def test_another_clusters_etcd_ca_swapped_under_a_running_rollout_stops_it_until_the_bundle_is_back(
        world: World, bundle: SecretsBundle) -> None:
    """docs/decisions.md#bundle-belongs: the rollout is under way (one control plane done) when another cluster's
    etcd CA lands in the bundle Secret. Its next apply would roll that CA onto the next control plane (etcd peers
    that no longer trust each other): it stops, Paused with ConfigRollout=False/BundleMismatch naming both
    fingerprints, and no node receives anything more; the cluster's own bundle back, it completes by itself."""
    env = world.env
    other = generate_bundle()
    await world.patch_cluster([REBOOT_PATCH])
    await _reported(world, "rebootPaths", 5)
    since = len(env.talos.history.events)
    await _create(world, "roll", paused=False)
    first = f"{env.cluster_name}-cp-1"

    async def first_done() -> bool:
        return first in (((await world.op("roll")).get("status") or {}).get("roll") or {}).get("done", [])

    await world.run_until(first_done, what=f"{first} rolled out")
    await _put_secrets(world, bundle.with_cas({CAKind.ETCD: other.etcd}))
    applies = {m: len(env.applies(m)) for m in env.machine_names}

    async def stopped() -> bool:
        return _cond(await world.op("roll")).get("reason") == names.BUNDLE_MISMATCH

    await world.run_until(stopped, what="the rollout stopped on the bundle")
    op = await world.op("roll")
    assert op["status"]["phase"] == "Paused", op["status"]
    message = _cond(op)["message"]
    assert f"the bundle's etcd CA {ca_fingerprint(other.etcd)} is not among the CAs the node trusts " \
           f"({ca_fingerprint(bundle.etcd)})" in message, message
    for _ in range(30):  # retried, and still nothing reaches a node
        await world.step()
        await anyio.sleep(0.01)
    assert {m: len(env.applies(m)) for m in env.machine_names} == applies
    assert _cond(await world.op("roll"))["reason"] == names.BUNDLE_MISMATCH

    await _put_secrets(world, bundle)
    op = await _phase(world, "roll", "Completed", "Failed")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == {m: 1 for m in env.machine_names}


async def test_another_clusters_aggregator_ca_swapped_under_an_api_server_restart_rollout_stops_it(
        world: World, bundle: SecretsBundle) -> None:
    """The kube-apiserver restart class (apiserver.py's apply): another cluster's aggregator CA lands in the Secret
    once the first control plane restarted; the next one receives nothing (BundleMismatch), and the rollout
    completes once the cluster's own bundle is back."""
    env = world.env
    other = generate_bundle()
    await world.patch_cluster([API_SERVER_PATCH])
    await _reported(world, "apiServerRestartPaths", 3)
    since = len(env.talos.history.events)
    await _create(world, "restart", paused=False)

    async def first_done() -> bool:
        return bool((((await world.op("restart")).get("status") or {}).get("apiServerRestart") or {}).get("done"))

    await world.run_until(first_done, what="the first control plane restarted")
    await _put_secrets(world, bundle.with_cas({CAKind.AGGREGATOR: other.k8s_aggregator}))
    applies = {m: len(env.applies(m)) for m in env.machine_names}

    async def stopped() -> bool:
        return _cond(await world.op("restart")).get("reason") == names.BUNDLE_MISMATCH

    await world.run_until(stopped, what="the rollout stopped on the bundle")
    message = _cond(await world.op("restart"))["message"]
    assert f"the bundle's Kubernetes aggregator (front-proxy) CA {ca_fingerprint(other.k8s_aggregator)} is not " \
           f"among the CAs the node trusts ({ca_fingerprint(bundle.k8s_aggregator)})" in message, message
    for _ in range(30):
        await world.step()
        await anyio.sleep(0.01)
    assert {m: len(env.applies(m)) for m in env.machine_names} == applies

    await _put_secrets(world, bundle)
    op = await _phase(world, "restart", "Completed", "Failed")
    assert op["status"]["phase"] == "Completed", op["status"]
    restarts = [e["node"] for e in env.talos.history.events[since:] if e["kind"] == "apiserver_restart"]
    assert sorted(restarts) == sorted(m for m in env.machine_names if "-cp-" in m)
