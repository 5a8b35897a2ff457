"""The chaos tier for the etcd roll (issue 16): ``ichord run`` rotating the etcd CA of a simulated 3+1 cluster,
killed at every failpoint of the roll in turn, and separately SIGKILLed at random moments (seeded, the seed
printed), restarted each time.

Checked from the simulators: the operation completes; the control planes were rebooted in whole rounds,
one per pass (no control plane rebooted twice in a pass, none while another member was unhealthy);
quorum was never lost and running members always trusted each other; every member signs with and
trusts only the new etcd CA, which the bundle Secret holds; no Node is left cordoned. The roll's
``ask_again`` and ``reboot_failed`` failpoints need a stuck or refusing node and are killed in
tests/chaos/test_roll_failpoints.py.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.sim.combined import SimEnvironment
from tests.chaos._chaos import kill_at_each_failpoint, sigkill_at_random
from tests.chaos.test_roll_failpoints import PATH
from tests.e2e._daemon import Daemon
from tests.e2e.conftest import MakeSimEnv
from tests.e2e.test_ca_rotation_etcd_daemon import _check_etcd_end_state, _env, _follow, _start

pytestmark = [pytest.mark.anyio, pytest.mark.chaos, pytest.mark.slow]


async def _run_to_end(kube: KubeClient, env: SimEnvironment, seen: list[str], tmp_path: Path,
                      daemons: list[Daemon]) -> dict[str, Any]:
    last = Daemon(env, tmp_path, "last")
    daemons.append(last)
    try:
        with anyio.fail_after(180):
            op = await _follow(kube, env, seen)
    finally:
        assert await last.stop() == 0
    return op


#: The snapshot the rotation takes first when the TalosCluster names a destination (operations/etcd_snapshot.py).
SNAPSHOT = ["etcd-snapshot.marker.after", "etcd-snapshot.taken.before"]


async def test_killed_at_every_roll_failpoint_in_turn_the_etcd_rotation_completes(
        make_sim_env: MakeSimEnv, tmp_path: Path) -> None:
    env = await _env(make_sim_env, 3)
    old = env.bundle
    assert old is not None
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    async with await from_kubeconfig(env.kubeconfig) as kube:
        await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"etcdSnapshots": {
            "path": str(snapshots)}}})
        await _start(kube, env, ["etcd"])
        seen: list[str] = []
        daemons = await kill_at_each_failpoint(
            env, tmp_path, [*SNAPSHOT, *PATH],
            lambda d: _follow(kube, env, seen, stop=lambda: d.proc.poll() is not None))
        op = await _run_to_end(kube, env, seen, tmp_path, daemons)
        assert op["status"]["phase"] == "Completed", op["status"]
        _check_etcd_end_state(env, old)
    # Killed after its marker and again after its file: one snapshot, recorded, before the first reboot.
    (file,) = sorted(snapshots.iterdir())
    assert op["status"]["etcdSnapshot"]["path"] == str(file) and op["status"]["etcdSnapshot"]["state"] == "Taken"
    served = env.talos.history.of("etcd_snapshot")
    assert len(served) == 1 and served[0]["seq"] < env.talos.history.of("reboot_requested")[0]["seq"]


async def test_sigkilled_at_random_moments_the_etcd_rotation_completes(
        make_sim_env: MakeSimEnv, tmp_path: Path) -> None:
    seed = int(os.environ.get("ICHORD_CHAOS_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    kills = int(os.environ.get("ICHORD_CHAOS_KILLS") or 6)
    print(f"chaos seed {seed}, {kills} kills (ICHORD_CHAOS_SEED={seed} repeats it)")
    env = await _env(make_sim_env, 3)
    old = env.bundle
    assert old is not None
    async with await from_kubeconfig(env.kubeconfig) as kube:
        await _start(kube, env, ["etcd"])
        seen: list[str] = []
        daemons = await sigkill_at_random(env, tmp_path, rng, kills, lambda: _follow(kube, env, seen))
        op = await _run_to_end(kube, env, seen, tmp_path, daemons)
        assert op["status"]["phase"] == "Completed", (f"seed {seed}", op["status"])
        _check_etcd_end_state(env, old)
        assert (await crds.operations(kube).get(env.namespace, "rotate"))["status"]["phase"] == "Completed"
