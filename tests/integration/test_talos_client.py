"""Every TalosClient RPC over real mutual TLS against simulated v1.14 nodes (2 control planes + 1 worker)."""

from __future__ import annotations

import asyncio
import base64

import pytest
from cryptography import x509

from ichord import yamlio
from ichord.contract import V1_14
from ichord.pki.bundle import SecretsBundle
from ichord.pki.pem import load_certificate, load_certificates
from ichord.render.config import MachineConfig
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.testing import eventually
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosCertificateError, TalosNotFoundError, TalosUnreachableError
from ichord.talos.proto.gen.cosi import state_pb2
from ichord.talos.proto.gen.machine import machine_pb2 as m
from tests.integration._talos_helpers import TalosLayout

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
def talos_layout() -> TalosLayout:
    return TalosLayout(control_planes=2, workers=1, first=21)


def ep(cluster: SimCluster, name: str) -> str:
    return cluster.nodes[name].endpoint


async def test_version_on_every_node_verifies_the_server_by_ip(cluster: SimCluster, client: TalosClient) -> None:
    for node in cluster.nodes.values():
        assert node.ip != "127.0.0.1"  # the serving certificate must carry the node's own IP
        info = await client.version(node.endpoint)
        assert info.tag == "v1.14.5"


async def test_apply_no_reboot_changes_running_and_persistent(cluster: SimCluster, client: TalosClient) -> None:
    cp = ep(cluster, "cp-1")
    current = MachineConfig.parse(await client.machine_config(cp))
    current.v1alpha1["machine"]["certSANs"] = ["cp-1.example"]
    result = await client.apply_configuration(cp, current.to_bytes(), m.ApplyConfigurationRequest.NO_REBOOT,
                                              contract=cluster.contract)
    assert result.mode_name == "NO_REBOOT"
    assert result.mode_details == "Applied configuration without a reboot"
    assert MachineConfig.parse(await client.machine_config(cp)).hash() == current.hash()
    assert MachineConfig.parse(await client.machine_config(cp, persistent=True)).hash() == current.hash()
    applies = cluster.history.of("apply", "cp-1")
    assert applies[-1]["config_hash"] == current.hash()


async def test_apply_auto_is_no_reboot_and_staged_keeps_running(cluster: SimCluster, client: TalosClient) -> None:
    cp = ep(cluster, "cp-2")
    running = MachineConfig.parse(await client.machine_config(cp))
    auto = await client.apply_configuration(cp, running.to_bytes(), m.ApplyConfigurationRequest.AUTO,
                                            contract=cluster.contract)
    assert auto.mode_name == "NO_REBOOT"
    staged = running.copy()
    staged.v1alpha1["machine"]["certSANs"] = ["staged.example"]
    res = await client.apply_configuration(cp, staged.to_bytes(), m.ApplyConfigurationRequest.STAGED,
                                           contract=cluster.contract)
    assert res.mode_name == "STAGED"
    assert MachineConfig.parse(await client.machine_config(cp)).hash() == running.hash()
    assert MachineConfig.parse(await client.machine_config(cp, persistent=True)).hash() == staged.hash()


async def test_dry_run_reports_a_diff_and_changes_nothing(cluster: SimCluster, client: TalosClient) -> None:
    cp = ep(cluster, "cp-1")
    running = MachineConfig.parse(await client.machine_config(cp))
    same = await client.apply_configuration(cp, running.to_bytes(), m.ApplyConfigurationRequest.NO_REBOOT,
                                            contract=cluster.contract,
                                            dry_run=True)
    assert same.mode_details == ("Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\n"
                                 "Config diff:\n\nNo changes.")
    changed = running.copy()
    changed.v1alpha1["machine"]["certSANs"] = ["dry.example"]
    res = await client.apply_configuration(cp, changed.to_bytes(), m.ApplyConfigurationRequest.NO_REBOOT,
                                           contract=cluster.contract,
                                           dry_run=True)
    assert "+" in res.mode_details
    assert "dry.example" in res.mode_details
    assert MachineConfig.parse(await client.machine_config(cp)).hash() == running.hash()


async def test_reboot_returns_an_actor_and_the_boot_id_changes(cluster: SimCluster, client: TalosClient) -> None:
    worker = ep(cluster, "worker-1")
    before = await client.boot_id(worker, V1_14)
    actor = await client.reboot(worker)
    assert actor
    node = cluster.nodes["worker-1"]
    await eventually(lambda: node.up and node.boot_id != before)
    assert await client.boot_id(worker, V1_14) != before


