"""A rehearsal has no side effect anywhere: not on the management API, not on the Talos nodes, not on the filesystem
(docs/architecture.md#rehearsal).

The live cluster names an etcd snapshot directory (spec.etcdSnapshots) that already holds more of its snapshots
than it retains, so a snapshot taken, or a retention run, would show there. Every way of rehearsing is run through
the command line as a person types it: ``cluster rotate --targets etcd --rehearse`` (etcd's roll reboots every
control plane: the real run snapshots first), ``cluster config-apply --rehearse`` over a change that reboots the
control planes (likewise), ``cluster rotate --rehearse`` (the default targets, with their hand-off) and ``cluster
rehearse -f``. After each the directory is the same byte for byte (names, sizes, contents, mtimes, and the
directory's own mtime, which any file created or removed there moves), the live APIs served the rehearsal reads
only, and no live node was asked to apply, reboot or snapshot anything.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord import yamlio
from ichord.api import names
from ichord.kube import crds
from ichord.pki.bundle import SecretsBundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import REBOOT_PATCH, World, world_on
from tests.integration._rehearsal import Writes, cli, logging_restored  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = Timing().scaled(0.01)
#: What the live nodes must never be asked in a rehearsal (each one a change, or a snapshot to a file).
CHANGES = frozenset({"ApplyConfiguration", "ApplyConfiguration(dry run)", "Reboot", "EtcdSnapshot", "Upgrade",
                     "Reset", "Shutdown"})
#: The live Talos history's kinds a rehearsal must not cause.
CHANGED = frozenset({"apply", "reboot_requested", "reboot", "etcd_snapshot", "apiserver_restart"})


def fingerprint(directory: Path) -> dict[str, Any]:
    """Everything a write, a removal or a touch would change: each entry's size, content hash, mode and mtime, and
    the directory's own mtime."""
    out: dict[str, Any] = {".": os.stat(directory).st_mtime_ns}
    for entry in sorted(directory.iterdir()):
        st = entry.stat()
        out[entry.name] = (st.st_size, st.st_mode, st.st_mtime_ns, hashlib.sha256(entry.read_bytes()).hexdigest())
    return out


def _past_snapshots(directory: Path, namespace: str, cluster: str) -> None:
    """Three of the cluster's snapshots (retain 2 would remove the oldest), another cluster's, and a file of the
    person's own: each named as the daemon names them, or not."""
    directory.mkdir()
    for day in (1, 2, 3):
        (directory / f"{namespace}_{cluster}_2024010{day}T000000Z_nightly.db").write_bytes(bytes([day]) * 4096)
    (directory / f"{namespace}_other_20240101T000000Z_nightly.db").write_bytes(b"other")
    (directory / "README").write_text("kept by hand\n")
    old = 1_700_000_000_000_000_000
    for i, entry in enumerate(sorted(directory.iterdir())):
        os.utime(entry, ns=(old + i, old + i))  # mtimes no write in this test could produce by chance


@pytest.fixture
async def live(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=3, workers=1) as e:
        yield e


@pytest.fixture
async def world(live: SimEnvironment) -> AsyncIterator[World]:
    async for w in world_on(live, TIMING):
        yield w


async def _waits_for_a_reboot(world: World) -> None:
    """The reboot patch on the live cluster, then every machine reporting the reboot it waits for (so a config
    rollout reboots the control planes, after its snapshot)."""
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return all((m.get("status") or {}).get("rebootPaths") for m in await world.machines())

    await world.run_until(reported, what="every machine reports the reboot it waits for")


def _rehearse_every_way(flags: list[str], op_file: Path) -> dict[str, tuple[list[str], int]]:
    """Each rehearsal command, with the number of etcd snapshots its real run would take (each played once)."""
    return {
        "etcd rotation": (["cluster", "rotate", *flags, "--targets", "etcd", "--rehearse"], 1),
        "default rotation": (["cluster", "rotate", *flags, "--rehearse", "-o", "text"], 0),
        "config rollout": (["cluster", "config-apply", *flags, "--rehearse"], 1),
        "operation file": (["cluster", "rehearse", *flags, "-f", str(op_file)], 1),
    }


@pytest.mark.usefixtures("logging_restored")
async def test_no_rehearsal_writes_a_snapshot_prunes_one_or_changes_anything_live(world: World,
                                                                                  tmp_path: Path) -> None:
    live = world.env
    snapshots = tmp_path / "snapshots"
    _past_snapshots(snapshots, live.namespace, live.cluster_name)
    await crds.clusters(world.kube).patch(live.namespace, live.cluster_name, {"spec": {"etcdSnapshots": {
        "path": str(snapshots), "retain": 2}}})
    history = len(live.talos.history.events)
    writes = Writes(live, tmp_path)
    flags = [live.cluster_name, "-n", live.namespace, "--kubeconfig", str(writes.kubeconfig)]
    op_file = tmp_path / "config.yaml"
    op_file.write_text(yamlio.dump({
        "apiVersion": names.API_VERSION, "kind": names.TALOS_OPERATION, "metadata": {"name": "try"},
        "spec": {"clusterRef": {"name": live.cluster_name}, "kind": names.KIND_CONFIG}}))
    before = fingerprint(snapshots)
    for what, (argv, taken) in _rehearse_every_way(flags, op_file).items():
        if what == "config rollout":  # a rotation refuses a cluster with a pending change: the change comes now
            await _waits_for_a_reboot(world)
            history = len(live.talos.history.events)
            assert fingerprint(snapshots) == before
        rc, out, err = await anyio.to_thread.run_sync(cli, argv)
        assert rc == 0, (what, out, err)
        header = out.splitlines()[0]
        assert header.startswith("Rehearsal of ") and header.endswith("nothing was written)"), (what, header)
        assert fingerprint(snapshots) == before, (what, sorted(os.listdir(snapshots)))
        # Played, not taken: the timeline shows where the real run writes it before its first reboot.
        played = [line for line in out.splitlines() if "etcd snapshot (played)" in line]
        assert len(played) == taken, (what, out)
        assert all(str(snapshots / live.namespace) in line and "nothing written" in line for line in played), played
        # Nothing happened on the live nodes: no apply, reboot, kube-apiserver restart or snapshot.
        assert [e for e in live.talos.history.events[history:] if e["kind"] in CHANGED] == [], what
    writes.assert_none()
    calls = writes.talos()
    assert not any(set(c) & CHANGES for c in calls.values()), calls
