"""Issue 39: one owner per node address and per bundle Secret (docs/decisions.md#one-owner), on the simulators.

Two TalosMachines naming one node used to take turns: each resync applied one's configuration over the other's
(ConfigApplied every time, both Converged in between). Two TalosClusters naming one bundle Secret were both
accepted, and a rotation of either would replace the CAs the other's nodes trust. The one created first keeps
it; the other says who holds it, and nothing is applied or started for it until that one is gone.

Every object the test adds is named after the simulated cluster's own (``zz-...``), so the holder is the same
whether both were created in one second (the order then falls to namespace and name) or not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from ichord.actors.cluster import ClusterReconciler
from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.operation_cli import Refused, rotate, rotation_object
from ichord.operations.config.cli import config_apply
from ichord.pki.bundle import SecretsBundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._actor import cluster_actor
from tests.integration._kube_helpers import eventually
from tests.integration.conftest import ENV_SCALE

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = replace(Timing().scaled(0.01))
#: A difference the reconciler applies without a reboot: what made the two machines' renders differ.
SAFE = "machine:\n  sysctls:\n    net.core.somaxconn: \"4096\"\n"


def _ready(obj: dict[str, Any]) -> tuple[str, str, str]:
    cond = find((obj.get("status") or {}).get("conditions"), names.READY) or {}
    return cond.get("status", ""), cond.get("reason", ""), cond.get("message", "")


async def _machine(kube: KubeClient, env: SimEnvironment, name: str) -> dict[str, Any]:
    return await crds.machines(kube).get(env.namespace, name)


async def _cached(reconciler: ClusterReconciler, kind: str, namespace: str, name: str, present: bool = True) -> None:
    informer = reconciler.rt.machines if kind == names.TALOS_MACHINE else reconciler.rt.clusters
    await eventually(lambda: (informer.cache.get((namespace, name)) is not None) == present)


async def _second_cluster(kube: KubeClient, env: SimEnvironment, name: str, secret: str) -> None:
    """A TalosCluster like the simulated one (same Talos cluster name), its bundle in Secret ``secret``."""
    home = await crds.clusters(kube).get(env.namespace, env.cluster_name)
    spec = {**home["spec"], "clusterName": env.cluster_name, "secretsRef": {"name": secret}}
    await crds.clusters(kube).create(env.namespace, {"metadata": {"name": name}, "spec": spec})


async def _copy_bundle(kube: KubeClient, env: SimEnvironment, secret: str) -> None:
    """The same CAs in a Secret of its own: the second cluster can reach the nodes, as a copied manifest would."""
    data = (await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}"))["data"]
    await kube.raw("POST", f"/api/v1/namespaces/{env.namespace}/secrets", body={
        "metadata": {"name": secret, "labels": {names.BUNDLE_LABEL: "true"}}, "type": "Opaque", "data": data})


@pytest.mark.parametrize("where", ["same-cluster", "other-cluster"])
async def test_a_second_machine_at_an_address_is_refused_until_the_first_is_gone(env: SimEnvironment,
                                                                                 where: str) -> None:
    worker = env.machine_names[-1]
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING, resync=0) as home:
        await home.step({})
        assert _ready(await _machine(kube, env, worker))[1] == names.ReadyReason.CONVERGED
        address = (await _machine(kube, env, worker))["spec"]["address"]
        cluster = env.cluster_name
        if where == "other-cluster":
            cluster = "zz-other"
            await _copy_bundle(kube, env, "zz-other-secrets")
            await _second_cluster(kube, env, cluster, "zz-other-secrets")
            await _cached(home, names.TALOS_CLUSTER, env.namespace, cluster)
        # The same node spelled another way: the default port made explicit.
        spelled = address if ":" in address else f"{address}:50000"
        await crds.machines(kube).create(env.namespace, {"metadata": {"name": "zz-dup"}, "spec": {
            "clusterRef": {"name": cluster}, "role": "worker", "address": spelled, "approved": True,
            "patches": [SAFE]}})
        await _cached(home, names.TALOS_MACHINE, env.namespace, "zz-dup")
        second = home if cluster == env.cluster_name else ClusterReconciler(home.rt, env.namespace, cluster)
        before = env.applies(worker)

        for _ in range(4):  # every step reads every node again (resync 0): the old flip-flop showed at once
            await home.step({})
            if second is not home:
                await second.step({})
            status, reason, message = _ready(await _machine(kube, env, "zz-dup"))
            assert (status, reason) == ("False", names.ReadyReason.ADDRESS_IN_USE), message
            assert f"TalosMachine {env.namespace}/{worker}" in message
            assert _ready(await _machine(kube, env, worker))[1] == names.ReadyReason.CONVERGED
        assert env.applies(worker) == before  # nothing of the second machine's configuration reached the node
        events = (await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
        assert [e["type"] for e in events if e["reason"] == names.ReadyReason.ADDRESS_IN_USE
                and e["involvedObject"]["name"] == "zz-dup"] == ["Warning"]  # once, not per step

        await crds.machines(kube).delete(env.namespace, worker)
        await _cached(home, names.TALOS_MACHINE, env.namespace, worker, present=False)
        await second.step({})
        assert _ready(await _machine(kube, env, "zz-dup"))[:2] == ("True", names.ReadyReason.APPLIED)
        assert len(env.applies(worker)) == len(before) + 1  # the node is the second machine's now
        await second.step({})
        assert _ready(await _machine(kube, env, "zz-dup"))[:2] == ("True", names.ReadyReason.CONVERGED)
        second.close()


async def test_a_second_cluster_on_one_bundle_secret_is_refused_and_runs_no_operation(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as home:
        await _second_cluster(kube, env, "zz-twin", env.secret_name)
        await crds.machines(kube).create(env.namespace, {"metadata": {"name": "zz-twin-worker"}, "spec": {
            "clusterRef": {"name": "zz-twin"}, "role": "worker", "address": "127.0.0.1:1", "approved": True}})
        op = rotation_object("zz-twin", "zz-twin-rotation", targets=None, max_unavailable=None, start=True)
        await crds.operations(kube).create(env.namespace, op)
        await _cached(home, names.TALOS_CLUSTER, env.namespace, "zz-twin")
        await eventually(lambda: home.rt.operations.cache.get((env.namespace, "zz-twin-rotation")) is not None)
        await _cached(home, names.TALOS_MACHINE, env.namespace, "zz-twin-worker")
        twin = ClusterReconciler(home.rt, env.namespace, "zz-twin")
        try:
            for _ in range(3):
                await twin.step({})
                await home.step({})
        finally:
            twin.close()

        status, reason, message = _ready(await crds.clusters(kube).get(env.namespace, "zz-twin"))
        assert (status, reason) == ("False", names.ReadyReason.BUNDLE_IN_USE), message
        assert f"TalosCluster {env.namespace}/{env.cluster_name}" in message
        assert f"{env.namespace}/{env.secret_name}" in message
        assert _ready(await crds.clusters(kube).get(env.namespace, env.cluster_name))[0] == "True"  # the holder's
        assert _ready(await _machine(kube, env, "zz-twin-worker"))[:2] == ("False", names.ReadyReason.BUNDLE_IN_USE)

        rotation = await crds.operations(kube).get(env.namespace, "zz-twin-rotation")
        cond = find(rotation["status"]["conditions"], names.CA_ROTATION) or {}
        assert (rotation["status"]["phase"], cond.get("reason")) == (names.Phase.PENDING,
                                                                      names.ReadyReason.BUNDLE_IN_USE)
        assert f"TalosCluster {env.namespace}/{env.cluster_name}" in cond.get("message", "")
        assert not (rotation["status"].get("caRotation") or {}).get("stage")
        secret = await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}")
        assert names.ROTATION_KEY not in secret["data"]  # the shared CAs were never touched
        leases = (await kube.raw("GET", f"/apis/coordination.k8s.io/v1/namespaces/{env.namespace}/leases"))["items"]
        assert f"{names.CLUSTER_LOCK_PREFIX}zz-twin" not in [lease["metadata"]["name"] for lease in leases]

        # The commands refuse what the daemon would hold (exit 2), and create nothing.
        ops_before = len((await crds.operations(kube).list_objects(env.namespace))[0])
        with pytest.raises(Refused, match=f"TalosCluster {env.namespace}/zz-twin runs no operation: the bundle Secret"):
            await rotate(kube, "zz-twin", env.namespace, start=True, wait=0)
        with pytest.raises(Refused, match=f"is TalosCluster {env.namespace}/{env.cluster_name}'s"):
            await config_apply(kube, "zz-twin", env.namespace, wait=0)
        assert len((await crds.operations(kube).list_objects(env.namespace))[0]) == ops_before


async def test_a_refused_machine_is_in_no_operation_of_its_cluster(env: SimEnvironment) -> None:
    """The holder's cluster plans a rotation: the machine whose node another holds is in no plan (no pass would
    apply the stage's render of it over the holder's)."""
    worker = env.machine_names[-1]
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as home:
        address = (await _machine(kube, env, worker))["spec"]["address"]
        await crds.machines(kube).create(env.namespace, {"metadata": {"name": "zz-dup"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "role": "worker", "address": address, "approved": True}})
        op = rotation_object(env.cluster_name, "zz-rotation", targets=None, max_unavailable=None, start=False)
        await crds.operations(kube).create(env.namespace, op)
        await _cached(home, names.TALOS_MACHINE, env.namespace, "zz-dup")
        await eventually(lambda: home.rt.operations.cache.get((env.namespace, "zz-rotation")) is not None)
        await home.step({})
        plan = (await crds.operations(kube).get(env.namespace, "zz-rotation"))["status"]["plan"]
        assert [m["name"] for m in plan["machines"]] == env.machine_names  # the holder's, not zz-dup


@pytest.fixture
async def two_workers(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=ENV_SCALE, control_planes=1, workers=2) as e:
        yield e


async def test_a_second_machine_with_a_hostname_of_its_cluster_is_refused(two_workers: SimEnvironment) -> None:
    """Two TalosMachines of one cluster with one spec.hostname were both Applied: two nodes that register as one
    Kubernetes Node. The later (creationTimestamp, then name) says who has the name and gets nothing applied; a
    machine of another cluster with the same hostname is no conflict (its own Kubernetes)."""
    env = two_workers
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING, resync=0) as home:
        await home.step({})
        objs = {n: await _machine(kube, env, n) for n in env.machine_names[-2:]}
        holder, later = sorted(objs, key=lambda n: (objs[n]["metadata"]["creationTimestamp"], n))
        await crds.machines(kube).patch(env.namespace, holder, {"spec": {"hostname": "shared"}})
        await crds.machines(kube).patch(env.namespace, later, {"spec": {"hostname": "Shared."}})  # the same name
        await _copy_bundle(kube, env, "zz-other-secrets")
        await _second_cluster(kube, env, "zz-other", "zz-other-secrets")
        await crds.machines(kube).create(env.namespace, {"metadata": {"name": "zz-elsewhere"}, "spec": {
            "clusterRef": {"name": "zz-other"}, "role": "worker", "address": "127.0.0.1:1", "approved": True,
            "hostname": "shared"}})
        await _cached(home, names.TALOS_CLUSTER, env.namespace, "zz-other")
        await _cached(home, names.TALOS_MACHINE, env.namespace, "zz-elsewhere")
        await eventually(lambda: all((home.rt.machines.cache.get((env.namespace, n)) or {}).get("spec", {})
                                     .get("hostname") for n in (holder, later)))
        other = ClusterReconciler(home.rt, env.namespace, "zz-other")
        before = env.applies(later)
        try:
            for _ in range(3):
                await home.step({})
                await other.step({})
                status, reason, message = _ready(await _machine(kube, env, later))
                assert (status, reason) == ("False", names.ReadyReason.HOSTNAME_IN_USE), message
                assert f"TalosMachine {env.namespace}/{holder}'s too" in message
                assert _ready(await _machine(kube, env, holder))[1] != names.ReadyReason.HOSTNAME_IN_USE
                assert _ready(await _machine(kube, env, "zz-elsewhere"))[1] != names.ReadyReason.HOSTNAME_IN_USE
        finally:
            other.close()
        assert env.applies(later) == before  # nothing of the later machine's configuration reached its node
        assert env.applies(holder)  # the holder's hostname was applied
        events = (await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
        assert [e["type"] for e in events if e["reason"] == names.ReadyReason.HOSTNAME_IN_USE
                and e["involvedObject"]["name"] == later] == ["Warning"]  # once, not per step

        await crds.machines(kube).patch(env.namespace, later, {"spec": {"hostname": "other-name"}})
        await eventually(lambda: (home.rt.machines.cache.get((env.namespace, later)) or {}).get("spec", {})
                         .get("hostname") == "other-name")
        await home.step({})
        assert _ready(await _machine(kube, env, later))[1] != names.ReadyReason.HOSTNAME_IN_USE
        assert len(env.applies(later)) > len(before)  # a name of its own: applied
