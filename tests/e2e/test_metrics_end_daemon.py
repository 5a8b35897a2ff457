"""Series end with their objects, on every replica: two `ichord run` processes, a leader and a follower, scraped.

TalosOperations in every phase (Pending, InProgress, Paused, Failed, Completed) show as ``ichord_operation_info``
on both replicas' /metrics; once they are deleted no series of theirs remains on either, and once the TalosCluster
is deleted none of its ``ichord_cluster_condition``, certificate-expiry or actor mailbox series does, though its
machines go after it. (Before, the leader's gauges
outlived the objects and the chart's IchordOperationFailed/Paused fired until a restart.)

The operations' status is written here, so each phase holds still while the replicas are scraped: the finished ones
on the cluster (the leader only lets them go), the unfinished ones on a cluster that does not exist (saying so).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import Daemon, eventually
from tests.e2e.conftest import MakeSimEnv

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

PHASES = ("Pending", "InProgress", "Paused", "Failed", "Completed")
SERIES = re.compile(r"^(ichord\w*|ichor_\w*)\{([^}]*)\} ", re.MULTILINE)


@pytest.fixture
async def env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    return await make_sim_env(management_api="separate", control_planes=1, workers=1)


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(env.kubeconfig)
    yield client
    await client.close()


def _scrape(daemon: Daemon) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def _series(text: str, needle: str) -> list[str]:
    """Every series whose labels hold ``needle`` (e.g. operation="op-failed")."""
    return [f"{m.group(1)}{{{m.group(2)}}}" for m in SERIES.finditer(text) if needle in m.group(2)]


def _leading(text: str) -> bool:
    return re.search(r"^ichord_leader 1\.0$", text, re.MULTILINE) is not None


async def _create(kube: KubeClient, env: SimEnvironment, phase: str) -> None:
    """A config operation left in ``phase``: a finished one on the cluster (the daemon only lets it go); an
    unfinished one on a cluster that does not exist, already saying so (ClusterNotFound), so the daemon leaves it."""
    name = f"op-{phase.lower()}"
    finished = phase in ("Failed", "Completed")
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": name}, "spec": {
        "clusterRef": {"name": env.cluster_name if finished else "ghost"}, "kind": "config"}})
    reason = {"Failed": "NothingToDo", "Completed": "RolledOut"}.get(phase, "ClusterNotFound")
    await crds.operations(kube).patch_status(env.namespace, name, {"status": {
        "phase": phase, "stage": None if phase == "Pending" else ("Done" if phase == "Completed" else "Rolling"),
        "message": "written by the test",
        "conditions": [{"type": "ConfigRollout", "status": "True" if phase == "Completed" else "False",
                        "reason": reason, "message": "test", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})


async def test_deleted_objects_leave_no_series_on_the_leader_or_the_follower(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    first = Daemon(env, tmp_path, "replica-a")
    second = Daemon(env, tmp_path, "replica-b")
    replicas = (first, second)
    try:
        await eventually(lambda: all(d.port for d in replicas), within=30, what="both replicas serving /metrics")
        # One leads, one follows: both are scraped, whichever is which.
        await eventually(lambda: sum(_leading(_scrape(d)) for d in replicas) == 1, within=30, what="one leader")
        for phase in PHASES:
            await _create(kube, env, phase)
        cluster = f'name="{env.cluster_name}"'

        def everything_shown() -> bool:
            for d in replicas:
                text = _scrape(d)
                for phase in PHASES:
                    if not [s for s in _series(text, f'operation="op-{phase.lower()}"') if f'phase="{phase}"' in s]:
                        return False
                if not _series(text, cluster):
                    return False
            return True

        await eventually(everything_shown, within=30, what="every operation's and the cluster's series on both")
        leader = next(d for d in replicas if _leading(_scrape(d)))
        await eventually(lambda: any(s.startswith("ichord_certificate_expiry") for s in
                                     _series(_scrape(leader), cluster)), within=30, what="the expiry series")
        actor = f'cluster="{env.namespace}/{env.cluster_name}"'
        await eventually(lambda: any(s.startswith("ichord_actor_mailbox_depth") for s in
                                     _series(_scrape(leader), actor)), within=30, what="the actor's mailbox series")

        for phase in PHASES:
            await crds.operations(kube).delete(env.namespace, f"op-{phase.lower()}")

        def operations_gone() -> list[str]:
            return [s for d in replicas for s in _series(_scrape(d), 'operation="op-')]

        with anyio.move_on_after(15):
            while operations_gone():  # noqa: ASYNC110 - the scrape is the observation
                await anyio.sleep(0.1)
        assert operations_gone() == [], operations_gone()

        await crds.clusters(kube).delete(env.namespace, env.cluster_name)
        for m in env.machine_names:
            await crds.machines(kube).delete(env.namespace, m)

        def cluster_gone() -> list[str]:
            # The actor's series too (ichord_actor_mailbox_depth): the machines go after the cluster here, so its
            # actor is stopped by the last machine's deletion, not the cluster's.
            return [s for d in replicas for text in [_scrape(d)] for s in _series(text, cluster) + _series(text, actor)
                    if not s.startswith("ichord_reconcile")]

        with anyio.move_on_after(15):
            while cluster_gone():  # noqa: ASYNC110
                await anyio.sleep(0.1)
        assert cluster_gone() == [], cluster_gone()
    finally:
        for d in replicas:
            assert await d.stop() == 0, d.log()[-3000:]
