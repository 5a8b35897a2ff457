"""Node behaviour over the wire: reboots and boot IDs, staged configurations, kubelet and kube-apiserver
reacting to configuration changes, v1.13 apply modes, TRY rollback and injected faults."""

from __future__ import annotations

import asyncio

import pytest

from ichord.contract import V1_13, V1_14
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CAKind, generate_ca
from ichord.render.config import MachineConfig
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.testing import eventually
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosDeadlineError, TalosRPCError, TalosUnreachableError
from ichord.talos.proto.gen.machine import machine_pb2 as m
from tests.integration._talos_helpers import TalosLayout

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
Mode = m.ApplyConfigurationRequest


@pytest.fixture
def talos_layout() -> TalosLayout:
    return TalosLayout(control_planes=1, workers=1, first=51, timings={"apiserver_ready_delay": 0.3})


def with_accepted_k8s_ca(cfg: MachineConfig, pem: bytes) -> MachineConfig:
    out = cfg.copy()
    doc = out.find("KubeAPIServerCAConfig")
    assert doc is not None
    doc.setdefault("acceptedCAs", []).append(pem.decode())
    return out


async def test_reboot_changes_boot_id_and_loads_the_staged_configuration(cluster: SimCluster,
                                                                         client: TalosClient) -> None:
    node = cluster.nodes["worker-1"]
    staged = node.running.copy()
    staged.v1alpha1["machine"]["certSANs"] = ["after-reboot.example"]
    await client.apply_configuration(node.endpoint, staged.to_bytes(), Mode.STAGED, contract=node.contract)
    before = await client.boot_id(node.endpoint, V1_14)
    assert MachineConfig.parse(await client.machine_config(node.endpoint)).hash() != staged.hash()
    await client.reboot(node.endpoint)
    await eventually(lambda: not node.up)
    with pytest.raises(TalosUnreachableError):  # the node does not answer while it reboots
        await client.version(node.endpoint)
    await eventually(lambda: node.up)
    after = await client.boot_id(node.endpoint, V1_14)
    assert after != before
    assert MachineConfig.parse(await client.machine_config(node.endpoint)).hash() == staged.hash()
    reboot = cluster.history.of("reboot", "worker-1")[-1]
    assert (reboot["old_boot_id"], reboot["boot_id"], reboot["config_hash"]) == (before, after, staged.hash())


async def test_kubernetes_ca_change_restarts_the_kubelet(cluster: SimCluster, client: TalosClient) -> None:
    new_ca = generate_ca(CAKind.KUBERNETES)
    for name in ("worker-1", "cp-1"):
        node = cluster.nodes[name]
        watch = client.cosi_watch(node.endpoint, "runtime", "Services.v1alpha1.talos.dev", "kubelet")
        first = await anext(watch)
        assert first.resource.metadata.id == "kubelet"  # a watch of one ID starts with it (no BOOTSTRAPPED)
        cfg = with_accepted_k8s_ca(node.running, new_ca.cert_pem)
        await client.apply_configuration(node.endpoint, cfg.to_bytes(), Mode.NO_REBOOT, contract=node.contract)
        down = await anext(watch)
        up = await anext(watch)
        await watch.aclose()
        assert (down.event_type, up.event_type) == (2, 0)  # DESTROYED, then CREATED
        assert cluster.history.of("kubelet_restart", name)[-1]["reason"] == "Kubernetes CA changed"
        assert (await client.services(node.endpoint))["kubelet"].healthy


async def test_apiserver_gets_a_new_container_after_a_delay(cluster: SimCluster, client: TalosClient) -> None:
    cp = cluster.nodes["cp-1"]

    async def container() -> tuple[str, bool]:
        pods = {p.id: p for p in await client.static_pod_statuses(cp.endpoint)}
        pod = pods["kube-system/kube-apiserver-cp-1"]
        return pod.container_ids[0], pod.ready

    before, ready = await container()
    assert ready
    # certSANs: nothing kube-apiserver loads; no restart.
    harmless = cp.running.copy()
    harmless.v1alpha1["machine"]["certSANs"] = ["x.example"]
    await client.apply_configuration(cp.endpoint, harmless.to_bytes(), Mode.NO_REBOOT, contract=cp.contract)
    await asyncio.sleep(0.15)
    assert (await container())[0] == before
    assert not cluster.history.of("apiserver_restart", "cp-1")
    # The aggregator CA is loaded by kube-apiserver, not by the kubelet.
    agg = harmless.copy()
    doc = agg.find("KubeAggregatorCAConfig")
    assert doc is not None
    doc.setdefault("acceptedCAs", []).append(generate_ca(CAKind.AGGREGATOR).cert_pem.decode())
    await client.apply_configuration(cp.endpoint, agg.to_bytes(), Mode.NO_REBOOT, contract=cp.contract)
    assert (await container())[0] == before  # not at once: Talos re-renders the static pod later
    await eventually(lambda: cp.apiserver_container != before)
    assert (await container()) == (cp.apiserver_container, False)  # restarted, not ready yet
    await eventually(lambda: cp.apiserver_ready)
    assert (await container())[1]
    assert not cluster.history.of("kubelet_restart", "cp-1")


