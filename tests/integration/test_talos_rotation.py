"""The Talos API (OS) CA rotated by hand through TalosClient, the way `talosctl rotate-ca` does it
(accept, issue, drop), on 3 control planes + 1 worker. At every step the nodes answer
the right credentials and refuse the wrong ones, and apid never restarts."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.hashes import SHA256

from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CAKind, CertificateAuthority, generate_ca
from ichord.render.config import MachineConfig
from ichord.sim.talos.cluster import SimCluster
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosCertificateError
from ichord.talos.proto.gen.machine import machine_pb2 as m
from tests.integration._talos_helpers import TalosLayout

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
Patch = Callable[[MachineConfig, bool], None]


def b64(pem: bytes) -> str:
    return base64.b64encode(pem).decode()


@pytest.fixture
def talos_layout() -> TalosLayout:
    return TalosLayout(control_planes=3, workers=1, first=61)


async def patch_all(client: TalosClient, cluster: SimCluster, patch: Patch) -> None:
    """Control planes then workers, one at a time: read the running config, patch, apply NO_REBOOT."""
    order = sorted(cluster.nodes.values(), key=lambda n: (not n.is_control_plane, n.name))
    for node in order:
        cfg = MachineConfig.parse(await client.machine_config(node.endpoint))
        patch(cfg, node.is_control_plane)
        res = await client.apply_configuration(node.endpoint, cfg.to_bytes(), m.ApplyConfigurationRequest.NO_REBOOT,
                                               contract=node.contract)
        assert res.mode_name == "NO_REBOOT"


async def answers(cluster: SimCluster, dial: DialBundle) -> dict[str, bool]:
    """Which nodes answer Version with these credentials (a fresh client per check)."""
    out = {}
    for node in cluster.nodes.values():
        async with TalosClient(dial, dial_timeout=2, rpc_timeout=5) as c:
            try:
                await c.version(node.endpoint)
                out[node.name] = True
            except TalosCertificateError:
                out[node.name] = False
    return out


async def test_talos_ca_rotation_accept_issue_drop(cluster: SimCluster, bundle: SecretsBundle) -> None:
    old: CertificateAuthority = bundle.os
    new = generate_ca(CAKind.OS)
    everyone = dict.fromkeys(cluster.nodes, True)
    nobody = dict.fromkeys(cluster.nodes, False)
    current = DialBundle.of(old, [old.cert_pem])
    intermediate = DialBundle.of(new, [old.cert_pem])  # new client certificate, old server CA
    final = DialBundle.of(new, [new.cert_pem])
    old_cert_both_trusted = DialBundle.of(old, [old.cert_pem, new.cert_pem])
    stranger = DialBundle.of(generate_ca(CAKind.OS), [old.cert_pem, new.cert_pem])

    # Before: only the old CA works.
    async with TalosClient(current) as c:
        assert (await c.os_root(cluster.nodes["cp-1"].endpoint)).issuing_ca == old.cert_pem
    assert await answers(cluster, current) == everyone
    assert await answers(cluster, intermediate) == nobody  # the nodes do not accept the new CA yet
    assert await answers(cluster, final) == nobody

    # 1. Accept: machine.acceptedCAs += new (with the current client).
    def accept(cfg: MachineConfig, cp: bool) -> None:
        cfg.v1alpha1["machine"].setdefault("acceptedCAs", []).append({"crt": b64(new.cert_pem)})

    async with TalosClient(current) as c:
        await patch_all(c, cluster, accept)
    assert await answers(cluster, intermediate) == everyone
    assert await answers(cluster, current) == everyone
    assert await answers(cluster, final) == nobody  # the servers still present the old CA
    assert await answers(cluster, stranger) == nobody

    # 2. Issue: accepted = [old]; machine.ca = new (key on control planes only), with the intermediate client.
    def issue(cfg: MachineConfig, cp: bool) -> None:
        machine = cfg.v1alpha1["machine"]
        machine["acceptedCAs"] = [a for a in machine["acceptedCAs"] if a["crt"] != b64(new.cert_pem)]
        machine["acceptedCAs"].append({"crt": b64(old.cert_pem)})
        assert new.key_pem is not None
        machine["ca"] = {"crt": b64(new.cert_pem), "key": b64(new.key_pem) if cp else ""}

    async with TalosClient(intermediate) as c:
        await patch_all(c, cluster, issue)
    assert await answers(cluster, final) == everyone
    assert await answers(cluster, old_cert_both_trusted) == everyone  # the old client CA is still accepted
    assert await answers(cluster, current) == nobody  # the client no longer trusts what the nodes serve
    async with TalosClient(final) as c:
        for node in cluster.nodes.values():
            root = await c.os_root(node.endpoint)
            assert (root.issuing_ca, root.accepted_cas, root.can_issue) == (
                new.cert_pem, (old.cert_pem,), node.is_control_plane)

    # 3. Drop: accepted = [], with the new client.
    def drop(cfg: MachineConfig, cp: bool) -> None:
        machine = cfg.v1alpha1["machine"]
        machine["acceptedCAs"] = [a for a in machine["acceptedCAs"] if a["crt"] != b64(old.cert_pem)]

    async with TalosClient(final) as c:
        await patch_all(c, cluster, drop)
    assert await answers(cluster, final) == everyone
    assert await answers(cluster, old_cert_both_trusted) == nobody
    assert await answers(cluster, stranger) == nobody

    # apid reloaded its certificates without a restart or reboot; every refusal was recorded with its cause.
    assert all(n.boots == 1 for n in cluster.nodes.values())
    assert not cluster.history.of("reboot")
    refusals = cluster.history.of("handshake_refused")
    assert refusals
    assert all(r["reason"].startswith("TLS handshake failed") for r in refusals)
    tls = cluster.state()["nodes"]
    assert {n["tls"]["serving_issuer"] for n in tls.values()} == {new.certificate.fingerprint(SHA256()).hex()[:16]}
