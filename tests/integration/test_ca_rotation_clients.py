"""Finalizing's client restarts with the cilium preset (CNI first, one at a time), a client not back within
the bound (RotatedClientsNotBack + CAClientsNotRestarted), and a second rotation refused while one runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.operations.ca_rotation import advance, clients
from ichord.operations.ca_rotation.managed_objects import patch_workload
from ichord.operations.outcome import Blocked, Done
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.combined import SimEnvironment
from tests.integration._ca_rotation_driver import TIMING, add_clients, driving, live_rotation

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
WORKLOADS = (("daemonsets", "cilium"), ("deployments", "cilium-operator"), ("daemonsets", "kube-proxy"),
             ("deployments", "coredns"))


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.02, cni="cilium") as e:
        add_clients(e, WORKLOADS, replicas=None)
        yield e


async def test_cilium_first_one_at_a_time_and_a_client_not_back_is_named(
        env: SimEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    patched: list[str] = []

    async def recording_patch(kc: KubeClient, plural: str, namespace: str, name: str, body: dict[str, Any]) -> None:
        # one at a time: every earlier workload is back before the next is patched
        for earlier in patched:
            plural_e, name_e = earlier.split("/")
            obj = env.kube.store.get(env.kube.store.resolve("apps", "v1", plural_e), "kube-system", name_e)
            assert clients.available(obj), f"{name} patched while {earlier} was not available"
        patched.append(f"{plural}/{name}")
        await patch_workload(kc, plural, namespace, name, body)

    real_available = clients.available
    monkeypatch.setattr(clients, "patch_workload", recording_patch)
    # coredns never becomes available again (its pods would be stuck on a tainted node,
    # docs/decisions.md#client-restarts)
    monkeypatch.setattr(clients, "available", lambda obj: obj["metadata"]["name"] != "coredns" and real_available(obj))

    async with driving(env, timing=replace(TIMING, ca_client_restart_timeout=2.0)) as driver:
        kube = driver.kube
        await driver.create()
        await driver.run(until=lambda o: (o.get("status") or {}).get("caRotation", {}).get("stage") == "Issuing")

        # A second rotation of the same cluster is refused while this one is under way; it writes nothing.
        rotation = live_rotation(env)
        assert rotation is not None
        second = await crds.operations(kube).create(env.namespace, {"metadata": {"name": "second"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})
        outcome = await advance(driver.context(), second)
        assert isinstance(outcome, Blocked) and outcome.reason == "ClusterCARotating", outcome
        first = (await crds.operations(kube).get(env.namespace, driver.op_name))["metadata"]
        assert f"{env.namespace}/{driver.op_name}" in outcome.message and first["uid"] not in outcome.message  # by name
        second = await crds.operations(kube).get(env.namespace, "second")
        assert second["status"]["phase"] == "Paused" and "caRotation" not in second["status"]
        after = live_rotation(env)
        assert after is not None and after.fingerprints() == rotation.fingerprints()

        assert isinstance(await driver.run(), Done)
        await driver.recorder.drain()

        assert patched == ["daemonsets/cilium", "deployments/cilium-operator", "daemonsets/kube-proxy",
                           "deployments/coredns"]
        final = driver.snapshots[-1]
        cond = find(final["status"]["conditions"], names.CA_ROTATION)
        assert cond is not None and (cond["status"], cond["reason"]) == ("True", "RotatedClientsNotBack")
        assert "deployment/coredns" in cond["message"] and "kube-proxy" not in cond["message"]
        assert final["status"]["phase"] == "Completed"
        cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
        not_back = find(cluster["status"]["conditions"], names.CA_CLIENTS_NOT_RESTARTED)
        assert not_back is not None and not_back["status"] == "True" and "coredns" in not_back["message"]
        events = env.management.store.list(env.management.store.resolve("", "v1", "events"), env.namespace)[0]
        assert any(e.get("reason") == names.EventReason.CA_CLIENTS_NOT_RESTARTED for e in events)
