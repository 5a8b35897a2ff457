"""status.progress on a real run (operations/progress.py): a reboot-class config rollout over 3 control planes and
3 workers on the simulators, run by the real cluster actor step and registry. Progress goes 0 -> 6 without ever
going back, an ETA is there while the rollout runs and gone once it is done, and ``kubectl get`` prints both
through the CRD's Progress and ETA columns."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from ichord.api.conditions import parse_time
from ichord.kube import crds
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import REBOOT_PATCH, World, world_on
from tests.integration._kubectl import KUBECTL, operation_columns

pytestmark = [pytest.mark.integration, pytest.mark.anyio,
              pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed and not built (scripts/tools.sh)")]

Obj = dict[str, Any]
TIMING = Timing().scaled(0.01)


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def world(bundle: SecretsBundle) -> AsyncIterator[World]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=3, workers=3) as env:
        async for w in world_on(env, TIMING):
            yield w


async def _columns(world: World, name: str) -> dict[str, str]:
    return await operation_columns(world.env.kubeconfig, world.env.namespace, name)


async def test_a_3_plus_3_rollout_reports_progress_monotonically_and_an_eta_while_it_runs(world: World) -> None:
    env = world.env
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 6

    await world.run_until(reported, what="6 machines reporting rebootPaths")
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "roll"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config"}})

    seen: list[Obj] = []
    running_columns: dict[str, str] = {}

    async def finished() -> bool:
        nonlocal running_columns
        op = await world.op("roll")
        status = op.get("status") or {}
        if status.get("progress") and (not seen or seen[-1] != status["progress"]):
            seen.append(dict(status["progress"]))
            if status.get("phase") == "InProgress" and status["progress"]["done"] > 0 and not running_columns:
                running_columns = await _columns(world, "roll")
        return status.get("phase") in ("Completed", "Failed", "Paused")

    await world.run_until(finished, what="the rollout finished")
    op = await world.op("roll")
    assert op["status"]["phase"] == "Completed", op["status"]

    done = [p["done"] for p in seen]
    assert done == sorted(done) and done[0] == 0 and done[-1] == 6, seen  # 0 -> total, never back
    assert {p["total"] for p in seen} == {6}
    assert all(p["steps"] == f"{p['done']}/6" for p in seen)
    running = [p for p in seen if p["done"] < 6]
    assert running and all(p.get("eta") for p in running), seen  # an ETA from the start to the last machine
    started = parse_time(op["status"]["startedAt"])
    assert all(parse_time(p["eta"]) >= started for p in running)
    final = op["status"]["progress"]
    assert (final["steps"], final.get("eta")) == ("6/6", None)  # the ETA gone once done
    # Each node's parts observed once each, in order and back to back (its cordon and drain, its apply, its reboot
    # to Ready), cut at the markers' times; together no more than the run.
    observed = final["observed"]
    parts = {n: ["drain", "apply", "reboot"] for n in env.machine_names}
    assert {n: [o["step"] for o in observed if o["node"] == n] for n in env.machine_names} == parts, observed
    for n in env.machine_names:
        mine = [o for o in observed if o["node"] == n]
        for a, b in itertools.pairwise(mine):
            assert abs((_stamp(a["startedAt"]) + dt.timedelta(seconds=a["seconds"]) - _stamp(b["startedAt"]))
                       .total_seconds()) < 0.002, (a, b)
    run = (dt.datetime.fromisoformat(final["lastDoneAt"]) - started).total_seconds()
    assert all(o["seconds"] >= 0 for o in observed) and sum(o["seconds"] for o in observed) <= run + 1
    assert "running" not in final, final  # nothing under way once done

    # kubectl prints them through the CRD's columns: while running, and once done.
    assert running_columns, "kubectl was never run while the rollout was under way"
    assert running_columns["PROGRESS"].endswith("/6") and running_columns["PROGRESS"] != "6/6", running_columns
    assert running_columns["ETA"].endswith("Z"), running_columns
    done_columns = await _columns(world, "roll")
    assert (done_columns["PHASE"], done_columns["PROGRESS"], done_columns["ETA"]) == ("Completed", "6/6", "")


#: A second reboot-class change (another kernel module), so the same world rolls out twice.
SECOND_PATCH = "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: nf_conntrack\n"


def _stamp(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


async def _roll(world: World, name: str, patch: str) -> tuple[Obj, list[Obj]]:
    """Roll ``patch`` out as operation ``name``; the operation as it ended and each new progress it reported."""
    env = world.env
    await world.patch_cluster([patch])

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 6

    await world.run_until(reported, what="6 machines reporting rebootPaths")
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": name}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config"}})
    seen: list[Obj] = []

    async def finished() -> bool:
        status = (await world.op(name)).get("status") or {}
        progress = status.get("progress")
        if progress and (not seen or seen[-1]["done"] != progress["done"]):
            seen.append(dict(progress))
        return status.get("phase") in ("Completed", "Failed", "Paused")

    await world.run_until(finished, steps=4000, what=f"{name} finished")
    return await world.op(name), seen


async def test_the_eta_at_halfway_is_within_20_percent_of_the_time_left(world: World) -> None:
    """Per-node reboot times injected in the simulated nodes (varied, one slow worker): a first rollout records
    them, and the second's ETA, at its halfway point, is within 20 % of the time it then took. Both are the
    daemon's step clock as written in the status (progress.lastDoneAt, progress.eta), never the test's clock."""
    env = world.env
    seconds = dict(zip(env.machine_names, [1.0, 1.4, 1.2, 1.1, 3.0, 1.3], strict=True))  # the fifth: slow
    for name, node in env.talos.nodes.items():
        node.timings = replace(node.timings, reboot=seconds[name])

    first, _ = await _roll(world, "first", REBOOT_PATCH)
    assert first["status"]["phase"] == "Completed", first["status"]
    second, seen = await _roll(world, "second", SECOND_PATCH)
    assert second["status"]["phase"] == "Completed", second["status"]

    halfway = next(p for p in seen if p["done"] == 3)
    left = (_stamp(second["status"]["progress"]["lastDoneAt"]) - _stamp(halfway["lastDoneAt"])).total_seconds()
    predicted = (parse_time(halfway["eta"]) - _stamp(halfway["lastDoneAt"])).total_seconds()
    # The ETA is written to the second, truncated: up to a second earlier than computed, never later.
    assert 0.8 * left <= predicted + 1.0 and predicted <= 1.2 * left, (predicted, left, seen)
    assert left > 4.0, left  # the injected reboots dominate what is measured (not the steps' own overhead)
