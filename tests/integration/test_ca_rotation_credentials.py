"""`ichord cluster credentials` (the operator's hand-off of a CA rotation) on the simulators, over the real wire.

The rotation is driven in-process by the Driver with its own acknowledgement switched off: the only thing
that lets it leave AwaitingCredentials is the annotation ``hand_off`` sets.
"""

from __future__ import annotations

import base64
import os
import stat
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

from ichord import yamlio
from ichord.api import names
from ichord.credentials import CredentialsError, HandOff, NoRotationUnderWay, hand_off
from ichord.credentials.mint import talosconfig_dial
from ichord.kube.client import from_kubeconfig
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.operations.outcome import Done
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.rotation import Target
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube.routes import Route
from ichord.sim.kube.status import ApiError
from ichord.talos.client import TalosClient
from tests.integration._ca_rotation_driver import Driver, add_clients, at, driving, live_rotation

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
SCALE = 0.02
FAST: dict[str, Any] = {"poll": 0.05, "retry_delays": (0.02, 0.1)}
CLI = "import sys; from ichord import cli; sys.exit(cli.main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, control_planes=3, workers=1) as e:
        add_clients(e)
        yield e


@pytest.fixture
async def driver(env: SimEnvironment) -> AsyncIterator[Driver]:
    async with driving(env, acknowledge=False) as d:  # only hand_off moves it past AwaitingCredentials
        yield d


class Said:
    """Collects what hand_off says."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.first = anyio.Event()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        self.first.set()

    def starting(self, prefix: str) -> list[str]:
        return [line for line in self.lines if line.startswith(prefix)]


class Intercept:
    """Makes the simulated API answer chosen requests with an error of our choosing (over the real wire)."""

    def __init__(self, env: SimEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rules: list[tuple[Callable[[Route], bool], ApiError, int]] = []
        rest = env.kube.rest
        original = rest.handle

        async def handle(request: Any, route: Route) -> Any:
            for i, (match, error, left) in enumerate(self.rules):
                if left != 0 and match(route):
                    self.rules[i] = (match, error, left - 1)
                    raise error
            return await original(request, route)

        monkeypatch.setattr(rest, "handle", handle)

    def add(self, match: Callable[[Route], bool], error: ApiError, times: int = -1) -> None:
        self.rules.append((match, error, times))


def leaves(pem_text: bytes) -> list[x509.Certificate]:
    return [_pem.load_certificate(b) for b in _pem.pem_blocks(pem_text)]


def signed_by(cert: x509.Certificate, ca_pem: bytes) -> bool:
    ca = _pem.load_certificate(ca_pem)
    if cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def kube_get_nodes(kubeconfig: Path) -> list[str]:
    """A real request with exactly the written file (its own trust, its own client certificate)."""
    async with await from_kubeconfig(kubeconfig) as kc:
        out = await kc.raw("GET", "/api/v1/nodes")
    return sorted(str(n["metadata"]["name"]) for n in out["items"])


async def talos_versions(result: HandOff, env: SimEnvironment) -> int:
    """Version on every endpoint with exactly the file's certificate (the CA passed is never used to sign)."""
    assert env.bundle is not None
    dial, endpoints = talosconfig_dial(result.talosconfig.read_bytes(), env.bundle.os)
    async with TalosClient(dial, dial_timeout=2, rpc_timeout=5) as client:
        for endpoint in endpoints:
            await client.version(endpoint)
    return len(endpoints)


