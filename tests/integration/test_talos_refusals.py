"""The simulated node refuses what apid refuses, with the gRPC status code and message; the client
refuses a node whose serving certificate it does not trust. Real mutual TLS throughout."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from cryptography.x509 import ObjectIdentifier
from cryptography.x509.oid import ExtendedKeyUsageOID

from ichord.contract import V1_13
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CAKind, ClientCertificate, generate_ca
from ichord.render.config import MachineConfig
from ichord.sim.talos.certs import sign_leaf
from ichord.sim.talos.cluster import SimCluster
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import (
    TalosCertificateError,
    TalosError,
    TalosFailedPreconditionError,
    TalosInvalidArgumentError,
    TalosPermissionDeniedError,
    TalosRPCError,
    TalosUnimplementedError,
)
from ichord.talos.proto.gen.machine import machine_pb2 as m
from tests.integration._talos_helpers import TalosLayout

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
NO_REBOOT = m.ApplyConfigurationRequest.NO_REBOOT


@pytest.fixture
def talos_layout() -> TalosLayout:
    return TalosLayout(control_planes=1, workers=1, first=31, timings={"apply_duration": 0.2})


@pytest.fixture
def admin(client: TalosClient) -> TalosClient:
    """The os:admin client, named for what it is beside the other roles these tests try."""
    return client


class _CustomEKU(DialBundle):
    """Mints client certificates with chosen ExtKeyUsages (apid wants exactly ClientAuth)."""

    usages: Sequence[ObjectIdentifier] = ()

    def client_certificate(self) -> ClientCertificate:
        assert self.signing_ca.key_pem is not None
        cert, key = sign_leaf(self.signing_ca.cert_pem, self.signing_ca.key_pem, organizations=("os:admin",),
                              usages=self.usages)
        return ClientCertificate(cert, key)


async def _refused(cluster: SimCluster, dial: DialBundle, endpoint: str) -> TalosCertificateError:
    async with TalosClient(dial, dial_timeout=2, rpc_timeout=5) as c:
        with pytest.raises(TalosCertificateError) as err:
            await c.version(endpoint)
    return err.value


async def test_client_certificate_from_a_ca_the_node_does_not_accept(cluster: SimCluster,
                                                                     bundle: SecretsBundle) -> None:
    stranger = generate_ca(CAKind.OS)
    for node in cluster.nodes.values():
        await _refused(cluster, DialBundle.of(stranger, [bundle.os.cert_pem]), node.endpoint)
        refusals = cluster.history.of("handshake_refused", node.name)
        assert refusals, node.name
        assert "TLS handshake failed" in refusals[-1]["reason"]


@pytest.mark.parametrize("usages", [
    (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    (ExtendedKeyUsageOID.SERVER_AUTH,),
    (ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.CODE_SIGNING),
], ids=["server+client", "server-only", "client+codesigning"])
async def test_client_certificate_extkeyusage_must_be_exactly_clientauth(
        cluster: SimCluster, bundle: SecretsBundle, usages: tuple[ObjectIdentifier, ...]) -> None:
    dial = _CustomEKU(bundle.os, (bundle.os.cert_pem,))
    object.__setattr__(dial, "usages", usages)
    cp = cluster.nodes["cp-1"]
    await _refused(cluster, dial, cp.endpoint)
    reason = cluster.history.of("handshake_refused", "cp-1")[-1]["reason"]
    # OpenSSL itself refuses a certificate without ClientAuth; apid's own check refuses the others.
    assert ("ExtKeyUsage" in reason) or ("unsuitable certificate purpose" in reason)


async def test_client_refuses_a_server_signed_by_an_untrusted_ca(cluster: SimCluster,
                                                                 bundle: SecretsBundle) -> None:
    other = generate_ca(CAKind.OS)
    err = await _refused(cluster, DialBundle.of(bundle.os, [other.cert_pem]), cluster.nodes["cp-1"].endpoint)
    assert "serving certificate is not trusted" in str(err)


async def test_reader_role_is_refused_admin_calls_and_sensitive_resources(cluster: SimCluster,
                                                                          bundle: SecretsBundle) -> None:
    cp = cluster.nodes["cp-1"].endpoint
    cfg = cluster.nodes["cp-1"].running.to_bytes()
    async with TalosClient(DialBundle.from_bundle(bundle, roles=("os:reader",)), dial_timeout=2) as reader:
        assert (await reader.version(cp)).tag  # reader calls work
        assert await reader.nodename(cp) == "cp-1"
        calls = [
            reader.apply_configuration(cp, cfg, NO_REBOOT, contract=cluster.contract),
            reader.kubeconfig(cp),
            reader.read(cp, "/proc/sys/kernel/random/boot_id"),
            reader.etcd_forfeit_leadership(cp),
            reader.machine_config(cp),
            reader.os_root(cp),
            reader.etcd_root(cp),
            reader.kubernetes_root(cp),
        ]
        for call in calls:
            with pytest.raises(TalosPermissionDeniedError) as err:
                await call
            assert err.value.code == "PERMISSION_DENIED"
            assert "not authorized" in err.value.detail


async def test_etcd_and_kubeconfig_refused_on_a_worker(cluster: SimCluster, admin: TalosClient) -> None:
    worker = cluster.nodes["worker-1"].endpoint
    for call, api in [(admin.etcd_member_list(worker), "member list"), (admin.etcd_status(worker), "etcd status"),
                      (admin.etcd_alarms(worker), "etcd alarm list"),
                      (admin.etcd_forfeit_leadership(worker), "etcd forfeit leadership"),
                      (admin.kubeconfig(worker), "kubeconfig")]:
        with pytest.raises(TalosUnimplementedError) as err:
            await call
        assert err.value.detail == f"{api} is only available on control plane nodes"


async def test_v114_refuses_mode_reboot(cluster: SimCluster, admin: TalosClient) -> None:
    cp = cluster.nodes["cp-1"]
    with pytest.raises(TalosUnimplementedError) as err:
        await admin.apply_configuration(cp.endpoint, cp.running.to_bytes(), m.ApplyConfigurationRequest.REBOOT,
                                        contract=cp.contract)
    assert err.value.code == "UNIMPLEMENTED"
    assert not cluster.history.of("apply", "cp-1")


async def test_second_concurrent_apply_is_refused(cluster: SimCluster, admin: TalosClient,
                                                  bundle: SecretsBundle) -> None:
    cp = cluster.nodes["cp-1"]
    data = cp.running.to_bytes()
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2) as second:
        await admin.version(cp.endpoint)  # the contract check's read made now: the apply is the first's next call
        first = asyncio.ensure_future(admin.apply_configuration(cp.endpoint, data, NO_REBOOT, contract=cp.contract))
        await asyncio.sleep(0.05)  # the first apply holds the node for 0.2 s
        with pytest.raises(TalosFailedPreconditionError) as err:
            await second.apply_configuration(cp.endpoint, data, NO_REBOOT, contract=cp.contract)
        assert err.value.detail == "another apply configuration is already in progress"
        assert (await first).mode_name == "NO_REBOOT"


async def test_invalid_configurations_are_refused(cluster: SimCluster, admin: TalosClient) -> None:
    cp = cluster.nodes["cp-1"]
    broken = cp.running.copy()
    broken.v1alpha1["machine"]["type"] = "supervisor"
    broken.v1alpha1["machine"]["ca"]["crt"] = "bm90IGEgY2VydA=="
    with pytest.raises(TalosInvalidArgumentError) as err:
        await admin.apply_configuration(cp.endpoint, broken.to_bytes(), NO_REBOOT, contract=cp.contract)
    assert err.value.detail.startswith("2 errors occurred:")
    assert "machine.type" in err.value.detail and "machine.ca.crt" in err.value.detail
    only_docs = MachineConfig([d for d in cp.running.documents if "kind" in d])
    with pytest.raises(TalosInvalidArgumentError) as err2:
        await admin.apply_configuration(cp.endpoint, only_docs.to_bytes(), NO_REBOOT, contract=cp.contract)
    assert err2.value.detail == ("the applied machine configuration doesn't contain v1alpha1 config, "
                                 "did you mean to patch the machine config instead?")
    with pytest.raises(TalosInvalidArgumentError):
        await admin.apply_configuration(cp.endpoint, b"machine: [unclosed", NO_REBOOT, contract=cp.contract)
    assert not cluster.history.of("apply", "cp-1")


async def test_service_restart_etcd_is_refused(cluster: SimCluster, admin: TalosClient) -> None:
    with pytest.raises(TalosRPCError) as err:
        await admin.service_restart(cluster.nodes["cp-1"].endpoint, "etcd")
    assert err.value.code == "UNKNOWN"
    assert err.value.detail == 'service "etcd" doesn\'t support restart operation via API'


async def test_v113_refuses_no_reboot_for_a_change_that_needs_a_reboot(bundle: SecretsBundle) -> None:
    layout = TalosLayout(contract=V1_13, control_planes=1, workers=1, first=41)
    async with layout.running(bundle) as cl, TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2) as c:
        node = cl.nodes["worker-1"]
        changed = node.running.copy()
        changed.v1alpha1["machine"]["token"] = "abcdef.0123456789abcdef"
        with pytest.raises(TalosInvalidArgumentError) as err:
            await c.apply_configuration(node.endpoint, changed.to_bytes(), NO_REBOOT, contract=node.contract)
        assert err.value.detail.startswith("this config change can't be applied in immediate mode")
        assert ".machine.token" in err.value.detail
        # A change inside CanApplyImmediate goes through; BootID does not exist before v1.14.
        ok = node.running.copy()
        ok.v1alpha1["machine"]["certSANs"] = ["w.example"]
        assert (await c.apply_configuration(node.endpoint, ok.to_bytes(), NO_REBOOT,
                                            contract=node.contract)).mode_name == "NO_REBOOT"
        with pytest.raises(TalosPermissionDeniedError):
            await c.cosi_get(node.endpoint, "runtime", "BootIDs.runtime.talos.dev", "boot-id")
        assert (await c.boot_id(node.endpoint, V1_13)) == node.boot_id  # through Read


async def test_errors_never_carry_key_material(cluster: SimCluster, bundle: SecretsBundle) -> None:
    stranger = generate_ca(CAKind.OS)
    err: TalosError = await _refused(cluster, DialBundle.of(stranger, [bundle.os.cert_pem]),
                                     cluster.nodes["cp-1"].endpoint)
    assert "PRIVATE KEY" not in str(err)
    assert bundle.os.key_pem is not None
    assert bundle.os.key_pem.decode() not in repr(DialBundle.from_bundle(bundle))