async def test_try_mode_rolls_back_and_a_later_apply_cancels_it(bundle: SecretsBundle) -> None:
    layout = TalosLayout(control_planes=1, workers=0, first=55, timings={"try_timeout": 0.1})
    async with layout.running(bundle) as cl, TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2) as c:
        node = cl.nodes["cp-1"]
        original = node.running.hash()
        trial = node.running.copy()
        trial.v1alpha1["machine"]["certSANs"] = ["try.example"]
        tried = await c.apply_configuration(node.endpoint, trial.to_bytes(), Mode.TRY, contract=node.contract)
        assert tried.mode_name == "TRY"
        assert "automatically reverted back in 0.1s" in tried.mode_details
        assert node.running.hash() == trial.hash()
        assert node.persistent.hash() == original
        await eventually(lambda: node.running.hash() == original)
        await c.apply_configuration(node.endpoint, trial.to_bytes(), Mode.TRY, contract=node.contract)
        await c.apply_configuration(node.endpoint, trial.to_bytes(), Mode.NO_REBOOT, contract=node.contract)
        await asyncio.sleep(0.2)
        assert node.running.hash() == trial.hash()  # the rollback was cancelled


async def test_v113_reboot_and_auto_modes_reboot(bundle: SecretsBundle) -> None:
    layout = TalosLayout(contract=V1_13, control_planes=1, workers=1, first=57)
    async with layout.running(bundle) as cl, TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2) as c:
        node = cl.nodes["worker-1"]
        boot = node.boot_id
        changed = node.running.copy()
        changed.v1alpha1["machine"]["token"] = "abcdef.0123456789abcdef"
        res = await c.apply_configuration(node.endpoint, changed.to_bytes(), Mode.AUTO, contract=node.contract)
        assert res.mode_name == "REBOOT"
        assert res.mode_details == ("Applied configuration with a reboot: this config change can't be applied "
                                    "in immediate mode\ndiff: .machine.token")
        await eventually(lambda: node.up and node.boot_id != boot)
        assert await c.boot_id(node.endpoint, V1_13) == node.boot_id
        assert node.running.hash() == changed.hash()
        boot = node.boot_id
        res = await c.apply_configuration(node.endpoint, node.running.to_bytes(), Mode.REBOOT, contract=node.contract)
        assert res.mode_name == "REBOOT"
        await eventually(lambda: node.up and node.boot_id != boot)
        res = await c.apply_configuration(node.endpoint, node.running.to_bytes(), Mode.AUTO, contract=node.contract)
        assert res.mode_name == "NO_REBOOT"  # nothing that needs a reboot changed


async def test_faults(cluster: SimCluster, client: TalosClient, bundle: SecretsBundle) -> None:
    node = cluster.nodes["worker-1"]
    node.faults.reboot_never_happens = True
    boot = node.boot_id
    await client.reboot(node.endpoint)
    await asyncio.sleep(0.15)
    assert node.boot_id == boot and node.up
    node.faults.refuse_dry_run = True
    with pytest.raises(TalosRPCError):
        await client.apply_configuration(node.endpoint, node.running.to_bytes(), Mode.NO_REBOOT,
                                         contract=node.contract, dry_run=True)
    node.faults.apply_error = "disk full"
    with pytest.raises(TalosRPCError) as err:
        await client.apply_configuration(node.endpoint, node.running.to_bytes(), Mode.NO_REBOOT, contract=node.contract)
    assert err.value.detail == "disk full"
    node.faults.slow = 0.3
    async with TalosClient(DialBundle.from_bundle(bundle), rpc_timeout=0.1) as impatient:
        with pytest.raises(TalosDeadlineError):
            await impatient.version(node.endpoint)
