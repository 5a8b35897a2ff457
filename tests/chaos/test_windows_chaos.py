"""Maintenance windows under SIGKILL (docs/decisions.md#maintenance-windows): `ichord run` rolls a reboot-class patch
over 3 control planes + 6 workers (2 at a time) while the TalosCluster allows disruption only in one-off windows of a
few seconds, and the daemon is killed at random moments, half of them at a window's edge, and restarted each time.

Read from the simulators, never from status (docs/decisions.md#invariants): every cordon (the managed cluster's
store, stamped at the change) lands inside a window; every node's reboot follows its cordon; whenever the operation
says WaitingForWindow no node is cordoned; every node is rebooted exactly once; and the chaos tier's shared
invariants hold at the end (Completed, nothing cordoned, the lock released, no key material published).

The windows are one-off ones on the wall clock, which the daemon's steps read: what this adds to the recurring
maths (tests/unit/test_windows.py, tests/integration/test_config_windows.py) is the kills.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.operations.windows import Windows
from ichord.pki.bundle import SecretsBundle
from ichord.sim.combined import SimEnvironment
from tests.chaos._chaos import common_invariants, cordoned, operation
from tests.e2e._daemon import Daemon, all_ready, eventually
from tests.e2e.conftest import MakeSimEnv
from tests.integration._config_world import REBOOT_PATCH, reboots

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]

#: Seconds a window stays open, and between two: shorter than the rollout (a 7 s window once fitted all of it, and
#: the test then saw no wait); the last window stays open, so the rollout always finishes (the list holds 32 at most).
OPEN, SHUT, LAST = 2.0, 4.0, 600.0
#: A cordon is sent right after the step read the clock and found a window open; the simulator stamps it when the
#: PATCH arrives, at most this much later on a loaded machine.
LANDING = 0.5
NAME = "windowed"


@pytest.fixture
async def env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    return await make_sim_env(management_api="separate", control_planes=3, workers=6)


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _windows(start: float, count: int) -> list[dict[str, str]]:
    out = []
    t = float(int(start) + 1)
    for i in range(count):
        out.append({"name": f"w{i}", "start": _stamp(t), "end": _stamp(t + (LAST if i == count - 1 else OPEN))})
        t += OPEN + SHUT
    return out


def _edges(spec: list[dict[str, str]]) -> list[float]:
    edges = []
    for w in spec:
        for key in ("start", "end"):
            edges.append(dt.datetime.fromisoformat(w[key].replace("Z", "+00:00")).timestamp())
    return edges


async def test_killed_at_random_and_at_window_edges_it_never_starts_a_node_outside_a_window(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path, e2e_bundle: SecretsBundle) -> None:
    seed = int(os.environ.get("ICHORD_CHAOS_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    print(f"chaos seed {seed} (ICHORD_CHAOS_SEED={seed} repeats it)")
    prepare = Daemon(env, tmp_path, "prepare")
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"patches": [REBOOT_PATCH]}})

        async def reported() -> bool:
            objs, _ = await crds.machines(kube).list_objects(env.namespace)
            return sum(1 for o in objs if (o.get("status") or {}).get("rebootPaths")) == len(env.machine_names)

        await eventually(reported, within=30, what="every machine reporting rebootPaths")
    finally:
        assert await prepare.stop() == 0

    spec = _windows(time.time(), 32)
    windows = Windows.from_cluster_spec({"maintenance": {"windows": spec}})
    assert windows is not None
    await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"maintenance": {"windows": spec}}})
    since = len(env.talos.history.events)
    cordons: list[tuple[float, str]] = []
    nodes_rt = env.kube.store.resolve("", "v1", "nodes")

    def on_change(change: Any, rt: Any) -> None:
        if rt is nodes_rt and change.type == "MODIFIED" and (change.new.get("spec") or {}).get("unschedulable") \
                and not ((change.old or {}).get("spec") or {}).get("unschedulable"):
            cordons.append((time.time(), change.new["metadata"]["name"]))

    env.kube.store.listeners.append(on_change)
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": NAME}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "maxUnavailable": 2}})

    left_cordoned: list[list[str]] = []
    waits: list[str] = []
    ops_rt = env.management.store.resolve("ichor.maesh.dev", "v1alpha1", "talosoperations")

    def on_operation(change: Any, rt: Any) -> None:
        # At the moment a wait is written (both simulators share this event loop): nothing may be cordoned then.
        if rt is not ops_rt or change.new["metadata"]["name"] != NAME:
            return
        cond = find((change.new.get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT) or {}
        old = find(((change.old or {}).get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT) or {}
        if cond.get("reason") == names.WAITING_FOR_WINDOW and (old.get("reason"), old.get("message")) != (
                cond.get("reason"), cond.get("message")):
            assert (change.new.get("status") or {}).get("phase") == "InProgress"
            waits.append(str(cond.get("message")))
            if cordoned(env):
                left_cordoned.append(cordoned(env))

    env.management.store.listeners.append(on_operation)

    async def follow() -> dict[str, Any]:
        while True:
            op = operation(env, NAME)
            if (op.get("status") or {}).get("phase") in ("Completed", "Failed", "Paused"):
                return op
            await anyio.sleep(0.02)

    async def leading(daemon: Daemon) -> None:
        await eventually(lambda: "became leader" in daemon.log() or daemon.proc.poll() is not None, within=60,
                         what=f"{daemon.name} leading")

    daemons: list[Daemon] = []
    edges = _edges(spec)
    kills = 8
    op: dict[str, Any] = {}
    with anyio.fail_after(300):
        for i in range(kills):
            daemon = Daemon(env, tmp_path, f"windows-{i}")
            daemons.append(daemon)
            await leading(daemon)  # the killed one's Lease must lapse first: a kill before that tests nothing
            now = time.time()
            if i % 2:  # at a window's edge: just before or just after it
                edge = next(e for e in edges if e > now + 1.0)
                life = edge - now + rng.uniform(-0.4, 0.4)
            else:
                life = rng.uniform(0.5, 4.0)
            with anyio.move_on_after(life):
                op = await follow()
            if daemon.proc.poll() is None:
                daemon.proc.send_signal(signal.SIGKILL)
            await daemon.stop()
            if (op.get("status") or {}).get("phase") == "Completed":
                break
        last = Daemon(env, tmp_path, "windows-last")
        daemons.append(last)
        try:
            op = await follow()
            assert op["status"]["phase"] == "Completed", (seed, op["status"], last.log()[-3000:])
            # (a daemon killed after writing Completed left the lock and the finalizer to this one)
            await common_invariants(env, NAME, daemons, [e2e_bundle])
        finally:
            assert await last.stop() == 0, seed

    assert reboots(env, since) == {m: 1 for m in env.machine_names}, seed
    outside = [(_stamp(t), node) for t, node in cordons
               if windows.open_until(dt.datetime.fromtimestamp(t, dt.UTC)) is None
               and windows.open_until(dt.datetime.fromtimestamp(t - LANDING, dt.UTC)) is None]
    assert outside == [], (seed, outside)
    first: dict[str, float] = {}
    for t, node in cordons:
        first.setdefault(node, t)
    for e in env.talos.history.events[since:]:
        if e["kind"] == "reboot":
            node = env.node(e["node"]).nodename
            assert node in first and first[node] <= e["wall"], (seed, e)
    assert left_cordoned == [], (seed, left_cordoned)
    assert waits, seed
