"""Issue 19: what one step of a cluster actor writes to the API, counted by the simulator's request log.

Converging a fleet is paid per request: a cold step writes the cluster's expiry status and its Ready condition
in one PATCH (both are known once the bundle is read) and each machine's status once, and reads the TalosCluster
back never. A copy that went stale meanwhile still costs only a 409 and a fresh read, never another
writer's update.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import Condition, find
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.kube.status import update_status
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._actor import cluster_actor
from tests.integration._kube_helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = replace(Timing().scaled(0.01))


async def test_a_cold_step_writes_each_object_once_and_reads_no_cluster_back(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        env.management.requests.clear()

        async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as reconciler:
            await reconciler.step({})
        log = env.management.requests
        assert log.count("get", resource="talosclusters") == 0
        assert log.count("patch", resource="talosclusters") == 1  # expiry status and Ready, known in the same step
        assert log.count("patch", resource="talosmachines") == len(env.machine_names)
        assert log.count(status=409) == 0
        cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
        assert find(cluster["status"]["conditions"], names.READY)["status"] == "True"
        assert [c["name"] for c in cluster["status"]["certificates"]]  # the expiry write was not lost
        for name in env.machine_names:
            machine = await crds.machines(kube).get(env.namespace, name)
            ready = find(machine["status"]["conditions"], names.READY)
            assert (ready["status"], ready["reason"]) == ("True", "Converged")


async def test_a_stale_copy_costs_a_conflict_never_another_writers_update(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        stale = await crds.clusters(kube).get(env.namespace, env.cluster_name)

        def other_writer(status: dict[str, object], _obj: object) -> dict[str, object]:
            status["earliestExpiry"] = "2099-01-01T00:00:00Z"
            return status

        await update_status(crds.clusters(kube), env.namespace, env.cluster_name, other_writer)
        env.management.requests.clear()

        async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as reconciler:
            assert await reconciler._writes.set_cluster_ready(  # the write under test
                stale, Condition(names.READY, "True", "Reconciled", "the bundle is readable"))
        log = env.management.requests
        assert log.count("patch", status=409, resource="talosclusters") == 1
        assert log.count("get", resource="talosclusters") == 1  # the fresh read after the conflict
        cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
        assert cluster["status"]["earliestExpiry"] == "2099-01-01T00:00:00Z"
        assert find(cluster["status"]["conditions"], names.READY)["reason"] == "Reconciled"


async def test_a_machine_is_not_read_again_before_its_resync_unless_its_inputs_change(env: SimEnvironment) -> None:
    """Issue 32: a cluster that steps often (a config rollout's steps, many a minute) does not read every machine's
    node on each step; a machine is read again at its own resync, or at once when its TalosMachine changes."""
    def rpcs() -> dict[str, int]:  # the simulated nodes' own count of the calls they served
        return {name: sum(env.node(name).rpcs.values()) for name in env.machine_names}

    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING, resync=3600) as reconciler:
        machines = reconciler.rt.machines

        async def caught_up() -> None:  # the informer holds what the server holds (the step's own writes)
            served = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                      for o in (await crds.machines(kube).list_objects(env.namespace))[0]}
            await eventually(lambda: all((machines.get(env.namespace, n) or {}).get("metadata", {}).get(
                "resourceVersion") == rv for n, rv in served.items()))

        await reconciler.step({})
        await caught_up()
        before = rpcs()
        assert all(before.values())  # the cold step read every node once
        for _ in range(3):  # each machine's own status write changed its object, but not what it is reconciled from
            await reconciler.step({})
        assert rpcs() == before  # converged, not due: no node read

        first = env.machine_names[0]
        await crds.machines(kube).patch(env.namespace, first, {"metadata": {"annotations": {"touched": "1"}}})
        await caught_up()
        await reconciler.step({})
        read = {name: n - before[name] for name, n in rpcs().items() if n != before[name]}
        assert list(read) == [first] and read[first] > 0


@pytest.mark.parametrize("spoil", ["spec", "unlabelled"])
async def test_the_expiry_write_carries_ready_only_when_nothing_later_can_change_it(env: SimEnvironment,
                                                                                     spoil: str) -> None:
    """A spec that does not render (Ready False, InvalidSpec) or a bundle Secret still to be labelled (the label
    write may be refused: Ready False, Forbidden) leaves Ready to the machines phase: the expiry write never says
    Ready=True first, and the cluster is written twice (expiry, then Ready) as before."""
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
        if spoil == "spec":
            await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"install": {"disk": "sda"}}})
        else:
            secret = cluster["spec"]["secretsRef"]["name"]
            await kube.raw("PATCH", f"/api/v1/namespaces/{env.namespace}/secrets/{secret}",
                           body={"metadata": {"labels": {names.BUNDLE_LABEL: None}}},
                           content_type="application/merge-patch+json")
        env.management.requests.clear()

        async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as reconciler:
            writes: list[Any] = []  # the TalosCluster as each of the step's writes returned it
            wrote = reconciler._writes.wrote

            def spy(obj: Any) -> None:
                writes.append(obj)
                wrote(obj)

            reconciler._writes.wrote = spy  # type: ignore[method-assign,assignment]
            await reconciler.step({})
        expiry_written = writes[0]["status"]
        assert expiry_written["certificates"]
        assert find(expiry_written.get("conditions"), names.READY) is None
        assert env.management.requests.count("patch", resource="talosclusters") == 2
        cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
        ready = find(cluster["status"]["conditions"], names.READY)
        assert ready is not None
        expected = ("False", "InvalidSpec") if spoil == "spec" else ("True", "Reconciled")
        assert (ready["status"], ready["reason"]) == expected
