"""The simulator's cluster behaviours and faults, seen through the real client over HTTPS."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.kube import errors
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.reads import node_ready, read_config_map, read_node
from ichord.pki.ca import CAKind, generate_ca
from ichord.settings import Timing
from ichord.sim.kube import BehaviourSettings, KubeSimulator, SimSettings
from tests.integration._kube_helpers import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NS = "default"
LAGS = BehaviourSettings(root_ca_publish_lag=0.2, projected_ca_lag=0.2, rollout_step=0.01, kubelet_restart=0.2,
                         ext_auth_recreate_lag=0.05)


@pytest.fixture
def sim_settings(tmp_path: Path) -> SimSettings:
    return SimSettings(behaviours=dataclasses.replace(LAGS, projected_ca_path=tmp_path / "ca.crt"))


async def once_created(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """The ConfigMap, read again while the simulator has not (re)created it yet (5 s at most)."""
    with anyio.fail_after(5):
        while True:
            try:
                return await read_config_map(kube, namespace, name)
            except errors.NotFound:
                await anyio.sleep(0.02)


async def test_root_ca_publishing_lags_and_projected_lags_more(sim: KubeSimulator, kube: KubeClient,
                                                               tmp_path: Path) -> None:
    old = sim.ca.cert_pem.decode()
    for ns in ("default", "kube-system"):
        assert (await read_config_map(kube, ns, "kube-root-ca.crt"))["data"]["ca.crt"] == old
    new_ca = generate_ca(CAKind.KUBERNETES)
    sim.behaviours.restart_controller_manager(new_ca.cert_pem)
    assert (await read_config_map(kube, NS, "kube-root-ca.crt"))["data"]["ca.crt"] == old  # not yet
    projected = tmp_path / "ca.crt"
    with anyio.fail_after(5):
        while (await read_config_map(kube, NS, "kube-root-ca.crt"))["data"]["ca.crt"] == old:  # noqa: ASYNC110  (polling the API is the point)
            await anyio.sleep(0.02)
        assert projected.read_text() == old  # the kubelet refreshes later still
    assert (await read_config_map(kube, "kube-public", "kube-root-ca.crt"))["data"]["ca.crt"] != old
    await eventually(lambda: projected.read_bytes() == new_ca.cert_pem)
    await kube.core().create_namespace({"metadata": {"name": "fresh"}})
    cm = await once_created(kube, "fresh", "kube-root-ca.crt")
    assert cm["data"]["ca.crt"] == new_ca.cert_pem.decode()


async def test_deployment_and_daemonset_roll_on_template_change(sim: KubeSimulator, kube: KubeClient) -> None:
    core, apps = kube.core(), kube.apps()
    for n in ("n1", "n2"):
        await core.create_node({"metadata": {"name": n}})
    template = {"metadata": {"labels": {"app": "dns"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}
    await apps.create_namespaced_deployment(NS, {"metadata": {"name": "dns"}, "spec": {
        "replicas": 2, "selector": {"matchLabels": {"app": "dns"}}, "template": template}})
    await apps.create_namespaced_daemon_set(NS, {"metadata": {"name": "cni"}, "spec": {
        "selector": {"matchLabels": {"app": "cni"}},
        "template": {**template, "metadata": {"labels": {"app": "cni"}}}}})

    async def available() -> bool:
        dep = await apps.read_namespaced_deployment_status("dns", NS)
        ds = await apps.read_namespaced_daemon_set_status("cni", NS)
        return bool(dep.status and dep.status.observed_generation == dep.metadata.generation
                    and dep.status.updated_replicas == 2 and dep.status.available_replicas == 2
                    and ds.status and ds.status.observed_generation == ds.metadata.generation
                    and ds.status.number_available == 2 and ds.status.updated_number_scheduled == 2)
    with anyio.fail_after(5):
        while not await available():  # noqa: ASYNC110  (polling the API is the point)
            await anyio.sleep(0.02)
    before = {p.metadata.name for p in (await core.list_namespaced_pod(NS, label_selector="app=dns")).items}
    assert len(before) == 2
    ds_pods = (await core.list_namespaced_pod(NS, label_selector="app=cni")).items
    assert sorted(p.spec.node_name for p in ds_pods) == ["n1", "n2"]
    # kubectl rollout restart: a template annotation changes, the pods are replaced.
    await apps.patch_namespaced_deployment(
        "dns", NS, {"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "t"}}}}},
        _content_type="application/strategic-merge-patch+json")
    with anyio.fail_after(5):
        while True:
            dep = await apps.read_namespaced_deployment_status("dns", NS)
            pods = (await core.list_namespaced_pod(NS, label_selector="app=dns")).items
            if (dep.status.observed_generation == 2 and dep.status.updated_replicas == 2 and len(pods) == 2
                    and not ({p.metadata.name for p in pods} & before)):
                break
            await anyio.sleep(0.02)
    assert all(p.metadata.annotations == {"kubectl.kubernetes.io/restartedAt": "t"} for p in pods)


async def test_node_goes_not_ready_while_kubelet_restarts(sim: KubeSimulator, kube: KubeClient) -> None:
    await kube.core().create_node({"metadata": {"name": "cp1"}, "status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
    assert node_ready(await read_node(kube, "cp1"))
    sim.behaviours.restart_kubelet("cp1")
    assert not node_ready(await read_node(kube, "cp1"))
    with anyio.fail_after(5):
        while not node_ready(await read_node(kube, "cp1")):  # noqa: ASYNC110  (polling the API is the point)
            await anyio.sleep(0.02)


async def test_extension_apiserver_authentication_merges_and_recreates(sim: KubeSimulator,
                                                                        kube: KubeClient) -> None:
    first, second = generate_ca(CAKind.AGGREGATOR), generate_ca(CAKind.AGGREGATOR)
    sim.behaviours.set_aggregator_ca(first.cert_pem)
    sim.behaviours.set_aggregator_ca(second.cert_pem)
    cm = await read_config_map(kube, "kube-system", "extension-apiserver-authentication")
    assert cm["data"]["requestheader-client-ca-file"] == (first.cert_pem + second.cert_pem).decode()
    await kube.core().delete_namespaced_config_map("extension-apiserver-authentication", "kube-system")
    cm = await once_created(kube, "kube-system", "extension-apiserver-authentication")
    assert cm["data"]["requestheader-client-ca-file"] == second.cert_pem.decode()


async def test_injected_errors_latency_and_down_period(sim: KubeSimulator, tmp_path: Path) -> None:
    timing = dataclasses.replace(Timing(), kube_request_timeout=0.3)
    kube = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kc"), timing=timing)
    try:
        sim.faults.error_rate = {"get": 1.0}
        with pytest.raises(errors.Unavailable) as failed:
            await read_config_map(kube, NS, "kube-root-ca.crt")
        assert failed.value.status == 500
        sim.faults.error_rate = {}
        sim.faults.latency = 0.6
        with pytest.raises(errors.KubeTimeout):
            await read_config_map(kube, NS, "kube-root-ca.crt")
        sim.faults.latency = 0.0
        async with sim.outage():
            with pytest.raises(errors.Unavailable) as down:
                await read_config_map(kube, NS, "kube-root-ca.crt")
            assert down.value.status == 0
        assert (await read_config_map(kube, NS, "kube-root-ca.crt"))["data"]
    finally:
        await kube.close()
    assert sim.requests.count("get", 500) == 1


async def test_serving_ca_switch_is_refused_until_trusted(sim: KubeSimulator, tmp_path: Path) -> None:
    trusted = [sim.ca_pem]
    kube = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kc"), trust=lambda: list(trusted))
    try:
        assert await read_config_map(kube, NS, "kube-root-ca.crt")
        new_ca = generate_ca(CAKind.KUBERNETES)
        await sim.switch_serving_ca(new_ca)
        with pytest.raises(errors.TLSVerificationError):
            await read_config_map(kube, NS, "kube-root-ca.crt")
        trusted.append(new_ca.cert_pem)  # what the trust pool does before Issuing
        assert await read_config_map(kube, NS, "kube-root-ca.crt")
        trusted[:] = [new_ca.cert_pem]
        assert await read_config_map(kube, NS, "kube-root-ca.crt")
    finally:
        await kube.close()
