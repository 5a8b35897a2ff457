"""Issue 26, "etcd snapshots that exist": `ichord cluster etcd-snapshot NAME -n NS -f FILE` against the simulators,
run as a subprocess with the environment's kubeconfig, as an operator runs it.

The simulated control plane serves Talos's EtcdSnapshot (an etcd database file, its SHA-256 last); the real tier
holds such a file to etcd's own tooling (tests/real/test_etcd_snapshot_real.py)."""

from __future__ import annotations

import hashlib
import stat
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from ichord.etcd_snapshot.file import BOLT_MAGIC, TRAILER
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosPermissionDeniedError, TalosUnimplementedError

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
CLI = "import sys; from ichord import cli; sys.exit(cli.main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.02, control_planes=3, workers=1,
                              management_api="separate") as e:
        yield e


async def etcd_snapshot(env: SimEnvironment, *args: str, name: str | None = None) -> tuple[int, str, str]:
    proc = await anyio.run_process([sys.executable, "-c", CLI, "cluster", "etcd-snapshot", name or env.cluster_name,
                                    "-n", env.namespace, "--kubeconfig", str(env.kubeconfig), *args], check=False)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def served(env: SimEnvironment) -> list[str]:
    return [str(e["node"]) for e in env.talos.history.of("etcd_snapshot")]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_a_snapshot_is_written_with_its_size_and_sha256(env: SimEnvironment, tmp_path: Path) -> None:
    target = tmp_path / "demo.db"
    rc, out, err = await etcd_snapshot(env, "-f", str(target))
    assert rc == 0, err
    data = target.read_bytes()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert f"wrote {target} (mode 0600): {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}" in out
    assert "etcd's SHA-256 of the database, at its end, verified" in out
    # An etcd database (bbolt's meta page) followed by etcd's SHA-256 of it, as Maintenance.Snapshot streams it.
    assert struct.unpack_from("<I", data, 16)[0] == BOLT_MAGIC
    assert len(data) % 512 == TRAILER and hashlib.sha256(data[:-TRAILER]).digest() == data[-TRAILER:]
    # One snapshot, from a control plane that is not the etcd leader.
    (node,) = served(env)
    assert node.startswith(f"{env.cluster_name}-cp-") and node != env.talos.etcd.leader
    assert f"from control plane {node}" in out
    assert leftovers(tmp_path) == ["demo.db"]
    # What it cost the cluster: one EtcdStatus per control plane, the alarms once, one EtcdSnapshot.
    calls = {rpc: sum(env.node(n).rpcs[rpc] for n in env.machine_names)
             for rpc in ("EtcdStatus", "EtcdAlarmList", "EtcdSnapshot", "ApplyConfiguration", "Reboot")}
    assert calls == {"EtcdStatus": 3, "EtcdAlarmList": 1, "EtcdSnapshot": 1, "ApplyConfiguration": 0, "Reboot": 0}


async def test_an_existing_file_is_never_overwritten(env: SimEnvironment, tmp_path: Path) -> None:
    target = tmp_path / "demo.db"
    target.write_bytes(b"precious")
    rc, out, err = await etcd_snapshot(env, "-f", str(target))
    assert rc == 2 and out == ""
    assert f"{target} exists; it is not overwritten: choose a new name" in err and "nothing was written" in err
    assert target.read_bytes() == b"precious" and served(env) == []


@pytest.mark.parametrize("case", ["no-directory", "no-cluster", "directory-is-a-file"])
async def test_bad_input_exits_2_and_writes_nothing(env: SimEnvironment, tmp_path: Path, case: str) -> None:
    if case == "no-directory":
        rc, _, err = await etcd_snapshot(env, "-f", str(tmp_path / "missing" / "demo.db"))
        assert f"{tmp_path / 'missing'} is not a directory; create it first" in err
    elif case == "no-cluster":
        rc, _, err = await etcd_snapshot(env, "-f", str(tmp_path / "demo.db"), name="nope")
        assert f"TalosCluster {env.namespace}/nope not found" in err
    else:
        (tmp_path / "file").write_text("x")
        rc, _, err = await etcd_snapshot(env, "-f", str(tmp_path / "file" / "demo.db"))
        assert "is not a directory" in err
    assert rc == 2
    assert served(env) == [] and not (tmp_path / "demo.db").exists()


async def test_no_healthy_control_plane_exits_1_and_writes_nothing(env: SimEnvironment, tmp_path: Path) -> None:
    cps = [n for n in env.machine_names if "-cp-" in n]
    await env.node(cps[0]).set_unreachable(True)
    for name in cps[1:]:
        env.node(name).set_etcd_unhealthy(True)
    rc, out, err = await etcd_snapshot(env, "-f", str(tmp_path / "demo.db"))
    assert rc == 1 and out == "", err
    assert "no control plane could serve an etcd snapshot" in err
    assert f"{cps[0]}: " in err and "connection refused" in err and f"{cps[1]}: etcd reports" in err
    assert leftovers(tmp_path) == [] and served(env) == []


async def test_a_damaged_stream_exits_1_and_leaves_no_file(env: SimEnvironment, tmp_path: Path) -> None:
    from ichord.sim.talos.etcd_snapshot import simulated_snapshot

    good = simulated_snapshot(env.talos)

    async def damaged() -> bytes:
        return good[:4096] + b"\xff" + good[4097:]

    env.talos.etcd_snapshot_source = damaged
    rc, out, err = await etcd_snapshot(env, "-f", str(tmp_path / "demo.db"))
    assert rc == 1 and out == ""
    assert "does not match etcd's SHA-256" in err
    assert leftovers(tmp_path) == []


async def test_workers_and_readers_are_refused_as_talos_refuses_them(env: SimEnvironment,
                                                                     bundle: SecretsBundle) -> None:
    worker = env.node(next(n for n in env.machine_names if "-worker-" in n))
    cp = env.node(f"{env.cluster_name}-cp-1")
    async with TalosClient(DialBundle.from_bundle(bundle, roles=("os:etcd:backup",))) as talos:
        with pytest.raises(TalosUnimplementedError, match="etcd snapshot is only available on control plane nodes"):
            await talos.etcd_snapshot(worker.endpoint, lambda _chunk: None)
    async with TalosClient(DialBundle.from_bundle(bundle, roles=("os:reader",))) as talos:
        with pytest.raises(TalosPermissionDeniedError):
            await talos.etcd_snapshot(cp.endpoint, lambda _chunk: None)
