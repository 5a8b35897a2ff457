"""A ca-rotation pass applies the workers a bounded few at a time, the control planes one by one and first; the bound
is maxUnavailable, the operation's, else the TalosCluster's, else the daemon's (issue 19).

Every ApplyConfiguration (dry run included) takes ``APPLY`` seconds on the simulated node, so the apply
intervals read from the simulator's history (``at`` is recorded when the apply ends) show what ran at
once."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import replace

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.api.max_unavailable import DEFAULT, MaxUnavailable
from ichord.kube import crds
from ichord.operations.outcome import Done
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import SettingsError, Timing
from ichord.sim.combined import SimEnvironment
from ichord.sim.talos.run import scaled
from tests.integration._ca_rotation_driver import TIMING, Driver, at, blocked_on
from tests.integration._ca_rotation_driver import driving as shared_driving

pytestmark = [pytest.mark.integration]
SCALE = 0.02
APPLY = 0.25  # seconds each ApplyConfiguration RPC takes on a node
Interval = tuple[str, float, float]


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


def environment(bundle: SecretsBundle, workers: int, apply: float = APPLY) -> SimEnvironment:
    return SimEnvironment(bundle=bundle, workers=workers, time_scale=SCALE,
                          timings=replace(scaled(SCALE), apply_duration=apply))


def driving(env: SimEnvironment, concurrency: int | str) -> contextlib.AbstractAsyncContextManager[Driver]:
    """A driver whose daemon default (--max-unavailable) is ``concurrency``."""
    return shared_driving(env, timing=replace(TIMING, max_unavailable=MaxUnavailable.parse(concurrency)))


def intervals(env: SimEnvironment, apply: float, role: str) -> list[Interval]:
    """(machine, start, end) of every real apply to a machine of ``role`` (``-cp-`` or ``-worker-``)."""
    return [(e["node"], e["at"] - apply, e["at"]) for e in env.talos.history.of("apply") if role in e["node"]]


def most_at_once(spans: list[Interval]) -> int:
    edges = sorted([(s, 1) for _, s, _ in spans] + [(e, -1) for _, _, e in spans])  # an end sorts before a start
    best = cur = 0
    for _, delta in edges:
        cur += delta
        best = max(best, cur)
    return best


@pytest.mark.anyio
async def test_workers_are_applied_concurrently_and_control_planes_one_by_one_first(bundle: SecretsBundle) -> None:
    async with environment(bundle, workers=4) as env, driving(env, concurrency=3) as driver:
        await driver.create()
        await driver.run(until=at("AwaitingCredentials"))  # Accepting applied and verified

        # Each machine took exactly one apply: nothing repeated across the steps of the pass.
        assert {m: len(env.applies(m)) for m in env.machine_names} == dict.fromkeys(env.machine_names, 1)
        cps, workers = intervals(env, APPLY, "-cp-"), intervals(env, APPLY, "-worker-")
        assert [name for name, _, _ in cps] == [m for m in env.machine_names if "-cp-" in m]  # in order
        assert most_at_once(cps) == 1, cps
        assert max(end for _, _, end in cps) <= min(start for _, start, _ in workers), (cps, workers)
        # Bounded: at most 3 of the 4 workers at once, and more than one did overlap.
        assert 2 <= most_at_once(workers) <= 3, workers
        # status.machines of the step that applied the workers keeps the machines' order: control planes (applied
        # in earlier steps, one kube-apiserver restart at a time), then workers.
        applied = next(s["status"]["machines"] for s in driver.snapshots
                       if any("-worker-" in m["name"] and m["message"] == "applied Accepting"
                              for m in s["status"].get("machines") or []))
        assert [m["name"] for m in applied] == env.machine_names
        assert all(m["message"] == ("applied Accepting" if "-worker-" in m["name"] else "runs Accepting")
                   for m in applied), applied


@pytest.mark.anyio
async def test_a_concurrency_of_one_applies_the_workers_one_by_one(bundle: SecretsBundle) -> None:
    apply = 0.1
    async with environment(bundle, workers=3, apply=apply) as env, driving(env, concurrency=1) as driver:
        await driver.create()
        await driver.run(until=at("AwaitingCredentials"))
        workers = intervals(env, apply, "-worker-")
        assert len(workers) == 3 and most_at_once(workers) == 1, workers


@pytest.mark.anyio
async def test_the_first_failing_worker_holds_the_stage_and_the_pass_resumes_without_repeats(
        bundle: SecretsBundle) -> None:
    async with environment(bundle, workers=4, apply=0.05) as env:
        names_ = env.machine_names
        failing = [m for m in names_ if "-worker-" in m][1::2]  # worker-2 and worker-4
        for m in failing:
            env.node(m).faults.apply_error = "injected: the machine refuses every configuration"
        async with driving(env, concurrency=4) as driver:
            await driver.create()
            await driver.run(until=blocked_on("refused the Accepting configuration"))
            op = await driver.get()
            assert op["status"]["phase"] == "Paused" and op["status"]["caRotation"]["stage"] == "Accepting"
            cond = find(op["status"]["conditions"], names.CA_ROTATION)
            assert cond is not None and f"machine {failing[0]} refused" in cond["message"], cond
            # Every worker was visited at once; the entries keep the machines' order whatever finished first.
            machines = op["status"]["machines"]
            assert [m["name"] for m in machines] == names_
            states = {m["name"]: m["state"] for m in machines}
            assert [m for m, s in states.items() if s == "ApplyFailed"] == failing, machines
            assert all(states[m] == "Accepting" for m in names_ if m not in failing), machines

            for m in failing:
                env.node(m).faults.apply_error = None
            await driver.run(until=at("AwaitingCredentials"))
            assert {m: len(env.applies(m)) for m in names_} == dict.fromkeys(names_, 1)


def _rpcs(env: SimEnvironment) -> dict[str, Counter[str]]:
    return {m: Counter(env.node(m).rpcs) for m in env.machine_names}


@pytest.mark.anyio
async def test_a_pass_costs_a_worker_three_talos_rpcs(bundle: SecretsBundle) -> None:
    """Issue 19's floor, counted by the Talos simulators per pass: a worker gets its dry run (which also tells
    whether it differs), its apply, one read with the stage's credentials (its Talos CA view), and the Version read
    the contract check makes once per connection before the first apply (docs/decisions.md#contract-match); a control
    plane the same plus its Kubernetes CA view, and the kube-apiserver container read before its apply (one restart at
    a time). Nothing is read again in the steps between, and the gates after a verified pass read no node.

    The managed cluster's admin kubeconfig is asked for once per stage and use (the verification, a gate, the
    client restarts), not once per step: the client is kept across steps (ManagedClients) and replaced when the
    stage changes, since the API server stops accepting the old CA's certificates at Dropping."""
    async with environment(bundle, workers=4, apply=0.02) as env, driving(env, concurrency=2) as driver:
        await driver.create()
        await driver.run(until=at("Accepting"))
        passes: dict[str, dict[str, Counter[str]]] = {}
        before = _rpcs(env)
        for stage, until in (("Accepting", "AwaitingCredentials"), ("Issuing", "Dropping"), ("Dropping", "Finalizing"),
                             ("Finalizing", "")):
            if stage == "Issuing":
                await driver.run(until=at("Issuing"))
                before = _rpcs(env)
            if until:
                await driver.run(until=at(until))
            else:
                assert isinstance(await driver.run(), Done)
            after = _rpcs(env)
            passes[stage] = {m: after[m] - before[m] for m in env.machine_names}
            before = after
        kubeconfigs = {stage: sum(c["Kubeconfig"] for c in counts.values()) for stage, counts in passes.items()}
        # One per stage: Issuing's verification and its kube-root-ca.crt gate share one; Finalizing's (the replaced
        # bundle's) serves every client restart.
        assert kubeconfigs == {"Accepting": 1, "Issuing": 1, "Dropping": 1, "Finalizing": 1}, passes
        assert not [s for s in driver.snapshots if "Unauthorized" in str(s.get("status"))], "a kept client refused"
        for stage, counts in passes.items():
            if stage == "Finalizing":
                continue
            for m, c in counts.items():
                if "-worker-" in m:
                    assert c == Counter({"ApplyConfiguration(dry run)": 1, "ApplyConfiguration": 1, "Get": 1,
                                         "Version": 1}), (stage, m, c)
                else:
                    core = {k: c[k] for k in ("ApplyConfiguration(dry run)", "ApplyConfiguration", "Get", "Version")}
                    assert core == {"ApplyConfiguration(dry run)": 1, "ApplyConfiguration": 1, "Get": 2,
                                    "Version": 1}, (stage, m, c)
                    assert c["List"] >= 1 and set(c) <= {*core, "List", "Kubeconfig"}, (stage, m, c)


