"""An https health gate whose server is signed by a private CA (ichord/operations/gates.py, docs/health-gates.md):
a Prometheus-shaped test server on loopback whose CA is in no system store, only in a ConfigMap or Secret key the
gate's ``caBundle`` names. A config rollout on the simulators (3 control planes + 1 worker) is held by the gate
without the bundle (GateFailing, saying the certificate is not trusted and what to do), goes on with it, and a
reference that cannot be followed holds it with InvalidHealthGates naming the reference."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.operations import gates
from ichord.operations.gates import GateSpecError, policy_of, resolve_trust
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import REBOOT_PATCH, World, reboots, world_on

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
SCALE = 0.01
TIMING = Timing().scaled(SCALE)
CA_CONFIGMAP = "monitoring-ca"


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


class PrivateServer:
    """An https server on 127.0.0.1 answering Prometheus's instant query with an empty vector, its certificate
    issued for 127.0.0.1 by a CA of its own (``ca_pem``)."""

    def __init__(self) -> None:
        ca, ca_key = _ca("gate test CA")
        self.ca_pem = _pem(ca)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prometheus")]))
                .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        self._tmp = tempfile.TemporaryDirectory()
        chain, key_file = Path(self._tmp.name) / "tls.crt", Path(self._tmp.name) / "tls.key"
        chain.write_text(_pem(cert))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        self.ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ssl.load_cert_chain(chain, key_file)
        self.queries = 0
        self.url = ""

    async def _query(self, request: web.Request) -> web.Response:
        self.queries += 1
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})

    async def __aenter__(self) -> PrivateServer:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"https://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
        self._tmp.cleanup()


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def server() -> AsyncIterator[PrivateServer]:
    async with PrivateServer() as s:
        yield s


@pytest.fixture
async def world(bundle: SecretsBundle) -> AsyncIterator[World]:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, control_planes=3, workers=1) as env:
        async for w in world_on(env, TIMING):
            yield w


def _cond(obj: Obj) -> Obj:
    return find((obj.get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT) or {}


def _gate(url: str, ca_bundle: Obj | None = None) -> Obj:
    body: Obj = {"url": url, "query": "up == 0"}
    if ca_bundle is not None:
        body["caBundle"] = ca_bundle
    return {"name": "private-prometheus", "prometheus": body}


async def _set_health(world: World, health: Obj) -> None:
    await crds.clusters(world.kube).patch(world.env.namespace, world.env.cluster_name, {"spec": {"health": health}})


async def _create(world: World, kind: str, name: str, data: Obj) -> None:
    plural = "configmaps" if kind == "ConfigMap" else "secrets"
    await world.kube.raw("POST", f"/api/v1/namespaces/{world.env.namespace}/{plural}", body={
        "apiVersion": "v1", "kind": kind, "metadata": {"name": name}, "data": data})


async def _start(world: World, name: str) -> None:
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 4

    await world.run_until(reported, what="every machine reporting rebootPaths")
    await crds.operations(world.kube).create(world.env.namespace, {"metadata": {"name": name}, "spec": {
        "clusterRef": {"name": world.env.cluster_name}, "kind": "config", "paused": False}})


async def _until_reason(world: World, name: str, reason: str) -> Obj:
    async def there() -> bool:
        return _cond(await world.op(name)).get("reason") == reason

    try:
        await world.run_until(there, what=f"{name} {reason}")
    except AssertionError:
        raise AssertionError(f"{name} is not {reason}: {_cond(await world.op(name))}") from None
    return await world.op(name)


async def _completed(world: World, name: str) -> Obj:
    async def done() -> bool:
        return (await world.op(name)).get("status", {}).get("phase") in ("Completed", "Failed")

    try:
        await world.run_until(done, steps=4000, what=f"{name} finished")
    except AssertionError:
        raise AssertionError(f"{name} did not finish: {_cond(await world.op(name))}") from None
    return await world.op(name)


async def test_without_the_bundle_the_gate_fails_saying_why_and_with_it_the_rollout_goes_on(
        world: World, server: PrivateServer) -> None:
    env = world.env
    await _set_health(world, {"gates": [_gate(server.url)]})
    since = len(env.talos.history.events)
    await _start(world, "roll")
    op = await _until_reason(world, "roll", names.HealthGateReason.FAILING)
    message = _cond(op)["message"]
    assert "not trusted by the system's CAs (the gate has no caBundle)" in message, message
    assert "certificate verify failed" in message or "self-signed" in message or "issuer" in message, message
    assert op["status"]["phase"] == "Paused"
    assert sum(reboots(env, since).values()) == 0
    assert server.queries == 0  # no request got past the handshake

    # The CA, in a Secret key (base64 in data, as every Secret's): the gate passes, the rollout goes on.
    encoded = base64.b64encode(server.ca_pem.encode()).decode()
    await _create(world, "Secret", "monitoring-ca-secret", {"ca.crt": encoded})
    await _set_health(world, {"gates": [_gate(server.url, {"secretKeyRef": {"name": "monitoring-ca-secret",
                                                                           "key": "ca.crt"}})]})
    op = await _completed(world, "roll")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == {m: 1 for m in env.machine_names}
    assert server.queries >= 4  # asked before every node
    verdicts = op["status"]["healthGates"]["gates"]
    assert [(g["name"], g["passing"], g["message"]) for g in verdicts] == [
        ("private-prometheus", True, "the query returned nothing")]


async def test_a_configmap_bundle_passes_and_a_bad_reference_is_invalid_naming_it(
        world: World, server: PrivateServer) -> None:
    env = world.env
    await _set_health(world, {"gates": [_gate(server.url, {"configMapKeyRef": {"name": CA_CONFIGMAP,
                                                                               "key": "ca.crt"}})]})
    since = len(env.talos.history.events)
    await _start(world, "roll")
    op = await _until_reason(world, "roll", names.HealthGateReason.INVALID)
    message = _cond(op)["message"]
    assert (f"health gate 'private-prometheus': prometheus.caBundle names ConfigMap {env.namespace}/{CA_CONFIGMAP}, "
            "which does not exist") in message, message
    assert op["status"]["phase"] == "Paused"
    assert sum(reboots(env, since).values()) == 0
    assert server.queries == 0

    await _create(world, "ConfigMap", CA_CONFIGMAP, {"ca.crt": server.ca_pem})
    op = await _completed(world, "roll")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == {m: 1 for m in env.machine_names}


async def test_references_that_cannot_be_followed_name_what_is_wrong(world: World, server: PrivateServer) -> None:
    """resolve_trust through the kube client against the simulated API (each a GET): the key missing, no certificate
    in it (its content never repeated), a wrong bundle (another CA) failing the TLS handshake, never skipped."""
    ns = world.env.namespace
    other, _ = _ca("another CA")
    await _create(world, "ConfigMap", "cas", {"ca.crt": server.ca_pem, "other.crt": _pem(other),
                                             "notes": "s3cr3t-not-a-certificate"})

    async def resolved(ref: Obj) -> gates.HealthPolicy:
        return await resolve_trust(world.kube, ns, policy_of({"spec": {"health": {"gates": [
            _gate(server.url, ref)]}}}, {}))

    with pytest.raises(GateSpecError, match=r"which has no key 'tls\.crt'"):
        await resolved({"configMapKeyRef": {"name": "cas", "key": "tls.crt"}})
    with pytest.raises(GateSpecError, match=r"whose key 'notes' holds no PEM certificate") as refused:
        await resolved({"configMapKeyRef": {"name": "cas", "key": "notes"}})
    assert "s3cr3t" not in str(refused.value)
    with pytest.raises(GateSpecError, match=f"names Secret {ns}/cas, which does not exist"):
        await resolved({"secretKeyRef": {"name": "cas", "key": "ca.crt"}})

    probe = gates.kube_probe(world.kube)
    wrong = (await resolved({"configMapKeyRef": {"name": "cas", "key": "other.crt"}})).gates[0]
    verdict = await gates.evaluate(wrong, probe, target="n")
    assert not verdict.passing and "not trusted by the gate's caBundle" in verdict.message, verdict
    right = (await resolved({"configMapKeyRef": {"name": "cas", "key": "ca.crt"}})).gates[0]
    verdict = await gates.evaluate(right, probe, target="n")
    assert verdict.passing, verdict
