"""etcd across a CA change (docs/decisions.md#etcd-reboot-roll): members load cluster.etcd.ca at boot;
a member on a CA its peers do not trust cannot rejoin, and a plain replacement loses quorum at the
middle reboot; the two-certificate bundle (first signs, all trusted) rolls with quorum kept."""

from __future__ import annotations

import base64

import pytest

from ichord.contract import V1_14
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CAKind, CertificateAuthority, generate_ca
from ichord.pki.pem import load_certificate, load_certificates
from ichord.render.config import MachineConfig
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.node import SimNode
from ichord.sim.talos.testing import eventually
from ichord.talos.client import TalosClient
from ichord.talos.errors import TalosUnreachableError
from ichord.talos.proto.gen.machine import machine_pb2 as m
from tests.integration._talos_helpers import TalosLayout

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
def talos_layout() -> TalosLayout:
    return TalosLayout(control_planes=3, workers=0, first=71)


def with_etcd_ca(cfg: MachineConfig, certs: list[CertificateAuthority], signer: CertificateAuthority) -> MachineConfig:
    out = cfg.copy()
    assert signer.key_pem is not None
    out.v1alpha1["cluster"]["etcd"]["ca"] = {
        "crt": base64.b64encode(b"".join(c.cert_pem for c in certs)).decode(),
        "key": base64.b64encode(signer.key_pem).decode(),
    }
    return out


async def apply_and_reboot(client: TalosClient, cluster: SimCluster, node: SimNode, cfg: MachineConfig) -> None:
    await client.apply_configuration(node.endpoint, cfg.to_bytes(), m.ApplyConfigurationRequest.NO_REBOOT,
                                     contract=node.contract)
    before = await client.boot_id(node.endpoint, V1_14)
    await client.reboot(node.endpoint)
    await eventually(lambda: node.up and node.boot_id != before)


async def healthy(client: TalosClient, node: SimNode) -> bool:
    return not list((await client.etcd_status(node.endpoint)).errors)


async def test_plain_replacement_cannot_rejoin_and_loses_quorum(cluster: SimCluster, client: TalosClient) -> None:
    new = generate_ca(CAKind.ETCD)
    cp1, cp2, cp3 = (cluster.nodes[f"cp-{i}"] for i in (1, 2, 3))
    await apply_and_reboot(client, cluster, cp1, with_etcd_ca(cp1.running, [new], new))
    # The configuration alone changed nothing etcd loaded: the reboot did.
    assert cluster.history.of("etcd_reboot_required", "cp-1")
    status = await client.etcd_status(cp1.endpoint)
    assert any("x509: certificate signed by unknown authority" in e for e in status.errors)
    assert await healthy(client, cp2) and await healthy(client, cp3)
    assert not cluster.history.of("etcd_quorum_lost")
    members = await client.etcd_member_list(cp2.endpoint)
    assert len(members) == 3  # still a member, just not a healthy one
    # The middle reboot: cp-2 down, cp-1 isolated, cp-3 alone is a minority.
    await client.apply_configuration(cp2.endpoint, with_etcd_ca(cp2.running, [new], new).to_bytes(),
                                     m.ApplyConfigurationRequest.NO_REBOOT, contract=cp2.contract)
    cluster.timings.reboot = 0.5  # long enough to ask the survivor while cp-2 is down
    await client.reboot(cp2.endpoint)
    await eventually(lambda: bool(cluster.history.of("etcd_quorum_lost")))
    lost = cluster.history.of("etcd_quorum_lost")[0]
    assert lost["healthy"] == [] and lost["members"] == 3
    with pytest.raises(TalosUnreachableError, match="etcdserver: no leader") as err:
        await client.etcd_member_list(cp3.endpoint)
    assert err.value.code == "UNAVAILABLE"  # etcd's status passes through machined unchanged
    await eventually(lambda: cp2.up)
    # Afterwards the cluster is split by CA: the old-CA member is the one left out.
    assert await healthy(client, cp1) and await healthy(client, cp2)
    assert not await healthy(client, cp3)


async def test_two_certificate_bundle_rolls_with_quorum(cluster: SimCluster, client: TalosClient,
                                                        bundle: SecretsBundle) -> None:
    old, new = bundle.etcd, generate_ca(CAKind.ETCD)
    stages = [("accepting", [old, new], old), ("issuing", [new, old], new), ("dropping", [new], new)]
    for stage, certs, signer in stages:
        nodes = sorted(cluster.nodes.values(), key=lambda n: n.name)
        for node in nodes:
            cfg = with_etcd_ca(node.running, certs, signer)
            await client.apply_configuration(node.endpoint, cfg.to_bytes(), m.ApplyConfigurationRequest.NO_REBOOT,
                                             contract=node.contract)
        # The node reports the stage's PKI before any reboot (what docs/decisions.md#ca-rotation-passes checks).
        trust = await client.read(nodes[0].endpoint, "/system/secrets/etcd/ca.crt")
        assert [c.subject for c in load_certificates(trust)] == [c.certificate.subject for c in certs]
        assert load_certificates(trust) == [c.certificate for c in certs], stage
        for node in nodes:
            before = await client.boot_id(node.endpoint, V1_14)
            await client.reboot(node.endpoint)
            await eventually(lambda n=node, b=before: n.up and n.boot_id != b)
            for other in nodes:
                assert await healthy(client, other), (stage, node.name, other.name)
            peer = load_certificate((await client.etcd_certs(node.endpoint)).etcd_peer)
            peer.verify_directly_issued_by(signer.certificate)
    assert not cluster.history.of("etcd_quorum_lost")
    assert cluster.etcd.has_quorum
    state = cluster.etcd.state()
    assert all(m["healthy"] for m in state["members"].values())  # type: ignore[index]
    roots = {n.name: (await client.etcd_root(n.endpoint)).ca_bundle for n in cluster.nodes.values()}
    assert set(roots.values()) == {new.cert_pem}


