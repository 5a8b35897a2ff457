"""docs/decisions.md#maintenance-windows on the simulators: a config rollout over 3 control planes + 10 workers whose
TalosCluster allows disruption 20 seconds in every 3 minutes (a faster step clock runs those minutes in seconds).

What is checked comes from the simulators, not from the operation's status: every cordon (the kube simulator's store,
at every change of a Node) lands inside a window; every node's reboot follows a cordon of that node made inside a
window; whenever the operation says WaitingForWindow no node is cordoned; it stops at a window end at least,
resumes, and completes with every node rebooted exactly once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.operations import roll as roll_module
from ichord.operations.windows import Windows
from ichord.pki.bundle import generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import REBOOT_PATCH, reboots, world_on
from tests.integration._roll_helpers import MovableClock

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
#: Step-clock seconds per real second.
RATE = 20.0
#: Every duration as the other config tests scale it, measured on the faster clock.
TIMING = Timing().scaled(0.01 * RATE)
#: 20 s in every 3 minutes: shorter than the rollout's pace on a fast machine, so it spans several windows
#: (a window of a minute fitted the whole 3+10 rollout once node returns became events).
WINDOWS = [{"name": "every-3m", "schedule": "*/3 * * * *", "duration": "20s", "timeZone": "Europe/Berlin"}]
#: A cordon is sent right after the check that admitted it; the simulator records it that long after, at most, on
#: the faster clock (50 ms of real time on a loaded machine).
LANDING = dt.timedelta(seconds=RATE * 0.05)


class FastClock:
    def __init__(self, start: dt.datetime) -> None:
        self.start, self.wall = start, time.time()

    def __call__(self) -> dt.datetime:
        return self.at(time.time())

    def restart_at(self, start: dt.datetime) -> None:
        """Reads ``start`` now: the world's setup takes a loaded machine's time, which must not eat the minute
        before the first window."""
        self.start, self.wall = start, time.time()

    def at(self, wall: float) -> dt.datetime:
        return self.start + dt.timedelta(seconds=(wall - self.wall) * RATE)


def _cordon_listener(clock: Callable[[], dt.datetime], cordons: list[tuple[dt.datetime, str]]) -> Any:
    def listener(change: Any, rt: Any) -> None:
        if rt.plural != "nodes" or change.type != "MODIFIED":
            return
        now_cordoned = bool((change.new.get("spec") or {}).get("unschedulable"))
        was = bool(((change.old or {}).get("spec") or {}).get("unschedulable"))
        if now_cordoned and not was:
            cordons.append((clock(), change.new["metadata"]["name"]))

    return listener


async def test_a_rollout_stops_at_each_window_end_with_nothing_cordoned_and_resumes_to_completion() -> None:
    # Starts a minute before a window opens: the rollout first waits, then runs in windows.
    clock = FastClock(dt.datetime(2026, 12, 5, 20, 59, 0, tzinfo=dt.UTC))
    windows = Windows.from_cluster_spec({"maintenance": {"windows": WINDOWS}})
    assert windows is not None
    async with SimEnvironment(bundle=generate_bundle(), time_scale=0.01, control_planes=3, workers=10,
                              management_api="separate") as env, \
            contextlib.asynccontextmanager(world_on)(env, TIMING, clock) as world:
        ns = env.namespace
        await crds.clusters(world.kube).patch(ns, env.cluster_name, {"spec": {
            "maintenance": {"windows": WINDOWS}, "maxUnavailable": 2, "patches": [REBOOT_PATCH]}})

        async def reported() -> bool:
            return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 13

        await world.run_until(reported, what="13 machines reporting rebootPaths")
        since = len(env.talos.history.events)
        cordons: list[tuple[dt.datetime, str]] = []
        env.kube.store.listeners.append(_cordon_listener(clock, cordons))
        clock.restart_at(dt.datetime(2026, 12, 5, 20, 59, 0, tzinfo=dt.UTC))  # nothing has used the clock for an op yet
        await crds.operations(world.kube).create(ns, {"metadata": {"name": "windowed"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": False}})

        waits: list[dt.datetime] = []  # each time the operation was seen starting a wait
        said: list[str] = []  # and what it said then
        left_cordoned: list[tuple[str, list[str]]] = []
        waiting = False

        async def finished() -> bool:
            nonlocal waiting
            op = await world.op("windowed")
            status = op.get("status") or {}
            cond = find(status.get("conditions"), names.CONFIG_ROLLOUT) or {}
            if cond.get("reason") == names.WAITING_FOR_WINDOW:
                assert status.get("phase") == "InProgress"
                assert "opens at" in str(cond.get("message"))
                nodes = (await world.kube.raw("GET", "/api/v1/nodes"))["items"]
                cordoned = [n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")]
                if cordoned:
                    left_cordoned.append((str(cond.get("message")), cordoned))
                if not waiting:  # when the step that decided to wait ran (its clock stamps the condition)
                    waits.append(dt.datetime.fromisoformat(str(cond["lastTransitionTime"]).replace("Z", "+00:00")))
                    said.append(str(cond.get("message")))
                waiting = True
            else:
                waiting = False
            return status.get("phase") in ("Completed", "Failed", "Paused")

        await world.run_until(finished, steps=20000, what="the windowed rollout done")
        op = await world.op("windowed")
        assert op["status"]["phase"] == "Completed", op["status"]

        # From the simulators: every node rebooted once; every cordon inside a window; every reboot after a cordon
        # of its node made inside a window.
        assert reboots(env, since) == {m: 1 for m in env.machine_names}
        outside = [(at.isoformat(), node) for at, node in cordons
                   if windows.open_until(at) is None and windows.open_until(at - LANDING) is None]
        assert outside == [], f"cordoned outside every window: {outside}"
        first_cordon: dict[str, dt.datetime] = {}
        for at, node in cordons:
            first_cordon.setdefault(node, at)
        for e in env.talos.history.events[since:]:
            if e["kind"] == "reboot":
                node = e["node"]
                assert node in first_cordon, f"{node} rebooted without a cordon"
                assert first_cordon[node] <= clock.at(e["wall"]) + LANDING
        assert left_cordoned == [], left_cordoned
        # It waited before the first window and at one window end at least (13 nodes; how many fit in a window
        # depends on the machine's speed, so only the first stop-and-resume is certain).
        assert len(waits) >= 2, waits
        assert waits[0] < dt.datetime(2026, 12, 5, 21, 0, 0, tzinfo=dt.UTC), waits  # before the first window
        # Each decided outside every window, or inside one with less left than the next node's predicted step.
        inside = [(w, m) for w, m in zip(waits, said, strict=True) if windows.open_until(w) is not None]
        assert [(w, m) for w, m in inside if " closes in " not in m] == [], inside

        # One Normal WaitingForWindow Event per wait, never a Warning.
        events = (await world.kube.raw("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
        mine = [e for e in events if (e.get("involvedObject") or {}).get("name") == "windowed"]
        assert [e for e in mine if e.get("type") == "Warning"] == []
        waited = [e for e in mine if e.get("reason") == names.EventReason.WAITING_FOR_WINDOW]
        assert waited and {e["type"] for e in waited} == {"Normal"}
        assert sum(int(e.get("count") or 1) for e in waited) == len(waits)
        cluster = await crds.clusters(world.kube).get(ns, env.cluster_name)
        cond = find(cluster["status"]["conditions"], names.MAINTENANCE_WINDOWS) or {}
        assert (cond.get("status"), cond.get("reason")) == ("True", names.MaintenanceWindowsReason.VALID), cond


async def test_an_unreadable_window_blocks_the_rollout_and_the_cluster_says_which_field() -> None:
    bad = [{"name": "weekly", "schedule": "0 22 * * SAT", "duration": "4h", "timeZone": "Europe/Berlim"}]
    async with SimEnvironment(bundle=generate_bundle(), time_scale=0.01, control_planes=1, workers=1,
                              management_api="separate") as env, \
            contextlib.asynccontextmanager(world_on)(env, Timing().scaled(0.01)) as world:
        ns = env.namespace
        await crds.clusters(world.kube).patch(ns, env.cluster_name, {"spec": {
            "maintenance": {"windows": bad}, "patches": [REBOOT_PATCH]}})

        async def reported() -> bool:
            return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 2

        await world.run_until(reported, what="2 machines reporting rebootPaths")
        since = len(env.talos.history.events)
        await crds.operations(world.kube).create(ns, {"metadata": {"name": "blocked"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": False}})

        async def blocked() -> bool:
            return ((await world.op("blocked")).get("status") or {}).get("phase") == "Paused"

        await world.run_until(blocked, what="the rollout blocked")
        for _ in range(5):
            await world.step()
        status = (await world.op("blocked"))["status"]
        message = (find(status["conditions"], names.CONFIG_ROLLOUT) or {}).get("message", "")
        assert "spec.maintenance.windows[0].timeZone (weekly): 'Europe/Berlim' is not an IANA time zone" in message
        cluster = await crds.clusters(world.kube).get(ns, env.cluster_name)
        cond = find(cluster["status"]["conditions"], names.MAINTENANCE_WINDOWS) or {}
        assert (cond.get("status"), cond.get("reason")) == ("False", names.MaintenanceWindowsReason.INVALID), cond
        nodes = (await world.kube.raw("GET", "/api/v1/nodes"))["items"]
        assert [n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")] == []
        assert [e for e in env.talos.history.events[since:] if e["kind"] in ("reboot", "apply")] == []


async def test_a_step_slow_to_reach_its_cordon_past_the_window_end_cordons_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The window is asked on the step's clock at the moment of the cordon, not on a time read earlier in the step:
    the step's clock moves past the window's end right before the cordon would be sent (a step that took that long
    to get there on a loaded machine), and nothing is cordoned; the node starts in the next window."""
    clock = MovableClock()
    t0 = dt.datetime(2026, 12, 5, 21, 0, 0, tzinfo=dt.UTC)
    clock.offset = t0 + dt.timedelta(minutes=1) - clock()  # a minute into the first window
    first = {"name": "first", "start": "2026-12-05T21:00:00Z", "end": "2026-12-05T22:00:00Z"}
    async with SimEnvironment(bundle=generate_bundle(), time_scale=0.01, control_planes=1, workers=1,
                              management_api="separate") as env, \
            contextlib.asynccontextmanager(world_on)(env, Timing().scaled(0.01), clock) as world:
        ns = env.namespace
        await crds.clusters(world.kube).patch(ns, env.cluster_name, {"spec": {
            "maintenance": {"windows": [first]}, "patches": [REBOOT_PATCH]}})

        async def reported() -> bool:
            return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 2

        await world.run_until(reported, what="2 machines reporting rebootPaths")
        since = len(env.talos.history.events)
        cordons: list[tuple[dt.datetime, str]] = []
        env.kube.store.listeners.append(_cordon_listener(clock, cordons))
        late: list[str] = []

        def slow_to_cordon(name: str) -> None:
            if name == "roll.cordon.before" and not late:
                late.append(name)
                clock.advance(2 * 3600)  # the window closed while the step got here

        monkeypatch.setattr(roll_module, "failpoint", slow_to_cordon)
        await crds.operations(world.kube).create(ns, {"metadata": {"name": "late"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": False}})

        async def waiting() -> bool:
            cond = find(((await world.op("late")).get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT) or {}
            return cond.get("reason") == names.WAITING_FOR_WINDOW

        await world.run_until(waiting, what="the rollout waiting for a window")
        assert late == ["roll.cordon.before"]
        assert cordons == [] and reboots(env, since) == {m: 0 for m in env.machine_names}
        nodes = (await world.kube.raw("GET", "/api/v1/nodes"))["items"]
        assert [n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")] == []

        now = clock()
        second = {"name": "second", "start": (now + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "end": (now + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}
        await crds.clusters(world.kube).patch(ns, env.cluster_name, {"spec": {"maintenance": {
            "windows": [first, second]}}})
        clock.advance(90)

        async def completed() -> bool:
            return ((await world.op("late")).get("status") or {}).get("phase") in ("Completed", "Failed", "Paused")

        await world.run_until(completed, what="the rollout done in the second window")
        assert (await world.op("late"))["status"]["phase"] == "Completed"
        assert reboots(env, since) == {m: 1 for m in env.machine_names}
        windows = Windows.from_cluster_spec({"maintenance": {"windows": [first, second]}})
        assert windows is not None and cordons and all(windows.open_until(at) is not None for at, _ in cordons)
