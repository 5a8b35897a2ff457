"""Leader election against the simulator: one leader of two, takeover after expiry, hand-over on a
voluntary stop, release only while holding, an outage below the renew deadline survived (with an
informer), and loss after the renew deadline."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import GROUP, VERSION
from ichord.leader import LeaderElector, LeadershipLost
from ichord.metrics import REGISTRY
from ichord.settings import Timing
from ichord.sim.kube import KubeSimulator, SimSettings
from ichord.watchers import Informer, Resource, leader_status
from tests.integration._kube_helpers import eventually as eventually_every
from tests.integration._kube_helpers import fast_bookmarks

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NS = "kube-system"
#: 120/90/10 s at 1/100 scale.
FAST = Timing().scaled(0.01)


@pytest.fixture
def sim_settings() -> SimSettings:
    return fast_bookmarks()


@pytest.fixture
async def clients(sim: KubeSimulator, tmp_path: Path) -> AsyncIterator[list[KubeClient]]:
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    made = [await from_kubeconfig(path, timing=FAST) for _ in range(2)]
    yield made
    for c in made:
        await c.close()


def holder(sim: KubeSimulator) -> tuple[str | None, int]:
    lease = sim.store.get(sim.store.resolve("coordination.k8s.io", "v1", "leases"), NS, "ichord-leader")
    return lease["spec"].get("holderIdentity"), lease["spec"].get("leaseTransitions", 0)


#: Leases move at 1/100 scale: poll at 5 ms.
eventually = partial(eventually_every, step=0.005)


async def forever() -> None:
    await anyio.sleep_forever()


async def test_two_electors_exactly_one_leader(sim: KubeSimulator, clients: list[KubeClient]) -> None:
    electors = [LeaderElector(c, namespace=NS, identity=f"replica-{i}", timing=FAST) for i, c in enumerate(clients)]
    async with anyio.create_task_group() as tg:
        for e in electors:
            tg.start_soon(e.run, forever)
        await eventually(lambda: any(e.is_leader for e in electors))
        for _ in range(60):  # several renew periods: never two leaders, always the Lease's holder
            leaders = [e.identity for e in electors if e.is_leader]
            assert len(leaders) == 1
            assert holder(sim)[0] == leaders[0]
            await anyio.sleep(0.01)
        tg.cancel_scope.cancel()


async def test_takeover_only_after_expiry(sim: KubeSimulator, clients: list[KubeClient]) -> None:
    a = LeaderElector(clients[0], namespace=NS, identity="a", timing=FAST)
    b = LeaderElector(clients[1], namespace=NS, identity="b", timing=FAST)
    async with anyio.create_task_group() as tg:
        crash = anyio.CancelScope()

        async def run_a() -> None:
            with crash:
                await a.run(forever, release_on_stop=lambda: False)  # stops like a crash: no release
        tg.start_soon(run_a)
        await eventually(lambda: a.is_leader)
        tg.start_soon(b.run, forever)
        await anyio.sleep(FAST.retry_period * 3)
        assert not b.is_leader
        crash.cancel()
        stopped = time.monotonic()
        await eventually(lambda: b.is_leader)
        waited = time.monotonic() - stopped
        assert holder(sim) == ("b", 1)
        tg.cancel_scope.cancel()
    # b saw a's last renewal no earlier than one retry period before the stop, and waits a full lease.
    assert waited >= FAST.lease_duration - FAST.retry_period


async def test_voluntary_stop_hands_over_at_once(sim: KubeSimulator, clients: list[KubeClient]) -> None:
    # A 60 s lease: if b had to wait for expiry the test would time out.
    timing = dataclasses.replace(FAST, lease_duration=60.0)
    a = LeaderElector(clients[0], namespace=NS, identity="a", timing=timing)
    b = LeaderElector(clients[1], namespace=NS, identity="b", timing=timing)
    done = anyio.Event()
    stopped: list[str] = []

    async def short_work() -> None:
        await done.wait()
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run, short_work, lambda: stopped.append("a"))
        await eventually(lambda: a.is_leader)
        tg.start_soon(b.run, forever)
        done.set()  # a's work returns: a voluntary stop releases the Lease
        await eventually(lambda: b.is_leader, within=5.0)
        assert holder(sim) == ("b", 1)
        tg.cancel_scope.cancel()
    assert stopped == ["a"]


def lease_requests(sim: KubeSimulator, verb: str) -> int:
    return sim.requests.count(verb=verb, resource="leases")


async def test_an_idle_leader_renews_with_one_put_and_no_get(sim: KubeSimulator, clients: list[KubeClient]) -> None:
    """client-go's fast path: a leader renews the Lease as it last wrote it; an idle replica's only requests."""
    a = LeaderElector(clients[0], namespace=NS, identity="a", timing=FAST)
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run, forever)
        await eventually(lambda: a.is_leader)
        gets, puts = lease_requests(sim, "get"), lease_requests(sim, "update")
        await eventually(lambda: lease_requests(sim, "update") >= puts + 5, within=5.0)  # five renewals
        assert lease_requests(sim, "get") == gets
        assert a.is_leader and holder(sim) == ("a", 0)
        tg.cancel_scope.cancel()


async def test_a_lease_changed_under_the_leader_is_read_again(sim: KubeSimulator, clients: list[KubeClient]) -> None:
    """The renewal as last written carries that write's resourceVersion: after someone else's write it fails with
    a Conflict, and the leader reads the Lease and renews from what it read (still its own)."""
    a = LeaderElector(clients[0], namespace=NS, identity="a", timing=FAST)
    rt = sim.store.resolve("coordination.k8s.io", "v1", "leases")
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run, forever)
        await eventually(lambda: a.is_leader)
        lease = sim.store.get(rt, NS, "ichord-leader")
        lease["metadata"].setdefault("annotations", {})["touched"] = "by someone else"
        sim.store.update(rt, NS, "ichord-leader", lease)
        gets, conflicts = lease_requests(sim, "get"), sim.requests.count(verb="update", status=409, resource="leases")
        await eventually(lambda: lease_requests(sim, "get") > gets, within=5.0)
        renewed = sim.store.get(rt, NS, "ichord-leader")["metadata"]["resourceVersion"]
        await eventually(lambda: sim.store.get(rt, NS, "ichord-leader")["metadata"]["resourceVersion"] != renewed,
                         within=5.0)
        assert sim.requests.count(verb="update", status=409, resource="leases") == conflicts + 1
        assert a.is_leader and holder(sim) == ("a", 0)
        tg.cancel_scope.cancel()


async def test_release_only_while_still_holder(sim: KubeSimulator, clients: list[KubeClient]) -> None:
    a = LeaderElector(clients[0], namespace=NS, identity="a", timing=FAST)
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run, forever)
        await eventually(lambda: a.is_leader)
        tg.cancel_scope.cancel()
    rt = sim.store.resolve("coordination.k8s.io", "v1", "leases")
    assert holder(sim)[0] is None  # released on the cancel (a voluntary stop)
    lease = sim.store.get(rt, NS, "ichord-leader")
    lease["spec"]["holderIdentity"] = "someone-else"
    sim.store.update(rt, NS, "ichord-leader", lease)
    assert await a.release() is False
    assert holder(sim)[0] == "someone-else"


async def test_outage_below_renew_deadline_keeps_leadership_and_informer(
        sim: KubeSimulator, tmp_path: Path) -> None:
    # 120/90/10 s at 1/50 scale; the outage is 67.5 s of the 90 s renew deadline.
    timing = Timing().scaled(0.02)
    kube = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kc"), timing=timing)
    elector = LeaderElector(kube, namespace=NS, identity="a", timing=timing)
    informer = Informer(kube, Resource(GROUP, VERSION, "talosmachines", "default"), timing=timing)
    lost: list[bool] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(elector.run, forever, lambda: lost.append(True))
            tg.start_soon(informer.run)
            await eventually(lambda: elector.is_leader and informer.synced.is_set())
            async with sim.outage():
                sim.store.create(sim.store.resolve(GROUP, VERSION, "talosmachines"), "default",
                                 {"metadata": {"name": "m"}, "spec": {"clusterRef": {"name": "c"}, "role": "worker"}})
                await anyio.sleep(timing.renew_deadline * 0.75)
                assert elector.is_leader
            renewed_before = sim.requests.count("update", 200, "leases")
            await eventually(lambda: sim.requests.count("update", 200, "leases") > renewed_before)
            await eventually(lambda: informer.get("default", "m") is not None)
            assert elector.is_leader and not lost
            tg.cancel_scope.cancel()
    finally:
        await kube.close()
    assert holder(sim)[0] is None  # released at the end, never lost
    assert sim.requests.count("update", 200, "leases") >= 2


async def test_outage_past_renew_deadline_loses_leadership(sim: KubeSimulator, clients: list[KubeClient]) -> None:
    a = LeaderElector(clients[0], namespace=NS, identity="a", timing=FAST)
    work_cancelled: list[bool] = []
    stopped: list[bool] = []

    async def work() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            work_cancelled.append(True)

    async def outage_once_leading() -> None:
        await eventually(lambda: a.is_leader)
        await sim.go_down()
    async with anyio.create_task_group() as tg:
        tg.start_soon(outage_once_leading)
        with pytest.raises(LeadershipLost) as lost:
            await a.run(work, lambda: stopped.append(True))
    await sim.come_up()
    assert work_cancelled == [True] and stopped == [True]
    assert "could not be renewed" in str(lost.value)
    assert holder(sim)[0] == "a"  # not released: the lease runs out for the next replica


async def test_no_leader_is_said_only_past_the_lease(sim: KubeSimulator, clients: list[KubeClient]) -> None:
    """A follower beside a renewing leader never says no leader; once nobody can take the Lease (the API down for
    both), ``ichord_no_leader`` turns 1 only after a whole lease duration, and ``ichord_leaderless_seconds`` counts."""
    a = LeaderElector(clients[0], namespace=NS, identity="a", timing=FAST)
    b = LeaderElector(clients[1], namespace=NS, identity="b", timing=FAST)
    async with anyio.create_task_group() as tg:
        crash = anyio.CancelScope()

        async def run_a() -> None:
            with crash:
                await a.run(forever, release_on_stop=lambda: False)
        tg.start_soon(run_a)
        await eventually(lambda: a.is_leader)
        tg.start_soon(b.run, forever)
        for _ in range(40):  # several lease periods of a renewing leader: the follower never says no leader
            assert not b.no_leader() and not a.no_leader()
            await anyio.sleep(FAST.lease_duration / 10)
        assert b.leaderless_for() < FAST.lease_duration
        crash.cancel()
        await sim.go_down()  # nobody can take the Lease now
        down = time.monotonic()
        await eventually(b.no_leader)
        assert time.monotonic() - down >= FAST.lease_duration - 4 * FAST.retry_period  # not before the lease ran out
        assert REGISTRY.get_sample_value("ichord_no_leader") == 1.0  # the last elector made serves the metric
        assert (REGISTRY.get_sample_value("ichord_leaderless_seconds") or 0.0) > FAST.lease_duration
        await sim.come_up()
        await eventually(lambda: b.is_leader)
        assert not b.no_leader() and REGISTRY.get_sample_value("ichord_no_leader") == 0.0
        tg.cancel_scope.cancel()


async def test_the_clusters_say_when_no_replica_leads(sim: KubeSimulator, clients: list[KubeClient]) -> None:
    """LeaderElected=False/NoLeader on each TalosCluster once this replica has seen no leader for longer than the
    Lease (written once), True/Leading once it leads again; nothing at all while a leader was never missed."""
    clusters = sim.store.resolve(GROUP, VERSION, "talosclusters")
    spec = {"clusterName": "c", "endpoint": "https://c:6443", "kubernetesVersion": "1.34.1",
            "secretsRef": {"name": "s"}}
    sim.store.create(clusters, "default", {"metadata": {"name": "c"}, "spec": spec})
    informer = Informer(clients[1], Resource(GROUP, VERSION, "talosclusters"), timing=FAST)
    b = LeaderElector(clients[1], namespace=NS, identity="b", timing=FAST)  # its Lease attempts not started yet

    def condition() -> dict[str, Any] | None:
        obj = sim.store.get(clusters, "default", "c")
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "LeaderElected"),
                    None)

    async with anyio.create_task_group() as tg:
        tg.start_soon(informer.run)
        await informer.wait_synced()
        assert await leader_status.report(clients[1], informer, b, "kube-system/ichord-leader") == 0
        assert condition() is None  # not yet past the Lease: nothing said, nothing written
        await eventually(b.no_leader)
        assert await leader_status.report(clients[1], informer, b, "kube-system/ichord-leader") == 1
        said = condition()
        assert said is not None and (said["status"], said["reason"]) == ("False", "NoLeader")
        assert "kube-system/ichord-leader" in said["message"]
        await eventually(lambda: "LeaderElected" in str(informer.get("default", "c")))  # the informer saw the write
        assert await leader_status.report(clients[1], informer, b, "kube-system/ichord-leader") == 0  # once
        tg.start_soon(b.run, forever)
        await eventually(lambda: b.is_leader)
        assert await leader_status.report(clients[1], informer, b, "kube-system/ichord-leader") == 1
        said = condition()
        assert said is not None and (said["status"], said["reason"]) == ("True", "Leading")
        tg.cancel_scope.cancel()