async def test_etcd_calls(cluster: SimCluster, client: TalosClient) -> None:
    cp1, cp2 = ep(cluster, "cp-1"), ep(cluster, "cp-2")
    members = await client.etcd_member_list(cp1)
    assert sorted(x.hostname for x in members) == ["cp-1", "cp-2"]
    assert all(x.peer_urls[0].endswith(":2380") and x.client_urls[0].endswith(":2379") for x in members)
    status = await client.etcd_status(cp2)
    ids = {x.hostname: x.id for x in members}
    assert status.member_id == ids["cp-2"]
    assert status.leader in ids.values()
    assert list(status.errors) == []
    assert await client.etcd_alarms(cp1) == []
    leader = cluster.etcd.leader
    assert leader is not None
    other = "cp-2" if leader == "cp-1" else "cp-1"
    assert await client.etcd_forfeit_leadership(ep(cluster, other)) == ""  # not the leader
    assert await client.etcd_forfeit_leadership(ep(cluster, leader)) == other
    assert cluster.etcd.leader == other


async def test_services_list_and_kubelet_restart(cluster: SimCluster, client: TalosClient) -> None:
    worker = ep(cluster, "worker-1")
    services = {s.id: s for s in await client.service_list(worker)}
    assert services["kubelet"].state == "Running"
    assert "etcd" not in services
    assert await client.service_restart(worker, "kubelet") == 'Service "kubelet" restarted'
    await eventually(lambda: bool(cluster.history.of("kubelet_running", "worker-1")))
    assert cluster.history.of("kubelet_restart", "worker-1")[-1]["reason"] == "ServiceRestart"


async def test_kubeconfig_is_signed_by_the_issuing_kubernetes_ca(cluster: SimCluster, client: TalosClient,
                                                                  bundle: SecretsBundle) -> None:
    raw = await client.kubeconfig(ep(cluster, "cp-1"))
    doc = yamlio.load(raw)
    cert = load_certificate(base64.b64decode(doc["users"][0]["user"]["client-certificate-data"]))
    cert.verify_directly_issued_by(bundle.k8s.certificate)  # raises if another CA signed it
    assert cert.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.21:6443"


async def test_read_boot_id_file_and_missing_file(cluster: SimCluster, client: TalosClient) -> None:
    cp = ep(cluster, "cp-1")
    data = await client.read(cp, "/proc/sys/kernel/random/boot_id")
    assert data.decode().strip() == await client.boot_id(cp, V1_14)
    with pytest.raises(TalosNotFoundError) as err:
        await client.read(cp, "/etc/shadow")
    assert err.value.code == "NOT_FOUND"


async def test_resource_reads(cluster: SimCluster, client: TalosClient, bundle: SecretsBundle) -> None:
    cp, worker = ep(cluster, "cp-1"), ep(cluster, "worker-1")
    assert await client.nodename(cp) == "cp-1"
    status = await client.machine_status(worker)
    assert (status.stage, status.ready) == ("MACHINE_STAGE_RUNNING", True)
    os_root = await client.os_root(cp)
    assert os_root.issuing_ca == bundle.os.cert_pem and os_root.can_issue
    assert not (await client.os_root(worker)).can_issue
    k8s = await client.kubernetes_root(cp)
    assert k8s.issuing_ca == bundle.k8s.cert_pem
    assert k8s.aggregator_ca == bundle.k8s_aggregator.cert_pem
    root = await client.etcd_root(cp)
    assert load_certificates(root.ca_bundle)[0].subject == bundle.etcd.certificate.subject
    certs = await client.etcd_certs(cp)
    assert load_certificate(certs.etcd_peer).issuer == bundle.etcd.certificate.subject
    pods = {p.id: p for p in await client.static_pod_statuses(cp)}
    api = pods["kube-system/kube-apiserver-cp-1"]
    assert api.ready
    assert api.container_ids[0].startswith("containerd://")
    services = await client.services(cp)
    assert services["etcd"].running and services["kubelet"].healthy


