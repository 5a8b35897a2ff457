"""Issue 29: one error policy for every operation kind, in the registry (operations/step_errors.py).

A 500 from the management API inside a step (config's TalosMachine LIST, any kind's first status write) is a
retry of that step with backoff and one log line per failed step, never an actor crash ("actor crashed;
restarting"); past the bound the operation's StepsFailing condition and one Warning say so, and the first step
that runs again lowers it. Driven by the real cluster actor step and the default registry on the simulators.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from structlog.testing import capture_logs

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.operations.kinds import default_registry
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import World, cached, world_on

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
FAILED_STEP = "operation step failed; retrying"


def _timing(bound: float) -> Timing:
    return replace(Timing().scaled(0.01), step_retry_bound=bound)


@pytest.fixture
async def world(env: SimEnvironment) -> AsyncIterator[World]:
    async for w in world_on(env, _timing(bound=3600.0)):
        yield w


@pytest.fixture
async def bounded_world(env: SimEnvironment) -> AsyncIterator[World]:
    """Steps failing for any time at all are past the bound: the first failed step raises the condition."""
    async for w in world_on(env, _timing(bound=0.0)):
        yield w


async def _create(world: World, name: str, kind: str) -> None:
    await crds.operations(world.kube).create(world.env.namespace, {"metadata": {"name": name}, "spec": {
        "clusterRef": {"name": world.env.cluster_name}, "kind": kind, "paused": False}})
    await cached(world.reconciler.rt.operations, (world.env.namespace, name))


async def _failed_steps(world: World, steps: int) -> list[dict[str, Any]]:
    """Step the actor ``steps`` times; the policy's log lines (an exception here would be an actor crash)."""
    with capture_logs() as logs:
        for _ in range(steps):
            await world.step()
            assert isinstance(world.reconciler._last.get("operations"), tuple)
            assert world.reconciler._last["operations"] == ("Requeue", "step failed")
    return [e for e in logs if e.get("event") == FAILED_STEP]


@pytest.mark.parametrize("kind", sorted(default_registry().kinds))
async def test_a_500_on_the_status_write_of_every_kind_is_a_retry_with_one_log_line(world: World, kind: str) -> None:
    await _create(world, "op", kind)
    world.env.management.faults.error_rate = {"patch:talosoperations": 1.0}
    failed = await _failed_steps(world, 3)
    assert [e["kind"] for e in failed] == [kind] * 3  # one line per failed step, no more
    assert [e["failed_steps"] for e in failed] == [1, 2, 3]
    assert failed[0]["retry_in"] < failed[1]["retry_in"] < failed[2]["retry_in"]  # backoff
    assert "injected fault" in failed[0]["error"]
    world.env.management.faults.error_rate = {}
    with capture_logs() as logs:
        await world.step()
    assert not [e for e in logs if e.get("event") == FAILED_STEP]
    op = await world.op("op")
    assert (op.get("status") or {}).get("phase")  # the step that failed three times now wrote its status


async def test_a_500_on_configs_machine_list_raises_steps_failing_past_the_bound_and_recovers(
        bounded_world: World) -> None:
    world, env = bounded_world, bounded_world.env
    await _create(world, "cfg", names.KIND_CONFIG)
    world.env.management.faults.error_rate = {"list:talosmachines": 1.0}
    failed = await _failed_steps(world, 2)
    assert len(failed) == 2 and all(e["kind"] == names.KIND_CONFIG for e in failed)
    op = await world.op("cfg")
    cond = find(op["status"]["conditions"], names.STEPS_FAILING)
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", names.StepsFailingReason.API_ERROR)
    assert "2 steps in a row failed" not in cond["message"]  # raised once, at the first step past the bound
    assert "injected fault" in cond["message"]

    world.env.management.faults.error_rate = {}
    await world.step()
    op = await world.op("cfg")
    cond = find(op["status"]["conditions"], names.STEPS_FAILING)
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", names.StepsFailingReason.RECOVERED)

    async def warnings() -> list[Obj]:
        events = (await world.kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
        return [e for e in events if e.get("reason") == names.EventReason.STEPS_FAILING]

    async def warned() -> bool:  # the recorder sends Events in the background
        return bool(await warnings())

    await world.run_until(warned, what="the StepsFailing Warning")
    [event] = await warnings()
    assert event["type"] == "Warning" and event.get("count", 1) == 1


async def test_a_step_lists_no_operations_so_a_failing_list_stops_nothing(world: World) -> None:
    """The step reads its operations from the informer's cache (docs/architecture.md#read-your-writes)."""
    world.env.management.faults.error_rate = {"list:talosoperations": 1.0}
    world.env.management.requests.clear()
    with capture_logs() as logs:
        await world.step()
    assert world.env.management.requests.count("list", resource="talosoperations") == 0
    assert world.reconciler._last["machines"][0] in ("Done", "Requeue")
    assert not [e for e in logs if e.get("log_level") in ("warning", "error")]


async def test_a_500_on_the_fresh_read_of_an_operation_about_to_start_is_a_retry(world: World) -> None:
    """What still reads an operation from the API in a step: the one GET before it starts (ClusterScope.reread)."""
    await _create(world, "cfg", names.KIND_CONFIG)
    world.env.management.faults.error_rate = {"get:talosoperations": 1.0}
    failed = await _failed_steps(world, 2)
    assert [e["failed_steps"] for e in failed] == [1, 2]
    assert all("injected fault" in e["error"] for e in failed)
    world.env.management.faults.error_rate = {}
    assert not ((await world.op("cfg")).get("status") or {}).get("phase")  # nothing was started on a stale copy
    await world.step()
    assert ((await world.op("cfg")).get("status") or {}).get("phase")
