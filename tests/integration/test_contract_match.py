"""docs/decisions.md#contract-match on the simulators: a TalosCluster's spec.talosVersion against what its nodes run.

The cluster actor's real step and registry over mutual-TLS Talos node simulators that report their Version as real
Talos does (``VersionInfo.tag`` v1.14.5, v1.13.9). A contract of another major.minor than the nodes run applies
nothing: no ApplyConfiguration (dry run included) reaches a node, counted by the nodes themselves; every machine is
Ready=False/ContractMismatch naming both versions and the command that fixes it, which works pasted (the real
kubectl where the real tier built it); a config rollout that would apply to such a node is Blocked naming it; and
putting the contract back lets the machines converge and the rollout finish.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.contract import V1_13, V1_14, VersionContract
from ichord.kube import crds
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import World, reboots, world_on
from tests.integration._kubectl import KUBECTL

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
TIMING = Timing().scaled(0.01)
APPLIES = ("ApplyConfiguration", "ApplyConfiguration(dry run)")
COMMAND = re.compile(r"`(kubectl [^`]+)`")
#: A change both contracts render (v1.14's KernelModuleConfig is no v1.13 document) and take only at a reboot.
REBOOT_PATCH = "machine:\n  env:\n    CONTRACT_TEST: \"1\"\n"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


async def _world(bundle: SecretsBundle, contract: VersionContract) -> AsyncIterator[World]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=1, workers=2, contract=contract,
                              management_api="separate") as env:
        async for w in world_on(env, TIMING):
            yield w


@pytest.fixture
async def world(bundle: SecretsBundle) -> AsyncIterator[World]:
    async for w in _world(bundle, V1_14):
        yield w


@pytest.fixture
async def world_v113(bundle: SecretsBundle) -> AsyncIterator[World]:
    async for w in _world(bundle, V1_13):
        yield w


def _ready(obj: Obj) -> Obj:
    return find((obj.get("status") or {}).get("conditions"), names.READY) or {}


def _applies(world: World) -> dict[str, int]:
    """What every node served of ApplyConfiguration, dry runs included (the nodes' own counters)."""
    return {m: sum(world.env.node(m).rpcs[k] for k in APPLIES) for m in world.env.machine_names}


async def _all_ready(world: World, reason: str) -> list[Obj]:
    async def there() -> bool:
        return all(_ready(m).get("reason") == reason for m in await world.machines())

    await world.run_until(there, what=f"every TalosMachine Ready {reason}")
    return await world.machines()


async def _set_contract(world: World, version: str) -> None:
    await crds.clusters(world.kube).patch(world.env.namespace, world.env.cluster_name,
                                          {"spec": {"talosVersion": version}})


async def _paste(world: World, message: str) -> None:
    """Run the command the message names as a person would paste it: the real kubectl when built, else the same
    merge patch through the API (its -p parsed from the command, so the command's JSON is what is checked)."""
    found = COMMAND.search(message)
    assert found is not None, message
    argv = shlex.split(found.group(1))
    assert argv[:3] == ["kubectl", "-n", world.env.namespace] and argv[3:6] == [
        "patch", "taloscluster", world.env.cluster_name], argv
    assert argv[6:8] == ["--type", "merge"] and argv[8] == "-p", argv
    if KUBECTL is not None:
        await anyio.run_process([KUBECTL, "--kubeconfig", str(world.env.kubeconfig), *argv[1:]], check=True)
    else:
        await crds.clusters(world.kube).patch(world.env.namespace, world.env.cluster_name, json.loads(argv[9]))


async def test_a_v113_contract_on_v114_nodes_applies_nothing_and_names_both_versions(world: World) -> None:
    env = world.env
    await _all_ready(world, "Converged")
    before = _applies(world)
    await _set_contract(world, "v1.13")  # kubectl patch tc demo --type merge -p '{"spec":{"talosVersion":"v1.13"}}'

    machines = await _all_ready(world, names.ReadyReason.CONTRACT_MISMATCH)
    for _ in range(3):  # and stays so, step after step
        await world.step()
    assert _applies(world) == before  # not one ApplyConfiguration, not even a dry run
    for m in machines:
        ready = _ready(m)
        assert ready["status"] == "False"
        message = ready["message"]
        assert "Talos v1.14.5" in message and "v1.13 contract" in message, message
        assert "Upgrade Talos on the node to a v1.13 release first" in message, message
        assert m["status"]["talosVersion"] == "v1.14.5"
        assert m["status"]["rebootPaths"] == [] and m["status"]["apiServerRestartPaths"] == []
    events = (await world.kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
    assert {e["involvedObject"]["name"] for e in events if e["reason"] == names.EventReason.CONTRACT_MISMATCH
            and e["type"] == "Warning"} == set(env.machine_names)

    await _paste(world, _ready(machines[0])["message"])  # the command the message gives: the contract v1.14 again
    await _all_ready(world, "Converged")
    assert _applies(world) == before  # they ran the v1.14 render all along


async def test_a_v114_contract_on_v113_nodes_applies_nothing_and_says_to_upgrade_or_set_v113(
        world_v113: World) -> None:
    world = world_v113
    await _all_ready(world, "Converged")
    before = _applies(world)
    await _set_contract(world, "v1.14")

    machines = await _all_ready(world, names.ReadyReason.CONTRACT_MISMATCH)
    assert _applies(world) == before
    for m in machines:
        message = _ready(m)["message"]
        assert "Talos v1.13.9" in message and "v1.14 contract" in message, message
        assert "Upgrade Talos on the node to a v1.14 release first" in message, message
        assert """'{"spec":{"talosVersion":"v1.13"}}'""" in message, message

    await _paste(world, _ready(machines[-1])["message"])
    await _all_ready(world, "Converged")
    assert _applies(world) == before


def _rollout(obj: Obj) -> Obj:
    return find((obj.get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT) or {}


async def _phase(world: World, name: str, *phases: str) -> Obj:
    async def there() -> bool:
        return (await world.op(name)).get("status", {}).get("phase") in phases

    await world.run_until(there, what=f"{name} in {phases}")
    return await world.op(name)


async def test_a_config_rollout_over_a_node_of_another_contract_is_blocked_naming_it(world: World) -> None:
    env = world.env
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return all((m.get("status") or {}).get("rebootPaths") for m in await world.machines())

    await world.run_until(reported, what="every machine reporting rebootPaths")
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "roll"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": True}})
    plan = (await _phase(world, "roll", "Pending"))["status"]["plan"]
    first = plan["machines"][0]["name"]

    await _set_contract(world, "v1.13")  # after the plan, before the start: every node still runs v1.14.5
    since, before = len(env.talos.history.events), _applies(world)
    await crds.operations(world.kube).patch(env.namespace, "roll", {"spec": {"paused": False}})

    async def blocked() -> bool:
        return _rollout(await world.op("roll")).get("reason") == names.CONTRACT_MISMATCH

    await world.run_until(blocked, steps=200, what="the rollout blocked on the contract")
    for _ in range(3):
        await world.step()
    op = await world.op("roll")
    assert op["status"]["phase"] == "Paused", op["status"]  # Blocked, not Failed
    cond = _rollout(op)
    assert cond["status"] == "False"
    assert f"TalosMachine {first} " in cond["message"], cond
    assert "Talos v1.14.5" in cond["message"] and "v1.13 contract" in cond["message"], cond
    assert _applies(world) == before  # nothing applied, not even a dry run
    assert reboots(env, since) == dict.fromkeys(env.machine_names, 0)
    nodes = (await world.kube.raw("GET", "/api/v1/nodes"))["items"]
    assert not [n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")]
    events = (await world.kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
    assert any(e["reason"] == names.EventReason.OPERATION_BLOCKED and e["involvedObject"]["name"] == "roll"
               and "v1.13 contract" in e["message"] for e in events)

    await _paste(world, cond["message"])  # the contract back to what the nodes run: the rollout goes on by itself
    op = await _phase(world, "roll", "Completed", "Failed")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == dict.fromkeys(env.machine_names, 1)
    await _all_ready(world, "Converged")