async def test_node_metadata_proxies_one_to_one(cluster: SimCluster, client: TalosClient) -> None:
    via = ep(cluster, "cp-1")
    assert await client.nodename(via, node="127.0.0.23") == "worker-1"
    assert await client.boot_id(via, V1_14, node="cp-2") == cluster.nodes["cp-2"].boot_id


async def test_watch_sees_kubelet_go_down_and_come_back(cluster: SimCluster, client: TalosClient) -> None:
    worker = ep(cluster, "worker-1")
    seen: list[tuple[int, str]] = []
    events = client.cosi_watch(worker, "runtime", "Services.v1alpha1.talos.dev", "kubelet")
    first = await anext(events)
    assert (first.event_type, first.resource.metadata.id) == (state_pb2.CREATED, "kubelet")
    await client.service_restart(worker, "kubelet")
    async for event in events:
        seen.append((event.event_type, event.resource.metadata.id))
        if len(seen) == 2:  # a watch of one ID has no BOOTSTRAPPED marker (Talos refuses bootstrap contents there)
            break
    await events.aclose()
    assert seen == [(state_pb2.DESTROYED, "kubelet"), (state_pb2.CREATED, "kubelet")]


async def test_watch_of_a_kind_starts_with_its_contents_then_bootstrapped(cluster: SimCluster,
                                                                          client: TalosClient) -> None:
    worker = ep(cluster, "worker-1")
    events = client.cosi_watch(worker, "runtime", "Services.v1alpha1.talos.dev")
    seen = []
    async for event in events:
        seen.append((event.event_type, event.resource.metadata.id))
        if event.event_type == state_pb2.BOOTSTRAPPED:
            break
    await events.aclose()
    services = sorted(cluster.nodes["worker-1"].services)
    assert seen == [(state_pb2.CREATED, s) for s in services] + [(state_pb2.BOOTSTRAPPED, "")]


async def test_watch_of_an_absent_id_starts_with_its_tombstone(cluster: SimCluster, client: TalosClient) -> None:
    events = client.cosi_watch(ep(cluster, "worker-1"), "runtime", "Services.v1alpha1.talos.dev", "etcd")
    first = await anext(events)
    await events.aclose()
    assert (first.event_type, first.resource.metadata.id, first.resource.metadata.version) == (
        state_pb2.DESTROYED, "etcd", "undefined")


async def test_channels_are_cached_and_closed_when_credentials_change(cluster: SimCluster, client: TalosClient,
                                                                      bundle: SecretsBundle) -> None:
    cp = ep(cluster, "cp-1")
    await client.version(cp)
    channel = client._channels[("127.0.0.21", cluster.nodes["cp-1"].port)].channel
    await client.version(cp)
    assert client._channels[("127.0.0.21", cluster.nodes["cp-1"].port)].channel is channel
    client.set_dial(DialBundle.from_bundle(bundle, roles=("os:reader",)))
    assert not client._channels
    await client.version(cp)
    assert client._channels[("127.0.0.21", cluster.nodes["cp-1"].port)].channel is not channel


async def test_unreachable_node_is_a_typed_error(cluster: SimCluster, client: TalosClient) -> None:
    node = cluster.nodes["worker-1"]
    await node.set_unreachable(True)
    with pytest.raises(TalosUnreachableError):
        await client.version(node.endpoint)
    await node.set_unreachable(False)
    assert (await client.version(node.endpoint)).tag == "v1.14.5"


async def test_server_verified_by_host_name_when_asked(cluster: SimCluster, bundle: SecretsBundle) -> None:
    cp = cluster.nodes["cp-1"]
    async with TalosClient(DialBundle.from_bundle(bundle), server_name="cp-1") as by_name:
        assert (await by_name.version(cp.endpoint)).tag == "v1.14.5"
    async with TalosClient(DialBundle.from_bundle(bundle), server_name="cp-2") as wrong:
        with pytest.raises(TalosCertificateError, match="not trusted"):
            await wrong.version(cp.endpoint)


async def test_dial_timeout_is_separate_from_the_rpc_deadline(bundle: SecretsBundle) -> None:
    # A listener that accepts TCP but never answers the TLS handshake: only the dial timeout can end it.
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.29", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=0.2, rpc_timeout=30) as c:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TalosUnreachableError, match=r"no connection within 0\.2 s"):
                await c.version(f"127.0.0.29:{port}")
            assert loop.time() - started < 5
    finally:
        server.close()
        await server.wait_closed()
