"""`ichord cluster bundle-export` against the Kubernetes API simulator over HTTPS (docs/decisions.md#rotation-state,
docs/decisions.md#credentials-handoff)."""

from __future__ import annotations

import base64
import os
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api.conditions import Condition, find, set_condition
from ichord.api.names import BUNDLE_BACKUP_STALE, BUNDLE_EXPORTED_ANNOTATION, BundleBackupStaleReason
from ichord.cluster_cli import ClusterCommandError, RotationUnderWay, bundle_export
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import clusters
from ichord.kube.events import EventRecorder
from ichord.kube.status import update_status
from ichord.operations.cert_expiry import expiry_pass, forget_cluster
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CAKind, generate_ca
from ichord.pki.fingerprint import export_fingerprint
from ichord.settings import Timing
from ichord.sim.kube import KubeSimulator

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

NS = "clusters"
TIMING = Timing().scaled(0.01)
MERGE = "application/merge-patch+json"
# Runs the real entry point with the cluster commands registered (cli.py lists the module once the lead adds it).
CLI = ("import sys; from ichord import cli\n"
       "if 'ichord.cluster_cli' not in cli.COMMAND_MODULES:\n"
       "    cli.COMMAND_MODULES = (*cli.COMMAND_MODULES, 'ichord.cluster_cli')\n"
       "sys.exit(cli.main(sys.argv[1:]))")


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()  # RSA key: once per module


