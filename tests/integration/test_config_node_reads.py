"""What a ``config`` rollout asks of the API servers per node (issue 32; docs/decisions.md#config-rollout): the Node
is read live once in a step and that copy serves the step (its Ready gate, cordon, drain, uncordon: see
ichord/kube/nodes.py), a drain with nothing to evict writes no drain annotation, and a reboot's ConfigRollout
condition is written once per reboot, not once per poll.

Counted from the simulators (the managed API server's access log, the management API's store), step by step of the
real cluster actor step, on 1 control plane and 2 workers running nothing to evict (only DaemonSet and mirror pods,
which a drain leaves alone), each reboot long enough for several polls.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.kube import crds
from ichord.operations.managed.drain import DRAIN_STARTED_ANNOTATION
from ichord.operations.outcome import next_delay
from ichord.pki.bundle import SecretsBundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.sim.talos.run import scaled
from tests.integration._config_world import REBOOT_PATCH, World, reboots, world_on

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = Timing().scaled(0.01)


@pytest.fixture
async def world(bundle: SecretsBundle) -> AsyncIterator[World]:
    # A reboot lasts several polls, even on a loaded machine where a step takes a tenth of a second or more.
    timings = dataclasses.replace(scaled(0.01), reboot_shutdown=0.6, reboot=0.6)
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=1, workers=2, timings=timings,
                              management_api="separate") as env:
        async for w in world_on(env, TIMING):
            yield w


async def test_a_step_reads_its_node_once_no_drain_annotation_and_one_rebooting_write_a_reboot(
        world: World) -> None:
    env = world.env
    paths = {f"/api/v1/nodes/{env.node(m).nodename}": m for m in env.machine_names}
    annotated: list[str] = []

    def listener(change: Any, rt: Any) -> None:
        meta = change.new.get("metadata") or {}
        if rt.plural == "nodes" and DRAIN_STARTED_ANNOTATION in (meta.get("annotations") or {}):
            annotated.append(meta.get("name", ""))

    env.kube.store.listeners.append(listener)
    rollout: dict[str, list[tuple[str, str, str]]] = {m: [] for m in env.machine_names}

    def written(change: Any, rt: Any) -> None:  # every ConfigRollout a TalosMachine was written with, in turn
        if rt.plural != "talosmachines":
            return
        name = change.new["metadata"]["name"]
        cond = next((c for c in (change.new.get("status") or {}).get("conditions") or []
                     if c["type"] == names.CONFIG_ROLLOUT), None)
        said = (cond["status"], cond["reason"], cond["message"]) if cond else None
        if said is not None and (not rollout[name] or rollout[name][-1] != said):
            rollout[name].append(said)

    env.management.store.listeners.append(written)
    await world.patch_cluster([REBOOT_PATCH])
    for _ in range(500):
        await world.step()
        if sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 3:
            break
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "reads"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": False, "maxUnavailable": 1}})
    log = env.kube.requests.entries
    most_reads: Counter[str] = Counter()  # per machine: the most GETs of its Node in one step
    patches: Counter[str] = Counter()
    under_way: dict[str, list[int]] = {}  # per machine: the steps from its first Node read to its last Node patch
    for index in range(2000):
        before = len(log)
        outcome = await world.step()
        step = log[before:]
        reads = Counter(paths[e.path] for e in step if e.verb == "get" and e.path in paths)
        for machine, n in reads.items():
            most_reads[machine] = max(most_reads[machine], n)
        patches.update(paths[e.path] for e in step if e.verb == "patch" and e.path in paths)
        for machine in {*reads, *(paths[e.path] for e in step if e.verb == "patch" and e.path in paths)}:
            under_way.setdefault(machine, []).append(index)
        if (await world.op("reads")).get("status", {}).get("phase") in ("Completed", "Failed", "Paused"):
            break
        await anyio.sleep(min(max(next_delay(outcome) or 0.01, 0.005), 0.1))
    assert (await world.op("reads"))["status"]["phase"] == "Completed"
    assert reboots(env) == dict.fromkeys(env.machine_names, 1)
    # Every machine was read in some step, never twice in one: Ready gate, cordon, drain and uncordon share the read.
    assert set(most_reads) == set(env.machine_names)
    assert all(n == 1 for n in most_reads.values()), dict(most_reads)
    # Its cordon and its uncordon, nothing else: no drain start written, nor removed, with nothing to evict.
    assert patches == dict.fromkeys(env.machine_names, 2), dict(patches)
    assert annotated == []
    # One Rebooting a reboot (the request's message), however many polls the reboot lasted, then RolledOut.
    workers = [m for m in env.machine_names if "-worker-" in m]
    polled = {m: max(under_way[m]) - min(under_way[m]) - 1 for m in workers}  # the steps between start and done
    assert all(n >= 2 for n in polled.values()), polled
    for machine, said in rollout.items():
        assert [(s, r) for s, r, _ in said] == [("True", "Rebooting"), ("False", "RolledOut")], (machine, said)
        assert said[0][2] == f"asked {machine} to reboot"
