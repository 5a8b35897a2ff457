"""Health gates of a CA rotation on the simulators (docs/decisions.md#health-gates): a CEL gate over the managed
cluster's Node conditions holds the rotation before its next pass starts, and before the next control plane of the
etcd reboot roll, and lets it go on by itself once the condition clears. What was held is read from the simulators'
history (applies and reboots), not from status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.operations.outcome import Blocked, Done
from ichord.pki.bundle import SecretsBundle
from ichord.sim.combined import SimEnvironment
from tests.integration._ca_rotation_driver import Driver, add_clients, at, stages_seen

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
SCALE = 0.02

Obj = dict[str, Any]
#: A Node condition a node-problem-detector would set; the gate holds while any Node has it True.
PROBLEM = "ExampleDiskPressure"
HEALTHY = f'nodes.all(n, !n.status.conditions.exists(c, c.type == "{PROBLEM}" && c.status == "True"))'
GATE = {"gates": [{"name": "no-disk-pressure", "cel": {"expression": HEALTHY}}]}


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE) as e:
        add_clients(e)
        yield e


def _cond(op: Obj) -> Obj:
    return find((op.get("status") or {}).get("conditions"), names.CA_ROTATION) or {}


def _gate_failing(op: Obj) -> bool:
    return _cond(op).get("reason") == names.HealthGateReason.FAILING


async def _problem(driver: Driver, status: str) -> None:
    """Set the problem condition on one Node of the managed cluster through its API (as a detector would)."""
    listed = await driver.kube.raw("GET", "/api/v1/nodes")
    obj = sorted(listed["items"], key=lambda n: n["metadata"]["name"])[-1]
    conds = [c for c in obj["status"].get("conditions") or [] if c.get("type") != PROBLEM]
    conds.append({"type": PROBLEM, "status": status, "reason": "Test", "message": "set by the test"})
    obj["status"]["conditions"] = conds
    await driver.kube.raw("PUT", f"/api/v1/nodes/{obj['metadata']['name']}/status", body=obj)


async def _events(driver: Driver, reason: str) -> list[Obj]:
    await driver.recorder.drain()
    store = driver.env.management.store
    return [e for e in store.list(store.resolve("", "v1", "events"), driver.env.namespace)[0]
            if e.get("reason") == reason]


async def test_a_cel_gate_holds_a_ca_rotation_before_its_next_pass_and_it_goes_on_once_it_passes(
        env: SimEnvironment, driver: Driver) -> None:
    await crds.clusters(driver.kube).patch(env.namespace, env.cluster_name, {"spec": {"health": GATE}})
    driver.acknowledge = False  # stop at the hand-off: the Issuing pass is the next to start
    await driver.create()
    await driver.run(max_steps=600, until=at("AwaitingCredentials"))
    status = (await driver.get())["status"]
    assert status["healthGates"]["passedFor"] == "the Accepting pass"  # the first pass was asked too
    await _problem(driver, "True")
    driver.acknowledge = True
    await driver.run(max_steps=200, until=_gate_failing)
    applies = len(env.talos.history.of("apply"))
    for _ in range(10):  # held, step after step: the Issuing pass does not start
        assert isinstance(await driver.step(), Blocked)
    op = await driver.get()
    assert len(env.talos.history.of("apply")) == applies  # nothing applied while held (the simulators' word)
    assert op["status"]["phase"] == "Paused"
    assert op["status"]["caRotation"]["stage"] == "Issuing"
    assert op["status"]["caRotation"].get("passStarted") != "Issuing"
    assert "no-disk-pressure" in _cond(op)["message"] and "expression is false" in _cond(op)["message"]
    verdicts = op["status"]["healthGates"]
    assert verdicts["target"] == "the Issuing pass"
    assert [(g["name"], g["type"], g["passing"]) for g in verdicts["gates"]] == [("no-disk-pressure", "cel", False)]
    warnings = await _events(driver, names.HealthGateReason.FAILING)
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning" and "the Issuing pass" in warnings[0]["message"]

    await _problem(driver, "False")
    assert isinstance(await driver.run(max_steps=1500), Done)
    assert len(env.talos.history.of("apply")) > applies
    assert stages_seen(driver.snapshots)[-4:] == ["Issuing", "Dropping", "Finalizing", "Done"]
    passed = await _events(driver, names.EventReason.GATE_PASSED)
    assert len(passed) == 1 and passed[0]["type"] == "Normal" and "the Issuing pass" in passed[0]["message"]
    assert len(await _events(driver, names.HealthGateReason.FAILING)) == 1
    assert all(g["passing"] for g in (await driver.get())["status"]["healthGates"]["gates"])


async def test_a_cel_gate_holds_the_etcd_roll_before_its_next_control_plane(env: SimEnvironment,
                                                                             driver: Driver) -> None:
    cps = [m for m in env.machine_names if "cp" in m]
    await crds.clusters(driver.kube).patch(env.namespace, env.cluster_name, {"spec": {"health": GATE}})
    await driver.create(targets=["etcd"])
    await driver.run(max_steps=600, until=lambda o: o["status"].get("caRotation", {}).get("etcdRestarted") == cps[:1])
    await _problem(driver, "True")
    await driver.run(max_steps=200, until=_gate_failing)
    reboots = len(env.talos.history.of("reboot_requested"))
    for _ in range(10):  # held: the next control plane is neither cordoned nor rebooted
        assert isinstance(await driver.step(), Blocked)
    assert len(env.talos.history.of("reboot_requested")) == reboots
    op = await driver.get()
    assert op["status"]["phase"] == "Paused"
    assert op["status"]["caRotation"]["etcdRestarted"] == cps[:1]
    assert op["status"]["healthGates"]["target"] == cps[1]
    store = env.kube.store
    assert not any(n["spec"].get("unschedulable") for n in store.list(store.resolve("", "v1", "nodes"), None)[0])
    warnings = await _events(driver, names.HealthGateReason.FAILING)
    assert len(warnings) == 1 and cps[1] in warnings[0]["message"]

    await _problem(driver, "False")
    assert isinstance(await driver.run(max_steps=2000), Done)
    # Every pass rebooted every control plane once (three passes), the held one included.
    assert {cp: len(env.talos.history.of("reboot_requested", cp)) for cp in cps} == {cp: 3 for cp in cps}
    passed = await _events(driver, names.EventReason.GATE_PASSED)
    assert len(passed) == 1 and cps[1] in passed[0]["message"]


async def test_the_operations_own_gates_hold_its_first_pass_before_anything_is_applied(env: SimEnvironment,
                                                                                     driver: Driver) -> None:
    await _problem(driver, "True")
    await crds.operations(driver.kube).create(env.namespace, {"metadata": {"name": driver.op_name}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "paused": False, "health": GATE}})
    applies = len(env.talos.history.of("apply"))
    await driver.run(max_steps=300, until=_gate_failing)
    for _ in range(5):
        assert isinstance(await driver.step(), Blocked)
    assert len(env.talos.history.of("apply")) == applies
    op = await driver.get()
    assert op["status"]["healthGates"]["target"] == "the Accepting pass"
    assert "passStarted" not in op["status"]["caRotation"]
    await _problem(driver, "False")
    assert isinstance(await driver.run(max_steps=1500), Done)
    assert len(env.talos.history.of("apply")) > applies