@dataclass
class Env:
    sim: KubeSimulator
    kube: KubeClient
    kubeconfig: Path

    async def make_cluster(self, name: str, data: dict[str, bytes]) -> None:
        await self.kube.raw("POST", f"/api/v1/namespaces/{NS}/secrets", body={
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-bundle", "namespace": NS},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}})
        await clusters(self.kube).create(NS, {
            "metadata": {"name": name, "namespace": NS},
            "spec": {"secretsRef": {"name": f"{name}-bundle"}, "endpoint": "https://10.0.0.1:6443",
                     "kubernetesVersion": "1.34.1"}})

    async def annotations(self, name: str) -> dict[str, Any]:
        return dict((await clusters(self.kube).get(NS, name))["metadata"].get("annotations") or {})


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with KubeSimulator() as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc", namespace=NS)
        kube = await from_kubeconfig(kc, timing=TIMING)
        await kube.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        try:
            yield Env(sim, kube, kc)
        finally:
            await kube.close()


def rotation_yaml(bundle: SecretsBundle) -> bytes:
    # Any content: the export refuses on the key's presence, before reading it.
    return b"kubernetes:\n  crt: " + base64.b64encode(bundle.k8s.cert_pem) + b"\n"


async def test_export_is_refused_while_a_rotation_is_under_way(env: Env, bundle: SecretsBundle,
                                                               tmp_path: Path) -> None:
    await env.make_cluster("rot", {"secrets.yaml": bundle.to_yaml().encode(), "rotation.yaml": rotation_yaml(bundle)})
    out = tmp_path / "exports" / "secrets.yaml"
    out.parent.mkdir()
    env.sim.requests.clear()
    with pytest.raises(RotationUnderWay, match=r"rotation .* under way.*rotation.yaml.*Finalizing.*after the rotation"):
        await bundle_export(env.kube, "rot", namespace=NS, output=out)
    assert not out.exists()
    assert BUNDLE_EXPORTED_ANNOTATION not in await env.annotations("rot")
    assert env.sim.requests.count(verb="patch") == 0


async def test_export_writes_0600_reads_back_and_annotates(env: Env, bundle: SecretsBundle, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    live = bundle.with_cas({CAKind.ETCD: generate_ca(CAKind.ETCD)})
    raw = live.to_yaml().encode()
    await env.make_cluster("ok", {"secrets.yaml": raw})
    # The rotation raised BundleBackupStale; an export of the pre-rotation bundle was annotated earlier.
    await clusters(env.kube).patch(NS, "ok", {"metadata": {"annotations": {
        BUNDLE_EXPORTED_ANNOTATION: export_fingerprint(bundle)}}})
    stale = Condition(BUNDLE_BACKUP_STALE, "True", BundleBackupStaleReason.CA_ROTATED, "export the bundle")
    await update_status(clusters(env.kube), NS, "ok",
                        lambda s, _o: {**s, "conditions": set_condition(s.get("conditions"), stale)})

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    out = tmp_path / "home" / ".ichord" / "clusters" / "ok" / "secrets.yaml"  # ichord's own place: created 0700
    report = await bundle_export(env.kube, "ok", namespace=NS)
    assert report.fingerprint == export_fingerprint(live) != export_fingerprint(bundle)
    assert out.read_bytes() == raw
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(out.parent.parent.stat().st_mode) == 0o700
    assert [p.name for p in out.parent.iterdir()] == ["secrets.yaml"]  # no temporary file left behind
    assert (await env.annotations("ok"))[BUNDLE_EXPORTED_ANNOTATION] == export_fingerprint(live)

    obj = await clusters(env.kube).get(NS, "ok")
    await expiry_pass(env.kube, obj, namespace_of_secret=NS, recorder=EventRecorder(env.kube, instance="t"),
                      timing=TIMING)
    cond = find((await clusters(env.kube).get(NS, "ok"))["status"]["conditions"], BUNDLE_BACKUP_STALE)
    assert cond is not None and cond["status"] == "False"
    forget_cluster(NS, "ok")


async def test_export_errors_are_typed(env: Env, bundle: SecretsBundle, tmp_path: Path) -> None:
    with pytest.raises(ClusterCommandError, match="TalosCluster clusters/nope not found"):
        await bundle_export(env.kube, "nope", namespace=NS, output=tmp_path / "x")
    await env.make_cluster("elsewhere", {"secrets.yaml": bundle.to_yaml().encode()})
    with pytest.raises(ClusterCommandError, match="--secret-namespace"):
        await bundle_export(env.kube, "elsewhere", namespace=NS, output=tmp_path / "x", secret_namespace="ichord")
    assert not (tmp_path / "x").exists()


async def run_cli(env: Env, home: Path, *args: str) -> tuple[int, str, str]:
    environ = {**os.environ, "HOME": str(home), "KUBECONFIG": str(env.kubeconfig)}
    done = await anyio.run_process([sys.executable, "-c", CLI, *args], env=environ, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_the_command_line(env: Env, bundle: SecretsBundle, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    await env.make_cluster("busy", {"secrets.yaml": bundle.to_yaml().encode(), "rotation.yaml": rotation_yaml(bundle)})
    code, _out, err = await run_cli(env, home, "cluster", "bundle-export", "busy", "-n", NS)
    assert code == 2 and "rotation" in err and "Nothing was written" in err
    assert not (home / ".ichord").exists()

    await env.make_cluster("c1", {"secrets.yaml": bundle.to_yaml().encode()})
    target = home / ".ichord" / "clusters" / "c1" / "secrets.yaml"
    target.parent.mkdir(parents=True)
    target.write_text("not a bundle\n")  # not an earlier export of c1: kept, the export refused
    code, out, err = await run_cli(env, home, "cluster", "bundle-export", "c1")
    assert code == 2 and "is not an earlier export of TalosCluster clusters/c1" in err and "--force" in err, err
    assert target.read_text() == "not a bundle\n"
    # An earlier export of the same cluster (its CAs since rotated: the same id and secret) is replaced.
    target.write_bytes(bundle.with_cas({CAKind.OS: generate_ca(CAKind.OS)}).to_yaml().encode())
    target.chmod(0o644)
    code, out, err = await run_cli(env, home, "cluster", "bundle-export", "c1")  # namespace from the context
    assert code == 0, err
    assert str(target) in out and export_fingerprint(bundle) in out
    assert target.read_bytes() == bundle.to_yaml().encode()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert (await env.annotations("c1"))[BUNDLE_EXPORTED_ANNOTATION] == export_fingerprint(bundle)