async def _most_workers_at_once(bundle: SecretsBundle, *, cluster: int | str | None, operation: int | str | None,
                                daemon: int | str = 1) -> tuple[int, dict[str, object]]:
    """Run Accepting over 3 control planes + 12 workers with maxUnavailable set where named; the most worker applies
    in flight at once (from the simulators' history) and the plan's workerBound."""
    apply = 0.3
    async with environment(bundle, workers=12, apply=apply) as env, driving(env, concurrency=daemon) as driver:
        if cluster is not None:
            await crds.clusters(driver.kube).patch(env.namespace, env.cluster_name,
                                                   {"spec": {"maxUnavailable": cluster}})
        await driver.create()
        if operation is not None:
            await crds.operations(driver.kube).patch(env.namespace, driver.op_name,
                                                     {"spec": {"maxUnavailable": operation}})
        await driver.run(until=at("AwaitingCredentials"))
        assert {m: len(env.applies(m)) for m in env.machine_names} == dict.fromkeys(env.machine_names, 1)
        cps, workers = intervals(env, apply, "-cp-"), intervals(env, apply, "-worker-")
        assert len(workers) == 12 and most_at_once(cps) == 1, cps
        return most_at_once(workers), (await driver.get())["status"]["plan"]["workerBound"]


@pytest.mark.anyio
async def test_the_clusters_percentage_bounds_the_workers_in_flight(bundle: SecretsBundle) -> None:
    most, plan = await _most_workers_at_once(bundle, cluster="50%", operation=None)
    assert most == 6, most  # 50% of 12 workers: never more than 6 in flight, and 6 reached
    assert plan == {"atOnce": 6, "maxUnavailable": "50%", "source": "cluster", "workers": 12,
                    "message": "workers 6 at a time (maxUnavailable 50% of 12 workers, the TalosCluster's)"}


