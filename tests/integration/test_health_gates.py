"""Health gates and soak on the simulators (ichord/operations/gates.py, docs/decisions.md#health-gates): a config
rollout on 3 control planes + 2 workers, run by the real cluster actor step and registry, held before the next node
while a CEL gate over the Nodes' conditions fails and going on by itself once it passes; a soak asked again after
its time before each node; a bad gate holding everything. Reboots are read from the simulators' history."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find, parse_time
from ichord.kube import crds
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import REBOOT_PATCH, World, reboots, world_on

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
SCALE = 0.01
TIMING = Timing().scaled(SCALE)
#: A Node condition a node-problem-detector would set; the gate holds while any Node has it True.
PROBLEM = "ExampleDiskPressure"
HEALTHY = f'nodes.all(n, !n.status.conditions.exists(c, c.type == "{PROBLEM}" && c.status == "True"))'


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def world(bundle: SecretsBundle) -> AsyncIterator[World]:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, control_planes=3, workers=2) as env:
        async for w in world_on(env, TIMING):
            yield w


def _cond(obj: Obj) -> Obj:
    return find((obj.get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT) or {}


async def _set_health(world: World, health: Obj) -> None:
    await crds.clusters(world.kube).patch(world.env.namespace, world.env.cluster_name, {"spec": {"health": health}})


async def _problem(world: World, node: str, status: str) -> None:
    """Set the problem condition on a Node of the managed cluster, through its API (as a detector would)."""
    obj = await world.kube.raw("GET", f"/api/v1/nodes/{node}")
    conds = [c for c in obj["status"].get("conditions") or [] if c.get("type") != PROBLEM]
    conds.append({"type": PROBLEM, "status": status, "reason": "Test", "message": "set by the test"})
    obj["status"]["conditions"] = conds
    await world.kube.raw("PUT", f"/api/v1/nodes/{node}/status", body=obj)


async def _start(world: World, name: str) -> None:
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 5

    await world.run_until(reported, what="every machine reporting rebootPaths")
    await crds.operations(world.kube).create(world.env.namespace, {"metadata": {"name": name}, "spec": {
        "clusterRef": {"name": world.env.cluster_name}, "kind": "config", "paused": False}})


def _events(world: World, reason: str) -> list[Obj]:
    return [e for e in world.env.kube.store.list(world.env.kube.store.resolve("", "v1", "events"),
                                                  world.env.namespace)[0] if e.get("reason") == reason]


async def test_a_cel_gate_over_node_conditions_holds_before_the_next_node_and_goes_on_once_it_passes(
        world: World) -> None:
    env = world.env
    await _set_health(world, {"gates": [{"name": "no-disk-pressure", "cel": {"expression": HEALTHY}}]})
    since = len(env.talos.history.events)
    await _start(world, "roll")
    first, second = f"{env.cluster_name}-cp-1", f"{env.cluster_name}-cp-2"
    worker = f"{env.cluster_name}-worker-2"

    async def first_done() -> bool:
        return first in ((await world.op("roll")).get("status") or {}).get("roll", {}).get("done", [])

    await world.run_until(first_done, what=f"{first} rolled")
    await _problem(world, worker, "True")  # before the next node starts

    async def held() -> bool:
        return _cond(await world.op("roll")).get("reason") == names.HealthGateReason.FAILING

    await world.run_until(held, what="held by the gate")
    for _ in range(20):  # held, step after step: nothing more reboots
        await world.step()
    op = await world.op("roll")
    assert op["status"]["phase"] == "Paused"
    assert "no-disk-pressure" in _cond(op)["message"] and "expression is false" in _cond(op)["message"]
    assert sum(reboots(env, since).values()) == 1, reboots(env, since)
    verdicts = op["status"]["healthGates"]
    assert verdicts["target"] == second
    assert [(g["name"], g["type"], g["passing"]) for g in verdicts["gates"]] == [("no-disk-pressure", "cel", False)]
    warnings = _events(world, names.HealthGateReason.FAILING)
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning" and second in warnings[0]["message"]

    await _problem(world, worker, "False")

    async def completed() -> bool:
        return (await world.op("roll")).get("status", {}).get("phase") in ("Completed", "Failed")

    await world.run_until(completed, steps=4000, what="the rollout completed")
    op = await world.op("roll")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == {m: 1 for m in env.machine_names}
    passed = _events(world, names.EventReason.GATE_PASSED)
    assert len(passed) == 1 and passed[0]["type"] == "Normal" and second in passed[0]["message"]
    assert len(_events(world, names.HealthGateReason.FAILING)) == 1  # one Warning per start of a failure
    assert all(g["passing"] for g in op["status"]["healthGates"]["gates"])


async def test_a_soak_asks_the_gates_again_after_its_time_before_each_node(world: World) -> None:
    env = world.env
    soak = 300 * SCALE  # "5m" (the longer of the soak and the delay gate) at the test's time scale
    await _set_health(world, {"soak": "1m", "gates": [{"name": "ready", "cel": {"expression": HEALTHY}},
                                                      {"name": "settle", "delay": {"duration": "5m"}}]})
    since = len(env.talos.history.events)
    await _start(world, "soaked")
    let_through: list[tuple[str, Obj]] = []
    soaking_seen: set[str] = set()

    async def completed() -> bool:
        op = await world.op("soaked")
        record = (op.get("status") or {}).get("healthGates") or {}
        if _cond(op).get("reason") == names.HealthGateReason.SOAKING:
            soaking_seen.add(record["target"])
        if record.get("passedFor") and (not let_through or let_through[-1][0] != record["passedFor"]):
            let_through.append((record["passedFor"], record))
        return op.get("status", {}).get("phase") in ("Completed", "Failed")

    await world.run_until(completed, steps=6000, what="the soaked rollout completed")
    op = await world.op("soaked")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == {m: 1 for m in env.machine_names}
    planned = [m["name"] for m in op["status"]["plan"]["machines"]]
    assert [name for name, _ in let_through] == planned  # the gates let every node through, in order
    assert soaking_seen == set(planned[1:])  # every node but the first waited for the soak
    for name, record in let_through[1:]:
        # Asked when the soak began and again after it (the record's own clock, in whole seconds: the start is
        # rounded up and the last evaluation down, so one second of the soak may not show).
        asked = parse_time(record["gates"][0]["lastEvaluated"])
        assert (asked - parse_time(record["soakStartedAt"])).total_seconds() >= soak - 1, (name, record)
    assert "soakStartedAt" not in let_through[0][1]  # the first node does not soak


async def test_an_invalid_gate_holds_the_rollout_and_nothing_reboots(world: World) -> None:
    env = world.env
    # The CRD's schema refuses most bad gates; an expression that does not compile is found by ichord. One that reads
    # a variable a gate does not have used to compile, then fail at each evaluation with cel-python's whole
    # activation in the condition (14.7 KB of Python reprs).
    await _set_health(world, {"gates": [{"name": "broken", "cel": {"expression": "nodes.all(n, n.spec.x) && foo"}}]})
    since = len(env.talos.history.events)
    await _start(world, "bad")

    async def held() -> bool:
        return _cond(await world.op("bad")).get("reason") == names.HealthGateReason.INVALID

    await world.run_until(held, what="held by the invalid gate")
    for _ in range(10):
        await world.step()
    op = await world.op("bad")
    assert op["status"]["phase"] == "Paused"
    message = _cond(op)["message"]
    assert "health gate 'broken': cel.expression does not compile: undeclared reference to 'foo'; the declared " \
           "variables are nodes (the managed cluster's Nodes, a list of objects) and target" in message, message
    assert len(message) < 1024 and "Referent" not in message and "<class" not in message, message
    assert sum(reboots(env, since).values()) == 0
    assert len(_events(world, names.HealthGateReason.INVALID)) == 1

    await _set_health(world, {"gates": [{"name": "fixed", "cel": {"expression": HEALTHY}}]})

    async def completed() -> bool:
        return (await world.op("bad")).get("status", {}).get("phase") in ("Completed", "Failed")

    await world.run_until(completed, steps=4000, what="the rollout completed once the gate was fixed")
    assert reboots(env, since) == {m: 1 for m in env.machine_names}


@pytest.fixture
async def wide(bundle: SecretsBundle) -> AsyncIterator[World]:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, control_planes=3, workers=4) as env:
        async for w in world_on(env, TIMING):
            yield w


async def test_with_gates_workers_go_in_rounds_each_gated_never_a_freed_slot_alone(wide: World) -> None:
    world, env = wide, wide.env
    await _set_health(world, {"soak": "1m", "gates": [{"name": "ready", "cel": {"expression": HEALTHY}}]})
    since = len(env.talos.history.events)
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 7

    await world.run_until(reported, what="every machine reporting rebootPaths")
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "rounds"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": False, "maxUnavailable": 2}})
    let_through: list[str] = []

    async def completed() -> bool:
        op = await world.op("rounds")
        passed = ((op.get("status") or {}).get("healthGates") or {}).get("passedFor")
        if passed and (not let_through or let_through[-1] != passed):
            let_through.append(passed)
        return op.get("status", {}).get("phase") in ("Completed", "Failed")

    await world.run_until(completed, steps=6000, what="the rollout completed")
    assert (await world.op("rounds"))["status"]["phase"] == "Completed"
    assert reboots(env, since) == {m: 1 for m in env.machine_names}
    w = [f"{env.cluster_name}-worker-{i}" for i in range(1, 5)]
    # Rounds of two (the last worker always alone): [w1, w2], [w3], [w4], each let through by the gates.
    assert let_through == [f"{env.cluster_name}-cp-{i}" for i in (1, 2, 3)] + [w[0], w[2], w[3]]
    history = env.talos.history.events[since:]
    rebooted_at = {e["node"]: i for i, e in enumerate(history) if e["kind"] == "reboot"}
    back_at = {e["node"]: i for i, e in enumerate(history) if e["kind"] in ("up", "boot")}
    assert rebooted_at[w[2]] > max(back_at[w[0]], back_at[w[1]])  # w3 waited for the whole first round
