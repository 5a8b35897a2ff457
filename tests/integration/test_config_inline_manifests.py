"""A cluster patch with ``cluster.inlineManifests`` written as Talos documents it (a list of name/contents mappings)
is rendered, classified and rolled out like any other: once, ichord's strict decoder refused it (InvalidConfig on
every machine) where Talos takes it (tests/real/test_strict_lists_oracle.py holds the decoder to Talos's)."""

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
INLINE_PATCH = (
    "cluster:\n  inlineManifests:\n    - name: team-a\n      contents: |\n        apiVersion: v1\n"
    "        kind: Namespace\n        metadata:\n          name: team-a\n"
    "    - name: quota\n      contents: |\n        apiVersion: v1\n        kind: ResourceQuota\n"
    "        metadata: {name: q, namespace: team-a}\n        spec: {hard: {pods: '10'}}\n"
)


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


async def test_inline_manifests_roll_out_with_a_reboot_patch(world: World) -> None:
    env = world.env
    await world.patch_cluster([INLINE_PATCH, REBOOT_PATCH])

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 4

    await world.run_until(reported, what="4 machines reporting rebootPaths (none InvalidConfig)")
    for m in await world.machines():
        assert _cond(m, names.READY).get("reason") != "InvalidConfig", _cond(m, names.READY)
    since = len(env.talos.history.events)
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "roll"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": False}})

    async def finished() -> bool:
        return (await world.op("roll")).get("status", {}).get("phase") in ("Completed", "Failed", "Paused")

    await world.run_until(finished, what="the operation finished")
    op = await world.op("roll")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == {m: 1 for m in env.machine_names}
    for name in env.machine_names:
        manifests = env.node(name).running.v1alpha1["cluster"]["inlineManifests"]
        assert [(m["name"], m["contents"].splitlines()[1]) for m in manifests] == [
            ("team-a", "kind: Namespace"), ("quota", "kind: ResourceQuota")], name
