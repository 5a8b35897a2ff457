"""The ETA of a real run, from its halfway point, within ±20 % of the time it then took (issue 31), on the
simulators with per-node durations injected: varied reboot times, one slow node, an apply latency.

Each scenario runs the real operation, driven step by step, on a world with no past operations (the ETA learns
from the run's own steps only). Every write of the operation is caught in the management simulator's store (no
poll can miss one): the halfway point is the first write whose progress counts at least half the steps; its ETA,
less its lastDoneAt, is the prediction, and the completion's lastDoneAt less it the time actually left. Both are
the daemon's step clock as written in the status, never the test's clock. The ETA is written to the nearest
second, so the prediction is allowed that half second besides the 20 %.

Seconds are compressed (reboots of seconds) but the injected durations dominate what is measured, so a loaded
machine moves the overhead, not the figures. ``ICHORD_ETA_RUNS`` repeats each scenario (the spread is printed).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from ichord.api.conditions import parse_time
from ichord.kube import crds
from ichord.operations.outcome import Done
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._ca_rotation_driver import TIMING as DRIVER_TIMING
from tests.integration._ca_rotation_driver import add_clients, driving
from tests.integration._config_world import REBOOT_PATCH, World, world_on

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
RUNS = int(os.environ.get("ICHORD_ETA_RUNS", "1"))
# A node is given two minutes to come back (the scaled bound, 12 s, is about the slow node's reboot).
TIMING = replace(Timing().scaled(0.01), node_action_timeout=120.0)


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


def _stamp(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


@dataclass
class Writes:
    """Every progress the operation ``name`` was written with, in order (the store's change listener)."""

    name: str
    seen: list[Obj]

    def listener(self, change: Any, rt: Any) -> None:
        obj = change.new or {}
        if rt.plural == "talosoperations" and (obj.get("metadata") or {}).get("name") == self.name:
            progress = (obj.get("status") or {}).get("progress")
            if isinstance(progress, dict) and (not self.seen or self.seen[-1] != progress):
                self.seen.append(dict(progress))


@dataclass(frozen=True)
class Halfway:
    done: int
    total: int
    predicted: float
    actual: float

    @property
    def error(self) -> float:
        return (self.predicted - self.actual) / self.actual

    def __str__(self) -> str:
        return (f"at {self.done}/{self.total}: predicted {self.predicted:.1f} s left, took {self.actual:.1f} s "
                f"({self.error:+.0%})")


def halfway(seen: list[Obj]) -> Halfway:
    """The ETA of the first write that counts at least half the steps, against the time the rest took."""
    first = next(p for p in seen if 2 * p["done"] >= p["total"])
    last = seen[-1]
    assert last["done"] == last["total"], last
    at = _stamp(first["lastDoneAt"])
    return Halfway(first["done"], first["total"], (parse_time(first["eta"]) - at).total_seconds(),
                   (_stamp(last["lastDoneAt"]) - at).total_seconds())


def _dump(seen: list[Obj]) -> None:
    """``ICHORD_ETA_DUMP=FILE``: every progress of the run, one JSON line per run (to look into a figure)."""
    if os.environ.get("ICHORD_ETA_DUMP"):
        with Path(os.environ["ICHORD_ETA_DUMP"]).open("a") as f:
            f.write(json.dumps(seen) + "\n")


def within(h: Halfway) -> bool:
    return abs(h.predicted - h.actual) <= 0.2 * h.actual + 0.5


def inject(env: SimEnvironment, reboot: Callable[[int, str], float], apply: float) -> None:
    """Per-node reboot seconds (by index and name) and an apply latency on every node."""
    for i, (name, node) in enumerate(sorted(env.talos.nodes.items())):
        node.timings = replace(node.timings, reboot=reboot(i, name), apply_duration=apply)


async def _rollout(world: World, spec: Obj) -> list[Obj]:
    """A reboot-class config rollout over every machine, run to its end; every progress it was written with."""
    env = world.env
    await world.patch_cluster([REBOOT_PATCH])
    machines = len(env.machine_names)

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == machines

    await world.run_until(reported, what=f"{machines} machines reporting rebootPaths")
    writes = Writes("roll", [])
    env.management.store.listeners.append(writes.listener)
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "roll"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", **spec}})

    async def finished() -> bool:
        return ((await world.op("roll")).get("status") or {}).get("phase") in ("Completed", "Failed", "Paused")

    await world.run_until(finished, steps=20000, what="the rollout finished")
    env.management.store.listeners.remove(writes.listener)
    _dump(writes.seen)
    op = await world.op("roll")
    assert op["status"]["phase"] == "Completed", op["status"]
    return writes.seen


async def _config_scenario(bundle: SecretsBundle, workers: int, spec: Obj,
                           reboot: Callable[[int, str], float], apply: float) -> list[Halfway]:
    out = []
    for _ in range(RUNS):
        async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=3, workers=workers) as env:
            inject(env, reboot, apply)
            async for world in world_on(env, TIMING):
                out.append(halfway(await _rollout(world, spec)))
    return out


