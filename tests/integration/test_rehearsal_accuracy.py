"""The rehearsal's predicted duration against the real run's on one world (issue 31, docs/architecture.md#rehearsal).

The "live" cluster is a SimEnvironment whose nodes have durations of their own (``SimCluster.retime``): reboots
that differ per node, one slow node (its kube-apiserver restart slow too), an apply latency. Its clock is
compressed (``SCALE``): the simulated delays and the daemon's ``Timing`` are that fraction of a real cluster's, so
the world's wall seconds are its seconds, and the rehearsal is given them as a user would give a real cluster's:
each node's reboot and kube-apiserver restart from a past operation's ``status.progress.observed`` (history), the
apply latency with ``--duration``, the daemon's waits by the clock from its settings (``Timing``).

What no Talos or Kubernetes step covers is the daemon's own time around each node's step (its writes, health
gates, Node Ready, polls): on this machine up to about a second of the world's time per node, not negligible next
to steps of seconds. The model has a kind for it (``overhead``), measured here as a user would learn it: a
previous run of the same operation on the same world is timed, and the overhead is the value for which the model
gives that duration (with that run's reboots and restarts). The next run has other reboot times and another slow
node; its prediction must be within ±15 % of its real duration, with the same reboots and kube-apiserver
restarts, event by event, and the same stops (none).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.rehearsal.model import OVERHEAD, Durations, predict
from ichord.rehearsal.play import rehearse
from ichord.rehearsal.report import Report
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import REBOOT_PATCH, World, world_on
from tests.integration.test_rehearsal import Writes, _op

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
#: The world's clock: a fiftieth of a real cluster's (a 60 s reboot lasts 1.2 s).
SCALE = 0.02
TIMING = Timing().scaled(SCALE)
#: Another reboot-class change, for the rollout after the first.
SECOND_PATCH = "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: nf_conntrack\n"
#: Each ApplyConfiguration call's latency; a step's apply is two calls (the dry run and the write).
APPLY_LATENCY = 0.5
#: A kube-apiserver restart: its static pod replaced, then /readyz ok.
APISERVER_RESTART = 2.0
SLOW = 6.0
TOLERANCE = 0.15
#: What makes the operation's change wait before its run (the first, the second).
Prepare = Callable[[int], Awaitable[None]]


@dataclass(frozen=True)
class Measured:
    predicted: float
    real: float
    overhead: float

    @property
    def error(self) -> float:
        return (self.predicted - self.real) / self.real


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


async def _rehearse(writes: Writes, op: Obj, *durations: str) -> Report:
    """The rehearsal as the command runs it, told the live daemon's settings (its waits by the clock)."""
    env = writes.env
    async with await from_kubeconfig(writes.kubeconfig, timing=TIMING) as kube:
        return await rehearse(kube, env.namespace, env.cluster_name, op, Durations.parse(list(durations)),
                              settings=TIMING)


def _reboots(machines: Sequence[str], slow: str, shift: int) -> dict[str, float]:
    """Reboots of 2 to 3 s varied per node (``shift`` varies them again), ``slow`` SLOW."""
    return {m: SLOW if m == slow else 2.0 + 0.5 * ((i + shift) % 3) for i, m in enumerate(machines)}


def _restarts(machines: Sequence[str], slow: str) -> dict[str, float]:
    """Each control plane's kube-apiserver restart: the slow node's twice as long."""
    return {m: APISERVER_RESTART * (2 if m == slow else 1) for m in machines if "-cp-" in m}


def _retime(env: SimEnvironment, reboots: dict[str, float], restarts: dict[str, float]) -> None:
    for node, seconds in reboots.items():
        half = restarts.get(node, APISERVER_RESTART) / 2  # the static pod replaced, then /readyz ok
        env.talos.retime(node, reboot=seconds, apply_duration=APPLY_LATENCY, apiserver_restart_delay=half,
                         apiserver_ready_delay=half)


