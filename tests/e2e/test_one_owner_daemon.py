"""`ichord run` as a subprocess: a node another cluster's machine holds is handed over when that machine goes, woken
by the owner index (docs/decisions.md#one-owner), not by the drift resync (an hour here)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ichord.api import names
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import Daemon, all_ready, eventually, machine_ready

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SAFE_PATCH = "machine:\n  sysctls:\n    net.core.somaxconn: \"4096\"\n"


@pytest.fixture
async def kube(sim_env: SimEnvironment) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(sim_env.kubeconfig)
    yield client
    await client.close()


async def test_a_node_held_by_another_cluster_s_machine_is_handed_over_when_it_goes(
        sim_env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    env = sim_env
    worker = env.machine_names[-1]
    ns = env.namespace
    # Another TalosCluster (the same CAs in a Secret of its own) with a machine naming the worker's node.
    data = (await kube.raw("GET", f"/api/v1/namespaces/{ns}/secrets/{env.secret_name}"))["data"]
    await kube.raw("POST", f"/api/v1/namespaces/{ns}/secrets", body={
        "metadata": {"name": "zz-other-secrets", "labels": {names.BUNDLE_LABEL: "true"}}, "type": "Opaque",
        "data": data})
    home = await crds.clusters(kube).get(ns, env.cluster_name)
    await crds.clusters(kube).create(ns, {"metadata": {"name": "zz-other"}, "spec": {
        **home["spec"], "clusterName": env.cluster_name, "secretsRef": {"name": "zz-other-secrets"}}})
    address = (await crds.machines(kube).get(ns, worker))["spec"]["address"]
    await crds.machines(kube).create(ns, {"metadata": {"name": "zz-dup"}, "spec": {
        "clusterRef": {"name": "zz-other"}, "role": "worker", "address": address, "approved": True,
        "patches": [SAFE_PATCH]}})
    daemon = Daemon(env, tmp_path, "replica-0", resync=3600)
    try:
        async def refused() -> bool:
            r = await machine_ready(kube, env, "zz-dup")
            return r is not None and r["reason"] == names.ReadyReason.ADDRESS_IN_USE

        await eventually(refused, what="the second machine refused")
        await eventually(lambda: all_ready(kube, env), what="the cluster's own machines converged")
        assert env.applies(worker) == []

        await crds.machines(kube).delete(ns, worker)

        async def taken_over() -> bool:
            r = await machine_ready(kube, env, "zz-dup")
            return r is not None and r["status"] == "True"

        await eventually(taken_over, what="the second machine holds the node")
        assert len(env.applies(worker)) == 1  # the second machine's configuration, once
    finally:
        await daemon.stop()