async def test_waits_for_the_stage_hands_off_and_the_files_work_through_to_done(
        env: SimEnvironment, driver: Driver, tmp_path: Path) -> None:
    await driver.create()
    said = Said()
    out = tmp_path / "creds"
    results: list[HandOff] = []

    async def run() -> None:
        results.append(await hand_off(driver.kube, env.namespace, env.cluster_name, out, say=said, wait=60, **FAST))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)  # before the rotation has even started: it must wait for AwaitingCredentials
        await driver.run(until=at("Issuing"))
    [result] = results
    assert said.starting(f"waiting for {driver.op_name} to reach AwaitingCredentials") == [said.lines[0]]
    assert len(said.starting("waiting")) == 1, said.lines
    op = await driver.get()
    assert result.acknowledged and result.stage == "AwaitingCredentials" and result.operation == driver.op_name
    assert op["metadata"]["annotations"][names.CREDENTIALS_HANDOFF_ANNOTATION] == result.token
    assert result.token == handoff_token(op["status"]["caRotation"]["certificates"])

    # The files: 0600, in a 0700 directory, talosconfig signed by the new OS CA trusting both.
    assert result.talosconfig == out / "talosconfig" and result.kubeconfig == out / "kubeconfig"
    assert mode(result.talosconfig) == 0o600 and mode(result.kubeconfig) == 0o600 and mode(out) == 0o700
    rotation = live_rotation(env)
    assert rotation is not None and env.bundle is not None
    new_os, new_k8s = rotation.new[Target.TALOS], rotation.new[Target.KUBERNETES]
    tc = yamlio.load(result.talosconfig.read_text())
    ctx = tc["contexts"][tc["context"]]
    assert tc["context"] == env.cluster_name
    cps = [m for m in env.machines if m.role == "controlplane"]
    assert ctx["endpoints"] == sorted(m.address for m in cps) and len(ctx["endpoints"]) == 3
    client = _pem.load_certificate(base64.b64decode(ctx["crt"]))
    assert signed_by(client, new_os.cert_pem) and not signed_by(client, env.bundle.os.cert_pem)
    assert [a.value for a in client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["os:admin"]
    trusted = leaves(base64.b64decode(ctx["ca"]))
    assert trusted == [_pem.load_certificate(env.bundle.os.cert_pem), _pem.load_certificate(new_os.cert_pem)]
    kc = yamlio.load(result.kubeconfig.read_text())
    kube_client = _pem.load_certificate(base64.b64decode(kc["users"][0]["user"]["client-certificate-data"]))
    assert signed_by(kube_client, new_k8s.cert_pem)
    assert kube_client.subject.rfc4514_string() == "CN=admin,O=system:masters"
    assert kc["clusters"][0]["cluster"]["server"] == env.kube.url
    assert leaves(base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"])) == [
        _pem.load_certificate(env.bundle.k8s.cert_pem), _pem.load_certificate(new_k8s.cert_pem)]

    # In Issuing (the API server now serves from the new CA) and after Done both files still work.
    nodes = sorted(env.talos.nodes[m].nodename for m in env.machine_names)
    assert await kube_get_nodes(result.kubeconfig) == nodes
    assert await talos_versions(result, env) == 3
    # Run again past the stage: working files, but nothing to acknowledge.
    late = await hand_off(driver.kube, env.namespace, env.cluster_name, tmp_path / "late", say=said, wait=60, **FAST)
    assert not late.acknowledged and late.stage == "Issuing" and late.token == result.token
    assert said.lines[-1].startswith(f"{driver.op_name} is already in Issuing")
    assert await kube_get_nodes(late.kubeconfig) == nodes
    assert isinstance(await driver.run(), Done)
    assert await kube_get_nodes(result.kubeconfig) == nodes
    assert await talos_versions(result, env) == 3


async def test_the_command_line(env: SimEnvironment, driver: Driver, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    out.mkdir()  # a directory the operator names must exist

    async def cli(*args: str) -> tuple[int, str, str]:
        proc = await anyio.run_process(
            [sys.executable, "-c", CLI, "cluster", "credentials", env.cluster_name, "--kubeconfig",
             str(env.kubeconfig), "-n", env.namespace, "-d", str(out), "--wait", "30", *args], check=False)
        return proc.returncode, proc.stdout.decode(), proc.stderr.decode()

    # No rotation: exit 2, a message saying so, nothing written.
    rc, stdout, stderr = await cli("--acknowledge")
    assert rc == 2 and "no ca-rotation" in stderr and "Nothing was written" in stderr, (stdout, stderr)
    assert list(out.iterdir()) == []

    await driver.create()
    await driver.run(until=at("AwaitingCredentials"))
    rc, stdout, stderr = await cli()  # without --acknowledge: written and verified, the rotation keeps waiting
    assert rc == 0, stderr
    assert "not acknowledged" in stdout and mode(out / "kubeconfig") == 0o600
    op = await driver.get()
    assert names.CREDENTIALS_HANDOFF_ANNOTATION not in (op["metadata"].get("annotations") or {})
    assert op["status"]["caRotation"]["stage"] == "AwaitingCredentials"

    rc, stdout, stderr = await cli("--acknowledge")
    assert rc == 0, stderr
    op = await driver.get()
    token = handoff_token(op["status"]["caRotation"]["certificates"])
    assert op["metadata"]["annotations"][names.CREDENTIALS_HANDOFF_ANNOTATION] == token
    assert f"wrote {out / 'talosconfig'}" in stdout and "acknowledged" in stdout
    key = yamlio.load((out / "talosconfig").read_text())["contexts"][env.cluster_name]["key"]
    for text in (stdout, stderr):  # paths and fingerprints only
        assert "PRIVATE KEY" not in text and key[:40] not in text and "LS0tLS1CRUdJTi" not in text
    await driver.run(until=at("Issuing"))


async def test_transient_errors_are_waited_through_with_one_line(
        env: SimEnvironment, driver: Driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await driver.create()
    await driver.run(until=at("AwaitingCredentials"))
    intercept = Intercept(env, monkeypatch)
    # The CRD group not served yet (a 404 without an object name), then a webhook that timed out on the patch.
    intercept.add(lambda r: r.plural == "talosoperations" and r.verb == "list",
                  ApiError(404, "NotFound", "the server could not find the requested resource"), times=2)
    intercept.add(lambda r: r.plural == "talosoperations" and r.verb == "patch",
                  ApiError(500, "InternalError", 'Internal error occurred: failed calling webhook "v.example.com": '
                                                 "failed to call webhook: context deadline exceeded"), times=2)
    env.kube.faults.error_code = 503
    env.kube.faults.error_rate = {"get": 1.0}
    said = Said()
    results: list[HandOff] = []

    async def run() -> None:
        results.append(await hand_off(driver.kube, env.namespace, env.cluster_name, tmp_path, say=said, wait=60,
                                      **FAST))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(20):
            await said.first.wait()
        await env.kube.go_down()  # now refused connections
        await anyio.sleep(0.3)
        env.kube.faults.error_rate = {}
        await env.kube.come_up()
    [result] = results
    assert said.lines == said.starting("waiting for the Kubernetes API") and len(said.lines) == 1, said.lines
    assert "503" in said.lines[0]
    assert result.acknowledged and mode(result.kubeconfig) == 0o600
    assert not intercept.rules or all(left == 0 for _, _, left in intercept.rules)  # both were met and retried
    await driver.run(until=at("Issuing"))


async def test_final_errors_stop_at_once_and_write_nothing(
        env: SimEnvironment, driver: Driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said = Said()
    with pytest.raises(NoRotationUnderWay, match="start the rotation first"):
        await hand_off(driver.kube, env.namespace, env.cluster_name, tmp_path / "a", say=said, **FAST)
    with pytest.raises(CredentialsError, match=r"TalosCluster .*/nope failed.*Check the name"):
        await hand_off(driver.kube, env.namespace, "nope", tmp_path / "a", say=said, **FAST)
    await driver.create()
    await driver.run(until=at("AwaitingCredentials"))
    intercept = Intercept(env, monkeypatch)
    intercept.add(lambda r: r.plural == "secrets" and r.verb == "get",
                  ApiError(403, "Forbidden", 'secrets "demo-secrets" is forbidden: User "op" cannot get resource',
                           {"name": "demo-secrets", "kind": "secrets"}))
    with anyio.fail_after(10), pytest.raises(CredentialsError, match=r"Forbidden.*lacks the permission"):
        await hand_off(driver.kube, env.namespace, env.cluster_name, tmp_path / "a", say=said, wait=60, **FAST)
    intercept.rules.clear()
    intercept.add(lambda r: r.plural == "talosoperations" and r.verb == "patch",
                  ApiError(400, "BadRequest", 'admission webhook "v.example.com" denied the request: no'))
    with anyio.fail_after(10), pytest.raises(CredentialsError, match="denied the request"):
        await hand_off(driver.kube, env.namespace, env.cluster_name, tmp_path / "b", say=said, wait=60, **FAST)
    assert said.lines == [] and not (tmp_path / "a").exists()
    op = await driver.get()
    assert names.CREDENTIALS_HANDOFF_ANNOTATION not in (op["metadata"].get("annotations") or {})