@pytest.mark.anyio
async def test_the_operations_value_overrides_the_clusters(bundle: SecretsBundle) -> None:
    most, plan = await _most_workers_at_once(bundle, cluster="50%", operation=2, daemon="100%")
    assert most == 2, most
    assert (plan["atOnce"], plan["source"]) == (2, "operation"), plan


@pytest.mark.anyio
async def test_an_invalid_value_holds_the_operation_before_anything_is_applied(bundle: SecretsBundle) -> None:
    """Only past the CRD's validation (an older CRD): the cluster's value is written straight into the simulator's
    store, the operation is Blocked with a message saying what to write, and no node is touched."""
    async with environment(bundle, workers=2, apply=0.05) as env, driving(env, concurrency=1) as driver:
        store = env.management.store
        resource = store.resolve(names.GROUP, names.VERSION, "talosclusters")
        store.objects[resource.key][(env.namespace, env.cluster_name)]["spec"]["maxUnavailable"] = "0%"
        await driver.create()
        await driver.run(until=blocked_on("maxUnavailable"), max_steps=20)
        op = await driver.get()
        cond = find(op["status"]["conditions"], names.CA_ROTATION)
        assert op["status"]["phase"] == "Paused" and cond is not None and cond["reason"] == "Blocked", op["status"]
        assert "the TalosCluster's spec.maxUnavailable must be a whole number of at least 1 or a percentage" in \
            cond["message"] and "'0%'" in cond["message"], cond
        assert env.talos.history.of("apply") == [] and "plan" not in op["status"]


def test_the_daemon_default_is_a_bound_that_no_time_scale_changes() -> None:
    assert Timing().max_unavailable == DEFAULT == MaxUnavailable(percent=25)
    assert Timing().scaled(0.01).max_unavailable == DEFAULT
    assert Timing.from_env({"ICHORD_TIME_SCALE": "0.01"}).max_unavailable == DEFAULT
    assert Timing.from_env({"ICHORD_MAX_UNAVAILABLE": "10%"}).max_unavailable == MaxUnavailable(percent=10)
    assert Timing.from_env({"ICHORD_MAX_UNAVAILABLE": "3"}).max_unavailable == MaxUnavailable(count=3)
    # The deprecated spelling still sets a count, and ICHORD_MAX_UNAVAILABLE wins over it.
    assert Timing.from_env({"ICHORD_CA_WORKER_APPLY_CONCURRENCY": "2"}).max_unavailable == MaxUnavailable(count=2)
    assert Timing.from_env({"ICHORD_CA_WORKER_APPLY_CONCURRENCY": "2", "ICHORD_MAX_UNAVAILABLE": "5"}
                           ).max_unavailable == MaxUnavailable(count=5)
    for var in ("ICHORD_MAX_UNAVAILABLE", "ICHORD_CA_WORKER_APPLY_CONCURRENCY"):
        for bad in ("0", "two", "-1", "0%", "101%"):
            with pytest.raises(SettingsError, match=f"{var} must be a whole number of at least 1 or a percentage"):
                Timing.from_env({var: bad})
