"""The informer against the simulator: sync, events, bookmarks, 410 re-list, inactivity, outages, errors."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from ichord.kube.client import KubeClient
from ichord.kube.crds import GROUP, VERSION, machines
from ichord.settings import Timing
from ichord.sim.kube import KubeSimulator, SimSettings
from ichord.sim.kube.status import ApiError
from ichord.watchers import Informer, Resource, WatchEvent
from tests.integration._kube_helpers import eventually, fast_bookmarks, machine

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NS = "default"
#: Real logic at 1/100 of the time; API calls keep a generous bound so a loaded CI box does not flake.
TIMING = dataclasses.replace(Timing().scaled(0.01), kube_request_timeout=5.0, min_call_timeout=5.0)
MACHINES = Resource(GROUP, VERSION, "talosmachines", NS)


@pytest.fixture
def sim_settings() -> SimSettings:
    return fast_bookmarks()


@pytest.fixture
def kube_timing() -> Timing:
    return TIMING


def server_state(sim: KubeSimulator) -> dict[str, str]:
    rt = sim.store.resolve(GROUP, VERSION, "talosmachines")
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in sim.store.list(rt, NS)[0]}


def cache_state(inf: Informer) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in inf.items()}


async def test_list_watch_events_and_bookmarks(sim: KubeSimulator, kube: KubeClient) -> None:
    ms = machines(kube)
    await ms.create(NS, machine("m1"))
    seen: list[tuple[str, str]] = []
    inf = Informer(kube, MACHINES, timing=TIMING, handlers=[lambda e: seen.append((e.type, e.key[1]))])
    async with anyio.create_task_group() as tg:
        tg.start_soon(inf.run)
        await inf.wait_synced()
        assert seen == [("ADDED", "m1")]
        await ms.create(NS, machine("m2"))
        await ms.patch(NS, "m1", {"spec": {"approved": True}})
        await ms.delete(NS, "m2")
        await eventually(lambda: len(seen) == 4)
        assert seen[1:] == [("ADDED", "m2"), ("MODIFIED", "m1"), ("DELETED", "m2")]
        # Bookmarks move the resourceVersion on although nothing of this kind changed.
        before = int(inf.resource_version)
        await kube.core().create_namespaced_config_map(NS, {"metadata": {"name": "elsewhere"}})
        await eventually(lambda: int(inf.resource_version) > before)
        assert cache_state(inf) == server_state(sim)
        tg.cancel_scope.cancel()


async def test_gone_relists_without_losing_an_event(sim: KubeSimulator, kube: KubeClient) -> None:
    ms = machines(kube)
    for name in ("m1", "m2"):
        await ms.create(NS, machine(name))
    seen: list[WatchEvent] = []
    inf = Informer(kube, MACHINES, timing=TIMING, handlers=[seen.append])
    async with anyio.create_task_group() as tg:
        tg.start_soon(inf.run)
        await inf.wait_synced()
        await eventually(lambda: sim.open_watches == 1)
        sim.stall_watches()  # the watch goes silent: these changes never reach it
        await ms.create(NS, machine("m3"))
        await ms.patch(NS, "m1", {"spec": {"approved": True}})
        await ms.delete(NS, "m2")
        sim.compact()  # ... and the history to resume from is gone
        sim.drop_watches()
        await eventually(lambda: inf.restarts["expired"] >= 1 and cache_state(inf) == server_state(sim))
        tg.cancel_scope.cancel()
    after_sync = [(e.type, e.key[1]) for e in seen[2:]]
    assert sorted(after_sync) == [("ADDED", "m3"), ("DELETED", "m2"), ("MODIFIED", "m1")]
    assert sim.requests.count("list", 200, "talosmachines") == 2  # exactly one re-list


async def test_inactivity_reconnects_a_silent_watch(sim: KubeSimulator, kube: KubeClient) -> None:
    ms = machines(kube)
    inf = Informer(kube, MACHINES, timing=TIMING)
    async with anyio.create_task_group() as tg:
        tg.start_soon(inf.run)
        await inf.wait_synced()
        await eventually(lambda: sim.open_watches == 1)
        sim.stall_watches()
        await ms.create(NS, machine("late"))
        # No line for the inactivity timeout: the informer reconnects from its resourceVersion.
        await eventually(lambda: inf.get(NS, "late") is not None)
        tg.cancel_scope.cancel()
    assert inf.restarts["inactivity"] >= 1
    assert inf.restarts["expired"] == 0


async def test_outage_and_failing_list_are_retried(sim: KubeSimulator, kube: KubeClient) -> None:
    sim.faults.error_rate = {"list": 1.0}
    inf = Informer(kube, MACHINES, timing=TIMING)
    async with anyio.create_task_group() as tg:
        tg.start_soon(inf.run)
        await eventually(lambda: inf.restarts["error"] >= 2)
        assert not inf.synced.is_set()
        sim.faults.error_rate = {}
        await inf.wait_synced()
        async with sim.outage():
            # The cluster changes while the API is unreachable (90 s of downtime at 1/100 scale).
            sim.store.create(sim.store.resolve(GROUP, VERSION, "talosmachines"), NS, machine("during"))
            await anyio.sleep(TIMING.scaled(1).renew_deadline)
        await eventually(lambda: inf.get(NS, "during") is not None)
        tg.cancel_scope.cancel()
    assert inf.restarts["error"] >= 3
    assert inf.restarts["expired"] == 0  # resumed from its resourceVersion, no re-list needed


async def test_a_raising_handler_does_not_stop_the_watch(kube: KubeClient) -> None:
    got: list[str] = []

    def broken(_e: WatchEvent) -> None:
        raise RuntimeError("handler bug")
    inf = Informer(kube, MACHINES, timing=TIMING, handlers=[broken, lambda e: got.append(e.key[1])])
    async with anyio.create_task_group() as tg:
        tg.start_soon(inf.run)
        await inf.wait_synced()
        await machines(kube).create(NS, machine("after"))
        await eventually(lambda: got == ["after"])
        tg.cancel_scope.cancel()


async def test_handlers_mirror_the_server_through_drops_compaction_and_errors(sim: KubeSimulator,
                                                                              kube: KubeClient) -> None:
    """A consumer that only applies handler events ends equal to the server, whatever the watch went through."""
    mirror: dict[str, str] = {}

    def apply(e: WatchEvent) -> None:
        if e.type == "DELETED":
            mirror.pop(e.key[1], None)
        else:
            mirror[e.key[1]] = e.obj["metadata"]["resourceVersion"]
    inf = Informer(kube, MACHINES, timing=TIMING, handlers=[apply])
    rt = sim.store.resolve(GROUP, VERSION, "talosmachines")
    sim.faults.error_rate = {"watch": 0.2, "list": 0.2}
    sim.faults.reseed(7)
    async with anyio.create_task_group() as tg:
        tg.start_soon(inf.run)
        await inf.wait_synced()
        for i in range(150):
            name = f"m{i % 20}"
            try:
                sim.store.get(rt, NS, name)
                if i % 3 == 0:
                    sim.store.delete(rt, NS, name)
                else:
                    sim.store.patch(rt, NS, name, "application/merge-patch+json", {"spec": {"address": str(i)}})
            except ApiError:  # absent: create it
                sim.store.create(rt, NS, machine(name))
            if i % 25 == 10:
                sim.drop_watches()
            if i % 40 == 20:
                sim.stall_watches()
                sim.compact()
            await anyio.sleep(0.002)
        sim.faults.error_rate = {}
        await eventually(lambda: mirror == server_state(sim), within=10.0)
        tg.cancel_scope.cancel()
    assert inf.restarts["expired"] >= 1 and inf.restarts["error"] + inf.restarts["closed"] >= 1