async def test_member_that_stays_unhealthy(cluster: SimCluster, client: TalosClient) -> None:
    cp2 = cluster.nodes["cp-2"]
    cp2.set_etcd_unhealthy(True)
    assert not await healthy(client, cp2)
    assert await healthy(client, cluster.nodes["cp-1"])
    assert len(await client.etcd_member_list(cluster.nodes["cp-3"].endpoint)) == 3
    before = cp2.boot_id
    await client.reboot(cp2.endpoint)
    await eventually(lambda: cp2.up and cp2.boot_id != before)
    assert not await healthy(client, cp2)  # the fault survives a reboot
    assert cluster.history.of("etcd_member_health", "cp-2")[-1]["healthy"] is False
    cp2.set_etcd_unhealthy(False)
    assert await healthy(client, cp2)


async def test_the_etcd_service_health_and_kube_apiserver_follow_the_member(cluster: SimCluster,
                                                                            client: TalosClient) -> None:
    """Talos reports the etcd service unhealthy while its member is, and kube-apiserver (pointed at its node's own
    member) not ready; the other control planes are unaffected."""
    cp1, cp2 = cluster.nodes["cp-1"], cluster.nodes["cp-2"]

    async def state(node: SimNode) -> tuple[bool, bool, bool]:
        svc = (await client.services(node.endpoint))["etcd"]
        listed = {s.id: s.health.healthy for s in await client.service_list(node.endpoint)}
        pods = [p for p in await client.static_pod_statuses(node.endpoint) if "kube-apiserver" in p.id]
        return svc.healthy, listed["etcd"], all(p.ready for p in pods) and bool(pods)

    assert await state(cp2) == (True, True, True)
    cp2.set_etcd_unhealthy(True)
    assert await state(cp2) == (False, False, False)
    assert await state(cp1) == (True, True, True)
    cp2.set_etcd_unhealthy(False)
    assert await state(cp2) == (True, True, True)


async def test_alarms_are_listed_per_member_until_disarmed(cluster: SimCluster, client: TalosClient) -> None:
    cp3 = cluster.nodes["cp-3"]
    assert await client.etcd_alarms(cp3.endpoint) == []
    cp3.raise_etcd_alarm(m.EtcdMemberAlarm.NOSPACE)
    alarms = await client.etcd_alarms(cp3.endpoint)
    assert [a.alarm for a in alarms] == [m.EtcdMemberAlarm.NOSPACE]
    assert alarms[0].member_id == cluster.etcd.members["cp-3"].member_id
    assert await client.etcd_alarms(cluster.nodes["cp-1"].endpoint) == []  # EtcdAlarmList is local
    cluster.etcd.disarm("cp-3")
    assert await client.etcd_alarms(cp3.endpoint) == []


async def test_a_second_certificate_that_is_not_trusted_keeps_a_rebooted_member_out(
        cluster: SimCluster, client: TalosClient) -> None:
    """The fault for docs/decisions.md#ca-rotation-passes's open question: members trust only the first certificate of
    the bundle. The two-certificate roll then breaks where the signer changes: the Issuing reboot."""
    cluster.etcd.trust_first_only = True
    old = cluster.nodes["cp-1"].view.etcd_ca
    assert old is not None and old.key_pem is not None
    old_ca = CertificateAuthority(old.cert_pem, old.key_pem)
    new = generate_ca(CAKind.ETCD)
    nodes = [cluster.nodes[f"cp-{i}"] for i in (1, 2, 3)]
    for node in nodes:  # Accepting: old first, still signing; the members keep talking
        await apply_and_reboot(client, cluster, node, with_etcd_ca(node.running, [old_ca, new], old_ca))
        assert await healthy(client, node)
    cp1 = nodes[0]
    await apply_and_reboot(client, cluster, cp1, with_etcd_ca(cp1.running, [new, old_ca], new))
    status = await client.etcd_status(cp1.endpoint)
    assert any("unknown authority" in e for e in status.errors)
    assert cluster.etcd.has_quorum and all([await healthy(client, n) for n in nodes[1:]])
