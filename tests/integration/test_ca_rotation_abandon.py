"""Deleting a ca-rotation under way (docs/decisions.md#abandon-or-hold): abandoned before its point of no return
(rotation.yaml gone, lock free, finalizer gone, a Warning on the cluster), held past it (DeletionHeld, runs on
to Done, then gone). Against the simulators, a new context per step."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.api import names
from ichord.api.abandonable import rotation_abandonable
from ichord.api.conditions import find
from ichord.api.views import MachineView
from ichord.kube import crds
from ichord.kube.errors import NotFound
from ichord.machines.reconciler import reconcile_machine
from ichord.operations.ca_rotation import abandon as abandon_module
from ichord.operations.lock import lock_holder
from ichord.operations.outcome import Done
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from tests.integration._ca_rotation_driver import Crash, Driver, at, live_bundle, secret_data, stages_seen

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def _events(driver: Driver, reason: str) -> list[dict[str, Any]]:
    await driver.recorder.drain()
    store = driver.env.management.store
    return [e for e in store.list(store.resolve("", "v1", "events"), driver.env.namespace)[0]
            if e.get("reason") == reason]


async def _gone(driver: Driver) -> bool:
    try:
        await driver.get()
    except NotFound:
        return True
    return False


async def test_a_paused_rotation_deleted_in_accepting_is_abandoned_in_one_step(
        env: SimEnvironment, driver: Driver) -> None:
    old = live_bundle(env)
    await driver.create()
    await driver.run(until=at("Accepting"))
    await crds.operations(driver.kube).patch(env.namespace, driver.op_name, {"spec": {"paused": True}})
    await driver.step()
    assert (await driver.get())["status"]["phase"] == "Paused"
    assert names.ROTATION_KEY in secret_data(env)
    await crds.operations(driver.kube).delete(env.namespace, driver.op_name)

    assert isinstance(await driver.step(), Done)
    assert await _gone(driver)
    assert names.ROTATION_KEY not in secret_data(env)
    assert ca_fingerprint(live_bundle(env).os) == ca_fingerprint(old.os)  # secrets.yaml untouched
    assert await lock_holder(driver.kube, env.namespace, env.cluster_name) is None
    store = env.kube.store
    nodes = store.list(store.resolve("", "v1", "nodes"), None)[0]
    assert not [n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")]
    [abandoned] = await _events(driver, names.EventReason.OPERATION_ABANDONED)
    assert abandoned["involvedObject"]["kind"] == "TalosCluster"
    assert "Accepting" in abandoned["message"] and "config" in abandoned["message"]
    assert "rotation.yaml removed" in abandoned["message"]


async def test_deleted_in_issuing_of_the_talos_ca_alone_is_abandoned(env: SimEnvironment, driver: Driver) -> None:
    await driver.create(targets=["talos"])
    await driver.run(until=at("Issuing"))
    await crds.operations(driver.kube).delete(env.namespace, driver.op_name)
    assert isinstance(await driver.step(), Done)
    assert await _gone(driver)
    assert names.ROTATION_KEY not in secret_data(env)
    assert await lock_holder(driver.kube, env.namespace, env.cluster_name) is None


@pytest.mark.parametrize("stage", ["Issuing", "Dropping"])
async def test_deleted_past_the_point_of_no_return_is_held_and_runs_on_to_done(
        env: SimEnvironment, driver: Driver, stage: str) -> None:
    await driver.create()  # talos and kubernetes: Issuing gives the pods the new Kubernetes CA alone
    await driver.run(until=at(stage))
    await crds.operations(driver.kube).delete(env.namespace, driver.op_name)
    await driver.step()
    op = await driver.get()
    held = find(op["status"]["conditions"], names.DELETION_HELD)
    assert held is not None and (held["status"], held["reason"]) == ("True", "PastPointOfNoReturn")
    assert stage in held["message"]
    assert names.CA_ROTATION_FINALIZER in op["metadata"]["finalizers"]
    assert names.ROTATION_KEY in secret_data(env)  # never abandoned half-way

    assert isinstance(await driver.run(), Done)
    assert await _gone(driver)
    assert stages_seen(driver.snapshots)[-2:] == ["Dropping", "Finalizing"]
    assert names.ROTATION_KEY not in secret_data(env)
    assert len(await _events(driver, names.EventReason.DELETION_HELD)) == 1  # said once, not per step
    assert not await _events(driver, names.EventReason.OPERATION_ABANDONED)


@pytest.mark.parametrize("point", ["ca-rotation.abandon.remove.before", "ca-rotation.abandon.remove.after",
                                   "ca-rotation.abandon.letgo.before"])
async def test_killed_at_each_abandon_failpoint_the_abandon_finishes_on_the_next_step(
        point: str, env: SimEnvironment, driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    await driver.create()
    await driver.run(until=at("AwaitingCredentials"), max_steps=400)
    driver.acknowledge = False

    def crash(reached: str) -> None:
        if reached == point:
            monkeypatch.setattr(abandon_module, "failpoint", lambda _p: None)
            raise Crash(reached)

    monkeypatch.setattr(abandon_module, "failpoint", crash)
    await crds.operations(driver.kube).delete(env.namespace, driver.op_name)
    with pytest.raises(Crash):
        await driver.step()
    assert (names.ROTATION_KEY in secret_data(env)) == (point == "ca-rotation.abandon.remove.before")
    assert not await _gone(driver)  # killed before the finalizer went
    assert isinstance(await driver.step(), Done)
    assert await _gone(driver)
    assert await lock_holder(driver.kube, env.namespace, env.cluster_name) is None


async def test_after_an_abandon_the_machine_reconciler_reports_the_leftover_cas_on_control_planes(
        env: SimEnvironment, driver: Driver) -> None:
    await driver.create()
    await driver.run(until=at("AwaitingCredentials"))
    driver.acknowledge = False
    await crds.operations(driver.kube).delete(env.namespace, driver.op_name)
    assert isinstance(await driver.step(), Done)

    bundle = live_bundle(env)  # the old CAs: the Secret was never replaced
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=1, rpc_timeout=5) as talos:
        for name in env.machine_names:
            role = env.machine_specs[name]["role"]
            spec = {"clusterRef": {"name": env.cluster_name}, "role": role, "address": env.endpoints[name],
                    "approved": True}
            machine = MachineView.of({"metadata": {"namespace": env.namespace, "name": name}, "spec": spec})
            applies = len(env.applies(name))
            result = await reconcile_machine(talos, bundle, env.cluster_inputs(), machine, held_by=None,
                                             retry_after=30.0, resync_after=300.0)
            if role == "controlplane":
                # Reverting the new Kubernetes CA restarts kube-apiserver: reported, never applied to every
                # control plane at once (a config operation rolls it one at a time).
                assert (result.ready.status, result.ready.reason) == ("False", "APIServerRestartRequired"), name
                assert any("KubeAPIServerCAConfig" in p for p in result.fields["apiServerRestartPaths"])
                assert len(env.applies(name)) == applies and not result.applied
            else:
                assert result.ready.reason == "Applied"  # a worker runs no kube-apiserver


CASES = [(targets, stage) for targets, stages in (
    (["talos"], ["Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing"]),
    (["kubernetes-aggregator"], ["Accepting", "Issuing", "Dropping"]),
    (["talos", "kubernetes", "kubernetes-aggregator"], ["AwaitingCredentials", "Issuing", "Finalizing"]),
) for stage in stages]


@pytest.mark.parametrize(("targets", "stage"), CASES, ids=[f"{'+'.join(t)}-{s}" for t, s in CASES])
async def test_deleted_in_every_stage_is_abandoned_or_held_never_half(
        env: SimEnvironment, driver: Driver, targets: list[str], stage: str) -> None:
    await driver.create(targets=targets)
    await driver.run(until=at(stage), max_steps=800)
    driver.acknowledge = True
    await crds.operations(driver.kube).delete(env.namespace, driver.op_name)
    await driver.step()
    if rotation_abandonable(stage, targets):
        assert await _gone(driver)
        assert names.ROTATION_KEY not in secret_data(env)
        assert await lock_holder(driver.kube, env.namespace, env.cluster_name) is None
        return
    op = await driver.get()
    held = find(op["status"]["conditions"], names.DELETION_HELD)
    assert held is not None and held["status"] == "True"
    assert isinstance(await driver.run(max_steps=800), Done)
    assert await _gone(driver)
    assert set(secret_data(env)) == {names.SECRETS_KEY}  # completed: the Secret replaced, rotation.yaml gone