def _report(scenario: str, figures: list[Halfway]) -> None:
    errors = [h.error for h in figures]
    print(f"\nETA {scenario}: " + "; ".join(str(h) for h in figures) +
          f" -- spread {min(errors):+.0%} .. {max(errors):+.0%}")
    assert all(within(h) for h in figures), [str(h) for h in figures]


def _varied(slow: str) -> Callable[[int, str], float]:
    """Reboots of 5 to 6.8 s by node, ``slow`` at 12 s."""
    return lambda i, name: 12.0 if name == slow else 5.0 + 0.6 * (i % 4)


async def test_a_3_plus_3_rollouts_eta_from_halfway(bundle: SecretsBundle) -> None:
    # The halfway point is the third control plane done: no worker seen yet, its drain learnt from the control
    # planes' (every machine that reboots is drained). The slow node is a control plane: one node's reboot,
    # not the workers' to come.
    figures = await _config_scenario(bundle, 3, {}, _varied("demo-cp-2"), apply=0.4)
    _report("config 3+3", figures)


async def test_a_3_plus_20_rollouts_eta_from_halfway_with_workers_four_at_once(bundle: SecretsBundle) -> None:
    figures = await _config_scenario(bundle, 20, {"maxUnavailable": 4}, _varied("demo-worker-7"), apply=0.4)
    _report("config 3+20 (4 at once)", figures)


async def _rotation(bundle: SecretsBundle, targets: list[str], reboot: Callable[[int, str], float],
                    apply: float, restart: Callable[[int, str], float] | None = None) -> list[Halfway]:
    """A ca-rotation of ``targets`` run to its end (the driver plays the operator at the hand-off, at once)."""
    out = []
    for _ in range(RUNS):
        async with SimEnvironment(bundle=bundle, time_scale=0.02) as env:
            add_clients(env)
            inject(env, reboot, apply)
            for i, (name, node) in enumerate(sorted(env.talos.nodes.items())):
                if restart is not None:
                    node.timings = replace(node.timings, apiserver_ready_delay=restart(i, name))
            writes = Writes("rotate", [])
            env.management.store.listeners.append(writes.listener)
            async with driving(env, timing=ROTATION_TIMING) as driver:
                await driver.create(targets=targets)
                outcome = await driver.run(max_steps=20000)
            env.management.store.listeners.remove(writes.listener)
            assert isinstance(outcome, Done), outcome
            _dump(writes.seen)
            out.append(halfway(writes.seen))
    return out


#: The driver's timing, with a reboot given two minutes (its scaled bound is shorter than the injected reboots).
ROTATION_TIMING = replace(DRIVER_TIMING, node_action_timeout=120.0, ca_pass_wait_bound=120.0)


def _cp_reboots(slow: str) -> Callable[[int, str], float]:
    """Control planes reboot in 4 to 5.2 s, ``slow`` in 9 s."""
    return lambda i, name: 9.0 if name == slow else 4.0 + 0.6 * (i % 3)


async def test_an_etcd_rotations_eta_from_halfway_with_its_reboot_roll_counted(bundle: SecretsBundle) -> None:
    # Each of the 3 passes: 3 kube-apiserver restarts (the etcd client CA), 3 control planes rebooted, its stage;
    # then Finalizing: 22 steps, halfway in the second pass.
    figures = await _rotation(bundle, ["etcd"], _cp_reboots("demo-cp-2"), apply=0.3)
    _report("etcd rotation (reboot roll)", figures)
    assert {h.total for h in figures} == {22}, figures


async def test_a_default_ca_rotations_eta_from_halfway(bundle: SecretsBundle) -> None:
    # talos and kubernetes: no reboot; each kube-apiserver restart takes its node's time to ready.
    figures = await _rotation(bundle, ["talos", "kubernetes"], _cp_reboots("demo-cp-2"), apply=0.3,
                              restart=lambda i, name: 3.0 if name == "demo-cp-2" else 1.5 + 0.3 * (i % 3))
    _report("default ca-rotation", figures)


async def test_an_aggregator_rotations_eta_from_halfway(bundle: SecretsBundle) -> None:
    figures = await _rotation(bundle, ["kubernetes-aggregator"], _cp_reboots("demo-cp-2"), apply=0.3,
                              restart=lambda i, name: 3.0 if name == "demo-cp-2" else 1.5 + 0.3 * (i % 3))
    _report("aggregator rotation", figures)
