"""Issue 27: a 403 from the management API becomes a condition on the object it blocks (reason Forbidden, naming the
verb, the resource, the namespace and the chart value that grants it) and exactly one Warning Event, never only a
log line. The simulator refuses the listed requests in kube-apiserver's words (Faults.denied); the cluster's actor
steps over the real wire, as the leader runs it, with its objects outside the controller namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._actor import cluster_actor
from tests.integration._config_world import REBOOT_PATCH, World, reboots, world_on

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = Timing().scaled(0.01)
TEAM = "team-a"  # the TalosCluster, its machines and its bundle Secret
CONTROLLER = "ichord-system"  # where ichord runs: nothing of the cluster is there


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=1, workers=1, namespace=TEAM) as e:
        yield e


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as client:
        yield client


async def _steps(kube: KubeClient, env: SimEnvironment, count: int) -> None:
    """``count`` steps of the actor of TalosCluster team-a/demo, as the leader runs them."""
    async with cluster_actor(kube, CONTROLLER, TEAM, env.cluster_name, TIMING) as reconciler:
        for _ in range(count):
            await reconciler.step({})


async def _events(kube: KubeClient, kind: str, name: str, reason: str) -> list[dict[str, Any]]:
    items = (await kube.raw("GET", f"/api/v1/namespaces/{TEAM}/events"))["items"]
    return [e for e in items if e["reason"] == reason
            and (e["involvedObject"]["kind"], e["involvedObject"]["name"]) == (kind, name)]


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    cond = find((obj.get("status") or {}).get("conditions"), names.READY)
    assert cond is not None, obj.get("status")
    return cond


async def test_a_refused_bundle_read_is_forbidden_on_the_cluster_and_its_machines(env: SimEnvironment,
                                                                                 kube: KubeClient) -> None:
    env.management.faults.denied = {("get", "secrets", TEAM)}
    await _steps(kube, env, 3)

    cluster = await crds.clusters(kube).get(TEAM, env.cluster_name)
    ready = _ready(cluster)
    assert (ready["status"], ready["reason"]) == ("False", "Forbidden"), ready
    for part in ("get secrets in namespace team-a", f"Secret {TEAM}/{env.secret_name}", "chart value watchNamespaces",
                 "403 Forbidden"):
        assert part in ready["message"], (part, ready["message"])
    for machine in env.machine_names:
        m_ready = _ready(await crds.machines(kube).get(TEAM, machine))
        assert (m_ready["status"], m_ready["reason"]) == ("False", "Forbidden"), m_ready
        assert "watchNamespaces" in m_ready["message"]
    warnings = await _events(kube, names.TALOS_CLUSTER, env.cluster_name, "Forbidden")
    assert [(e["type"], e.get("count", 1)) for e in warnings] == [("Warning", 1)], warnings  # one, over three steps
    assert "watchNamespaces" in warnings[0]["message"]

    # The grant is added: the next step reads the bundle and the cluster is Ready again.
    env.management.faults.denied = set()
    await _steps(kube, env, 1)
    assert _ready(await crds.clusters(kube).get(TEAM, env.cluster_name))["status"] == "True"


async def test_a_refused_lock_lease_is_forbidden_on_the_operation_and_nothing_starts(env: SimEnvironment,
                                                                                    kube: KubeClient) -> None:
    await _steps(kube, env, 1)  # converged first, with every grant
    env.management.faults.denied = {("*", "leases", TEAM)}
    await crds.operations(kube).create(TEAM, {"metadata": {"name": "rotate"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": names.KIND_CA_ROTATION}})
    await _steps(kube, env, 3)

    op = await crds.operations(kube).get(TEAM, "rotate")
    cond = find(op["status"]["conditions"], names.CA_ROTATION)
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Forbidden"), op["status"]
    assert "leases.coordination.k8s.io in namespace team-a" in cond["message"], cond["message"]
    assert "chart value watchNamespaces" in cond["message"]
    assert op["status"]["phase"] == names.Phase.PAUSED
    assert "caRotation" not in op["status"] or not op["status"]["caRotation"].get("stage")
    warnings = await _events(kube, names.TALOS_OPERATION, "rotate", "Forbidden")
    assert [(e["type"], e.get("count", 1)) for e in warnings] == [("Warning", 1)], warnings
    secret = await kube.raw("GET", f"/api/v1/namespaces/{TEAM}/secrets/{env.secret_name}")
    assert names.ROTATION_KEY not in secret["data"]  # refused before anything was written

    # The grant is added: the rotation starts where it stood.
    env.management.faults.denied = set()
    await _steps(kube, env, 1)
    op = await crds.operations(kube).get(TEAM, "rotate")
    assert op["status"]["caRotation"]["stage"] == "Accepting", op["status"]


async def test_a_refused_machine_status_write_is_one_warning_on_the_machine(env: SimEnvironment,
                                                                           kube: KubeClient) -> None:
    """The one 403 whose condition cannot be written (it is the status write): one Warning on the object."""
    env.management.faults.denied = {("patch", "talosmachines/status", TEAM)}
    await _steps(kube, env, 3)
    for machine in env.machine_names:
        assert not ((await crds.machines(kube).get(TEAM, machine)).get("status") or {}).get("conditions")
        warnings = await _events(kube, names.TALOS_MACHINE, machine, "Forbidden")
        assert [(e["type"], e.get("count", 1)) for e in warnings] == [("Warning", 1)], warnings
        assert "patch talosmachines/status.ichor.maesh.dev in namespace team-a" in warnings[0]["message"]
        assert "rbac.create" in warnings[0]["message"]


async def test_a_completed_operation_whose_lock_cannot_be_released_stays_completed(env: SimEnvironment,
                                                                                 kube: KubeClient) -> None:
    """The lock lapses on its own: a 403 on its release must not turn a Completed operation Paused; the finalizer
    still goes."""
    await crds.operations(kube).create(TEAM, {"metadata": {"name": "done", "finalizers": [
        names.CA_ROTATION_FINALIZER]}, "spec": {"clusterRef": {"name": env.cluster_name},
                                                "kind": names.KIND_CA_ROTATION}})
    await crds.operations(kube).patch_status(TEAM, "done", {"status": {"phase": names.Phase.COMPLETED}})
    env.management.faults.denied = {("*", "leases", TEAM)}
    await _steps(kube, env, 2)
    op = await crds.operations(kube).get(TEAM, "done")
    assert op["status"]["phase"] == names.Phase.COMPLETED, op["status"]
    assert not find(op["status"].get("conditions"), names.CA_ROTATION)
    assert names.CA_ROTATION_FINALIZER not in (op["metadata"].get("finalizers") or [])
    assert not await _events(kube, names.TALOS_OPERATION, "done", "Forbidden")


@pytest.fixture
async def world(env: SimEnvironment) -> AsyncIterator[World]:
    async for w in world_on(env, TIMING):
        yield w


async def test_a_refused_lock_lease_is_forbidden_on_a_config_rollout_and_nothing_reboots(world: World) -> None:
    """The config kind goes through the same lock: refused, ConfigRollout=False/Forbidden, one Warning, no reboot."""
    env = world.env
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return all((m.get("status") or {}).get("rebootPaths") for m in await world.machines())

    await world.run_until(reported, what="every machine reporting its rebootPaths")
    since = len(env.talos.history.events)
    env.management.faults.denied = {("*", "leases", TEAM)}
    await crds.operations(world.kube).create(TEAM, {"metadata": {"name": "roll"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": names.KIND_CONFIG}})

    async def refused() -> bool:
        cond = find(((await world.op("roll")).get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT)
        return cond is not None and cond["reason"] == "Forbidden"

    await world.run_until(refused, what="ConfigRollout=False/Forbidden")
    for _ in range(3):
        await world.step()
    op = await world.op("roll")
    cond = find(op["status"]["conditions"], names.CONFIG_ROLLOUT)
    assert cond is not None and cond["status"] == "False", cond
    assert "leases.coordination.k8s.io in namespace team-a" in cond["message"] and "watchNamespaces" in \
        cond["message"]
    assert op["status"]["phase"] == names.Phase.PAUSED
    assert reboots(env, since) == {m: 0 for m in env.machine_names}
    warnings = await _events(world.kube, names.TALOS_OPERATION, "roll", "Forbidden")
    assert [(e["type"], e.get("count", 1)) for e in warnings] == [("Warning", 1)], warnings
