"""Issue 26, "etcd snapshots that exist", held to etcd's own tooling: `ichord cluster etcd-snapshot` against a
simulated control plane whose EtcdSnapshot streams (1) a snapshot of the real etcd this tier runs (taken through
etcd's Maintenance.Snapshot, as machined's etcd client takes it) and (2) the simulator's own database; each file
is accepted by `etcdutl snapshot status` (bbolt's consistency check, etcd's buckets) and `etcdutl snapshot
restore` (which checks etcd's SHA-256 at the end), both built from the etcd module the tier pins (v3.6.8)."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.combined import SimEnvironment
from tests.real import tools
from tests.real.controlplane import ControlPlane

pytestmark = [pytest.mark.anyio]
CLI = "import sys; from ichord import cli; sys.exit(cli.main(sys.argv[1:]))"


def real_etcd_snapshot(plane: ControlPlane) -> bytes:
    """Maintenance.Snapshot of the tier's etcd through its gRPC gateway: the database, then its SHA-256."""
    pki = plane.workdir / "pki"
    ctx = ssl.create_default_context(cadata=plane.etcd_ca.cert_pem.decode())
    ctx.load_cert_chain(pki / "apiserver-etcd-client.crt", pki / "apiserver-etcd-client.key")
    req = urllib.request.Request(plane.etcd_url + "/v3/maintenance/snapshot", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, context=ctx, timeout=60) as resp:
        for line in resp:
            if line.strip():
                message: dict[str, Any] = json.loads(line)
                if "error" in message:
                    raise AssertionError(f"etcd refused the snapshot: {message['error']}")
                chunks.append(base64.b64decode(message["result"].get("blob") or ""))
    return b"".join(chunks)


def etcdutl(*args: str) -> subprocess.CompletedProcess[str]:
    binary = tools.tool("etcdutl")
    assert binary is not None
    return subprocess.run([str(binary), *args], capture_output=True, text=True, check=False, timeout=120)


def status_of(path: Path) -> dict[str, Any]:
    result = etcdutl("snapshot", "status", str(path), "-w", "json")
    assert result.returncode == 0, f"etcdutl refused {path}: {result.stdout}{result.stderr}"
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def restores(path: Path, tmp: Path) -> None:
    result = etcdutl("snapshot", "restore", str(path), "--data-dir", str(tmp / f"restored-{path.stem}"))
    assert result.returncode == 0, f"etcdutl could not restore {path}: {result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    reason = tools.missing("etcdutl")
    if reason:
        pytest.skip(reason)
    async with SimEnvironment(bundle=bundle, time_scale=0.02, control_planes=3, workers=0,
                              management_api="separate") as e:
        yield e


async def etcd_snapshot(env: SimEnvironment, path: Path) -> str:
    proc = await anyio.run_process([sys.executable, "-c", CLI, "cluster", "etcd-snapshot", env.cluster_name,
                                    "-n", env.namespace, "--kubeconfig", str(env.kubeconfig), "-f", str(path)],
                                   check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


async def test_a_snapshot_of_the_real_etcd_through_ichord_is_one_etcd_accepts(
        env: SimEnvironment, control_plane: ControlPlane, crds: list[str], tmp_path: Path) -> None:
    real = await anyio.to_thread.run_sync(real_etcd_snapshot, control_plane)

    async def from_real_etcd() -> bytes:
        return real

    env.talos.etcd_snapshot_source = from_real_etcd
    path = tmp_path / "real.db"
    out = await etcd_snapshot(env, path)
    assert path.read_bytes() == real  # byte for byte what etcd sent, nothing added or lost
    assert "etcd's SHA-256 of the database, at its end, verified" in out
    status = status_of(path)
    # kube-apiserver's keys (CRDs, RBAC, namespaces, ...) are in it, at etcd 3.6's storage version.
    assert status["totalKey"] > 50 and status["revision"] > 1 and status["version"].startswith("3.6")
    restores(path, tmp_path)


async def test_the_simulators_own_snapshot_is_one_etcd_accepts(env: SimEnvironment, tmp_path: Path) -> None:
    path = tmp_path / "sim.db"
    await etcd_snapshot(env, path)
    status = status_of(path)
    members = len(env.talos.etcd.members)
    # The key bucket's puts (a namespace, a Node per member) at their revisions, etcd 3.6's storage version.
    assert (status["totalKey"], status["revision"], status["version"]) == (1 + members, 2 + members, "3.6.0")
    restores(path, tmp_path)