async def _record_history(world: World, name: str, reboots: dict[str, float], restarts: dict[str, float]) -> None:
    """A finished past operation whose status.progress.observed holds each node's reboot and kube-apiserver restart
    (operations/progress.py's record, one entry per node and kind): what the cluster's history tells the rehearsal."""
    env = world.env
    observed = [*({"node": m, "step": "reboot", "seconds": s} for m, s in reboots.items()),
                *({"node": m, "step": "apiserver_restart", "seconds": s} for m, s in restarts.items())]
    await crds.operations(world.kube).create(env.namespace, {**_op(env.cluster_name, "config", paused=True),
                                                            "metadata": {"name": name}})
    await crds.operations(world.kube).patch_status(env.namespace, name, {"status": {
        "phase": names.Phase.COMPLETED, "progress": {"done": len(observed), "total": len(observed),
                                                     "steps": f"{len(observed)}/{len(observed)}",
                                                     "observed": observed}}})


async def _waiting(world: World, patches: list[str]) -> None:
    await world.patch_cluster(patches)
    count = len(world.env.machine_names)

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == count

    await world.run_until(reported, what="every machine reports the reboot it waits for")


async def _real_run(world: World, name: str, op: Obj) -> tuple[float, Obj, list[tuple[str, str]]]:
    """The operation run by the real cluster actor on the world: its wall duration (creation to the step that
    sees it finished), the object, and its reboots and kube-apiserver restarts in order. Where a rotation hands
    off, the person acts at once (``ichord cluster credentials --acknowledge`` sets this annotation); the rehearsal
    says where a person acts and counts no time for it."""
    env = world.env
    since = len(env.talos.history.events)
    started = time.monotonic()
    await crds.operations(world.kube).create(env.namespace, {**op, "metadata": {"name": name}})

    async def finished() -> bool:
        o = await world.op(name)
        status = o.get("status") or {}
        token = handoff_token((status.get("caRotation") or {}).get("certificates") or [])
        annotations = o["metadata"].get("annotations") or {}
        if status.get("stage") == Stage.AWAITING_CREDENTIALS.value and token and \
                annotations.get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
            await crds.operations(world.kube).patch(env.namespace, name, {"metadata": {"annotations": {
                names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
        return status.get("phase") in (names.Phase.COMPLETED, names.Phase.FAILED)

    await world.run_until(finished, steps=20000, what=f"{name} finished")
    wall = time.monotonic() - started
    seen = [(e["kind"], e["node"]) for e in env.talos.history.events[since:]
            if e["kind"] in ("reboot", "apiserver_restart")]
    return wall, await world.op(name), seen


def _fit_overhead(events: Sequence[Any], durations: Durations, real: float) -> float:
    """The overhead for which the model gives ``real`` on ``events`` (the prediction grows with it)."""
    low, high = 0.0, real
    for _ in range(40):
        mid = (low + high) / 2
        total = predict(events, replace(durations, ranges={**durations.ranges, OVERHEAD: (mid, mid)}))[1][0]
        low, high = (mid, high) if total < real else (low, mid)
    return (low + high) / 2


async def _predicted_and_real(world: World, op: Obj, tmp: Path,
                              prepare: Prepare) -> tuple[Report, Measured, list[tuple[str, str]]]:
    """The previous run, then the next with other reboot times and another slow node: its rehearsal, the overhead
    the previous run's duration measures on it, and its real run."""
    env = world.env
    machines = env.machine_names
    # A rollout's apply is a dry run and the write, a rotation's the write alone: each call has the latency.
    calls = 2 if op["spec"]["kind"] == "config" else 1
    given = ["stage=0", "drain=0", f"apply={calls * APPLY_LATENCY}"]

    first = _reboots(machines, slow=machines[1], shift=0)
    first_restarts = _restarts(machines, slow=machines[1])
    _retime(env, first, first_restarts)
    await prepare(1)
    wall_1, done, _ = await _real_run(world, "first", op)
    assert done["status"]["phase"] == names.Phase.COMPLETED

    second = _reboots(machines, slow=machines[-1], shift=1)
    restarts = _restarts(machines, slow=machines[-1])
    _retime(env, second, restarts)
    # The history is of the nodes as they are now (the first run's own status.progress.observed goes: its times
    # include the overhead and, for workers rolled together, are the time between completions).
    await crds.operations(world.kube).delete(env.namespace, "first")
    await _record_history(world, "history", second, restarts)
    await prepare(2)
    writes = Writes(env, tmp)
    report = await _rehearse(writes, op, *given)
    writes.assert_none()
    assert report.exit_code == 0, report.text()
    assert report.durations.source("reboot") == f"history of {len(machines)} step(s)"
    assert report.durations.source("apiserver_restart") == f"history of {len(restarts)} step(s)"
    assert report.durations.of("reboot", machines[-1]) == (SLOW, SLOW)
    # The overhead: the value for which the model gives the first run's duration on this same operation with the
    # first run's reboots. The second's prediction is then what `--duration overhead=X` makes the command print
    # (play.py prices the twin's events with predict(); the twin's play does not depend on the durations).
    then = replace(report.durations, per_node={**{(m, "reboot"): (r, r) for m, r in first.items()},
                                               **{(m, "apiserver_restart"): (r, r) for m, r in first_restarts.items()}})
    overhead = _fit_overhead(report.recording.events, then, wall_1)
    now = replace(report.durations, ranges={**report.durations.ranges, OVERHEAD: (overhead, overhead)},
                  given=report.durations.given | {OVERHEAD})
    low, high = predict(report.recording.events, now)[1]
    assert low == pytest.approx(high)  # every duration is a node's own, given or the daemon's: one value

    wall_2, done, real = await _real_run(world, "second", op)
    assert done["status"]["phase"] == names.Phase.COMPLETED
    assert report.recording.stops == []
    measured = Measured(low, wall_2, overhead)
    print(f"\n{(op['spec'].get('caRotation') or {}).get('targets') or op['spec']['kind']} on {len(machines)} nodes: "
          f"predicted {measured.predicted:.2f} s, real {measured.real:.2f} s ({measured.error:+.1%}); overhead "
          f"{overhead:.3f} s per node step (first run {wall_1:.2f} s)")
    return report, measured, real


async def _nothing(_run: int) -> None:
    """A rotation needs nothing waiting: it can run again once the last one completed."""


@pytest.fixture(params=[(3, 1), (20, 5)], ids=["3+3", "3+20"])
async def rollout_world(request: pytest.FixtureRequest, bundle: SecretsBundle) -> AsyncIterator[tuple[World, int]]:
    workers, max_unavailable = request.param
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, control_planes=3, workers=workers,
                              pod_start_delay=2.0) as env:
        async for world in world_on(env, TIMING):
            yield world, max_unavailable


async def test_a_config_rollouts_predicted_duration_is_within_15_percent_of_the_real_run(
        rollout_world: tuple[World, int], tmp_path: Path) -> None:
    world, max_unavailable = rollout_world
    machines = world.env.machine_names

    async def waiting(run: int) -> None:
        await _waiting(world, [REBOOT_PATCH, SECOND_PATCH][:run])

    op = _op(world.env.cluster_name, "config", maxUnavailable=max_unavailable)
    report, measured, real = await _predicted_and_real(world, op, tmp_path, waiting)
    assert abs(measured.error) <= TOLERANCE, measured
    # The same reboots: the control planes one at a time in the same order; the workers the same ones, each once
    # (several at a time, the order in which they come back is the durations', not the plan's).
    control_planes = [m for m in machines if "-cp-" in m]
    assert report.disruptions()[:3] == real[:3] == [("reboot", m) for m in control_planes]
    assert sorted(report.disruptions()) == sorted(real) == sorted(("reboot", m) for m in machines)
    if max_unavailable == 1:
        assert report.disruptions() == real


@pytest.fixture
async def world(bundle: SecretsBundle) -> AsyncIterator[World]:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, control_planes=3, workers=3, pod_start_delay=2.0,
                              management_api="separate") as env:  # the test's client outlives a Kubernetes CA
        async for w in world_on(env, TIMING):
            yield w


@pytest.mark.parametrize("targets", [None, ["etcd"], ["kubernetes-aggregator"]], ids=["default", "etcd", "aggregator"])
async def test_a_ca_rotations_predicted_duration_is_within_15_percent_of_the_real_run(
        world: World, targets: list[str] | None, tmp_path: Path) -> None:
    spec = {"caRotation": {"targets": targets}} if targets else {}
    op = _op(world.env.cluster_name, "ca-rotation", **spec)
    report, measured, real = await _predicted_and_real(world, op, tmp_path, _nothing)
    assert abs(measured.error) <= TOLERANCE, measured
    assert report.disruptions() == real  # every reboot and kube-apiserver restart, in order
    assert real  # it did restart or reboot something
