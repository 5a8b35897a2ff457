"""Issue 19: what one step of a cluster actor writes to the API, counted by the simulator's request log.

Converging a fleet is paid per request: a cold step writes the cluster's expiry status, its Ready condition and
each machine's status once, and reads the TalosCluster back never (the Ready write starts from the object the
expiry write returned). A copy that went stale meanwhile still costs only a 409 and a fresh read, never another
writer's update.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ichord.api import names
from ichord.api.conditions import Condition, find
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.kube.status import update_status
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._actor import cluster_actor

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = replace(Timing().scaled(0.01))


async def test_a_cold_step_writes_each_object_once_and_reads_no_cluster_back(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        env.management.requests.clear()

        async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as reconciler:
            await reconciler.step({})
        log = env.management.requests
        assert log.count("get", resource="talosclusters") == 0
        assert log.count("patch", resource="talosclusters") == 2  # expiry status, then Ready
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
