"""What Talos's decoder refuses never reaches a node through a ``config`` operation (issue 26).

Once, a cluster patch ``machine: {env: just-a-string}`` was classed RebootRequired and a config operation
rolled it out with a reboot per node, reporting Completed. Now the machines say InvalidConfig (no reboot
paths to plan), the operation finds nothing to roll out, and no node is applied to or rebooted; a patch
that turns invalid in the middle of a rollout blocks it before the next machine, which is left untouched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import REBOOT_PATCH, World, reboots, world_on

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
TIMING = Timing().scaled(0.01)
WRONG_TYPE = "machine:\n  env: just-a-string\n"
UNKNOWN_FIELD = "machine:\n  nonsense: 1\n"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def world(bundle: SecretsBundle) -> AsyncIterator[World]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=3, workers=1) as env:
        async for w in world_on(env, TIMING):
            yield w


def _cond(obj: Obj, ctype: str) -> Obj:
    return find((obj.get("status") or {}).get("conditions"), ctype) or {}


def _applies(world: World, since: int) -> int:
    return sum(1 for e in world.env.talos.history.events[since:] if e["kind"] == "apply")


async def _all_invalid(world: World) -> list[Obj]:
    async def invalid() -> bool:
        return all(_cond(m, names.READY).get("reason") == "InvalidConfig" for m in await world.machines())

    await world.run_until(invalid, what="every machine Ready=False/InvalidConfig")
    return await world.machines()


@pytest.mark.parametrize(("patch", "says"), [(WRONG_TYPE, "machine.env: expected a mapping"),
                                             (UNKNOWN_FIELD, "machine.nonsense: unknown field")])
async def test_an_invalid_cluster_patch_is_reported_and_never_rolled_out(world: World, patch: str, says: str) -> None:
    env = world.env
    since = len(env.talos.history.events)
    await world.patch_cluster([patch])
    machines = await _all_invalid(world)
    for m in machines:
        ready = _cond(m, names.READY)
        assert ready["status"] == "False" and says in ready["message"], ready
        assert not m["status"].get("rebootPaths") and not m["status"].get("apiServerRestartPaths")

    def invalid_events() -> list[Obj]:
        return [e for e in env.kube.store.list(env.kube.store.resolve("", "v1", "events"), env.namespace)[0]
                if e.get("reason") == "InvalidConfig"]

    async def posted() -> bool:
        return len({e["involvedObject"]["name"] for e in invalid_events()}) == len(machines)

    await world.run_until(posted, what="one InvalidConfig Warning per machine")
    for _ in range(5):
        await world.step()  # still invalid: no further Warning
    warnings = invalid_events()
    assert warnings and all(e["type"] == "Warning" for e in warnings)
    assert len({e["involvedObject"]["name"] for e in warnings}) == len(machines)  # one per machine
    assert all(e.get("count", 1) == 1 for e in warnings)  # not repeated while it stays invalid

    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "roll"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": False}})

    async def finished() -> bool:
        return (await world.op("roll")).get("status", {}).get("phase") in ("Completed", "Failed")

    await world.run_until(finished, what="the operation finished")
    op = await world.op("roll")
    assert op["status"]["phase"] == "Failed", op["status"]
    # The cause, not "nothing to roll out": the machines wait for nothing because their configuration is invalid.
    cond = _cond(op, names.CONFIG_ROLLOUT)
    assert cond["reason"] == "InvalidConfig" and says in cond["message"], cond
    assert "fix the patch" in cond["message"], cond
    assert sum(reboots(env, since).values()) == 0
    assert _applies(world, since) == 0  # nothing reached any node


async def test_a_patch_turned_invalid_mid_rollout_blocks_before_the_next_machine(world: World) -> None:
    env = world.env
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 4

    await world.run_until(reported, what="4 machines reporting rebootPaths")
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "roll"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": False}})

    async def first_done() -> bool:
        return len(((await world.op("roll")).get("status") or {}).get("roll", {}).get("done") or []) >= 1

    await world.run_until(first_done, what="the first machine rolled out")
    since = len(env.talos.history.events)
    await world.patch_cluster([REBOOT_PATCH, WRONG_TYPE])

    async def blocked() -> bool:
        return (await world.op("roll")).get("status", {}).get("phase") == "Paused"

    await world.run_until(blocked, what="the rollout blocked")
    op = await world.op("roll")
    cond = _cond(op, names.CONFIG_ROLLOUT)
    assert cond["reason"] == "Blocked" and "machine.env: expected a mapping" in cond["message"], cond
    assert _applies(world, since) == 0
    assert sum(reboots(env, since).values()) == 0
