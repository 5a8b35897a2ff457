"""The ca-rotation state machine on the simulators (3 control planes + 1 worker), step by step.

Each step gets a fresh context and re-reads everything, as after a restart; the checks are the
invariants of docs/decisions.md#invariants for what this executor covers (talos + kubernetes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.operations.lock import lock_holder
from ichord.operations.outcome import Blocked, Done
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import Target
from ichord.render.config import MachineConfig
from ichord.render.generate import render
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from tests.integration._ca_rotation_driver import (
    FLANNEL_CLIENTS,
    Driver,
    add_clients,
    at,
    live_bundle,
    live_rotation,
    secret_data,
    stages_seen,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
SCALE = 0.02


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE) as e:
        add_clients(e)
        yield e


async def running(env: SimEnvironment, dial: DialBundle, machine: str) -> MachineConfig:
    async with TalosClient(dial, dial_timeout=2, rpc_timeout=5) as c:
        return MachineConfig.parse(await c.machine_config(env.endpoints[machine]))


def cert(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in status["caRotation"]["certificates"] if c["name"] == name)


async def test_a_default_rotation_runs_from_start_to_done(env: SimEnvironment, driver: Driver,
                                                          bundle: SecretsBundle) -> None:
    await driver.create()
    outcome = await driver.run()
    assert isinstance(outcome, Done)

    # The stage sequence, only forward, and what issues / is accepted at each stage.
    assert stages_seen(driver.snapshots) == ["Accepting", "AwaitingCredentials", "Issuing", "Dropping",
                                             "Finalizing", "Done"]
    new = live_bundle(env)
    old_fp = {"talos": ca_fingerprint(bundle.os), "kubernetes": ca_fingerprint(bundle.k8s)}
    new_fp = {"talos": ca_fingerprint(new.os), "kubernetes": ca_fingerprint(new.k8s)}
    assert old_fp["talos"] != new_fp["talos"] and old_fp["kubernetes"] != new_fp["kubernetes"]
    by_stage = {s["status"]["caRotation"]["stage"]: s["status"] for s in driver.snapshots
                if (s.get("status") or {}).get("caRotation", {}).get("stage")}
    for name in ("talos", "kubernetes"):
        assert cert(by_stage["Accepting"], name) == {"name": name, "previous": old_fp[name], "next": new_fp[name],
                                                     "issuing": old_fp[name],
                                                     "accepted": [old_fp[name], new_fp[name]]}
        assert cert(by_stage["Issuing"], name)["issuing"] == new_fp[name]
        assert cert(by_stage["Issuing"], name)["accepted"] == [new_fp[name], old_fp[name]]
        assert cert(by_stage["Dropping"], name)["accepted"] == [new_fp[name]]

    # rotation.yaml held the new CAs before any node was told anything; one apply per machine per pass.
    assert driver.applies and all(saved for _, saved in driver.applies)
    for machine in env.machine_names:
        assert len(env.applies(machine)) == 3, machine
    # Control planes first in every pass.
    by_address = {env.node(m).ip: m for m in env.machine_names}
    first_pass = [by_address[e.rsplit(":", 1)[0] if e.count(":") == 1 else e] for e, _ in driver.applies[:4]]
    assert first_pass == sorted(first_pass, key=lambda m: ("worker" in m, m)), first_pass

    # The bundle: replaced in place, rotation.yaml gone, cluster ID/secret and etcd CA unchanged.
    assert names.ROTATION_KEY not in secret_data(env)
    assert (new.cluster_id, new.cluster_secret) == (bundle.cluster_id, bundle.cluster_secret)
    assert ca_fingerprint(new.etcd) == ca_fingerprint(bundle.etcd)
    # No drift: every node runs exactly what the replaced bundle renders, and answers its plain dial.
    for machine in env.machine_names:
        want = render(new, env.cluster_inputs(), env.machine_inputs(machine))
        assert (await running(env, DialBundle.from_bundle(new), machine)).plain() == want.plain(), machine

    # Status at the end, the cluster's conditions, the lock and the finalizer.
    final = driver.snapshots[-1]
    assert final["status"]["phase"] == "Completed"
    # status.progress counted every step, never backwards, and ends with no ETA (operations/progress.py): the
    # planned stages and, in each pass that restarts it, every control plane's kube-apiserver restart.
    stages = len(final["status"]["plan"]["stages"])
    control_planes = sum(1 for m in env.machine_names if "-cp-" in m)
    counted = [s["status"]["progress"]["done"] for s in driver.snapshots if (s.get("status") or {}).get("progress")]
    total = final["status"]["progress"]["total"]
    assert counted == sorted(counted) and counted[-1] == total, (counted, total)
    assert total > stages and (total - stages) % control_planes == 0, (total, stages)
    assert final["status"]["progress"]["steps"] == f"{total}/{total}" and "eta" not in final["status"]["progress"]
    ca_cond = find(final["status"]["conditions"], names.CA_ROTATION)
    assert ca_cond is not None and (ca_cond["status"], ca_cond["reason"]) == ("True", "Rotated"), ca_cond
    assert names.CA_ROTATION_FINALIZER not in (final["metadata"].get("finalizers") or [])
    cluster = await crds.clusters(driver.kube).get(env.namespace, env.cluster_name)
    stale = find(cluster["status"]["conditions"], names.BUNDLE_BACKUP_STALE)
    assert stale is not None and (stale["status"], stale["reason"]) == ("True", "CARotated")
    assert f"ichord cluster bundle-export {env.cluster_name}" in stale["message"]
    clients_cond = find(cluster["status"]["conditions"], names.CA_CLIENTS_NOT_RESTARTED)
    assert clients_cond is not None and clients_cond["status"] == "False"
    assert await lock_holder(driver.kube, env.namespace, env.cluster_name) is None

    # Every client was restarted once, with the operation's UID on its template.
    uid = final["metadata"]["uid"]
    for plural, name in FLANNEL_CLIENTS:
        obj = env.kube.store.get(env.kube.store.resolve("apps", "v1", plural), "kube-system", name)
        ann = obj["spec"]["template"]["metadata"]["annotations"]
        assert ann[names.CA_ROTATION_TEMPLATE_ANNOTATION] == uid
        assert names.RESTARTED_AT_ANNOTATION in ann
    # The trust seam got the new Kubernetes CA certificate (never a key).
    assert driver.trusted and set(driver.trusted) == {new.k8s.cert_pem}


async def test_paused_at_creation_writes_the_plan_only(env: SimEnvironment, driver: Driver) -> None:
    before = secret_data(env)
    await driver.create(paused=True)
    assert isinstance(await driver.step(), Done)
    op = await driver.get()
    plan = op["status"]["plan"]
    assert plan["targets"] == ["talos", "kubernetes"]
    assert plan["stages"] == ["Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing"]
    assert [m["role"] for m in plan["machines"]] == ["controlplane"] * 3 + ["worker"]
    assert [m["order"] for m in plan["machines"]] == [1, 2, 3, 4]
    assert plan["kubernetesAPIUnavailable"] is False
    assert "caRotation" not in op["status"] and op["status"]["phase"] == "Pending"
    assert secret_data(env) == before and not op["metadata"].get("finalizers")
    assert await lock_holder(driver.kube, env.namespace, env.cluster_name) is None
    # Unpausing starts it.
    await crds.operations(driver.kube).patch(env.namespace, driver.op_name, {"spec": {"paused": False}})
    await driver.run(until=lambda o: (o.get("status") or {}).get("caRotation", {}).get("stage") == "Accepting")
    assert live_rotation(env) is not None


async def test_a_machine_down_blocks_the_start_and_writes_nothing_then_it_starts(
        env: SimEnvironment, driver: Driver) -> None:
    before = secret_data(env)
    await env.set_unreachable(env.machine_names[1])
    await driver.create()
    outcome = await driver.step()
    assert isinstance(outcome, Blocked)
    op = await driver.get()
    cond = find(op["status"]["conditions"], names.CA_ROTATION)
    assert op["status"]["phase"] == "Paused"
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Blocked")
    assert env.machine_names[1] in cond["message"]
    assert secret_data(env) == before and "caRotation" not in op["status"]
    await env.set_unreachable(env.machine_names[1], False)
    await driver.run(until=lambda o: (o.get("status") or {}).get("caRotation", {}).get("stage") == "Accepting")
    assert live_rotation(env) is not None


async def test_killed_after_two_applies_in_each_pass_resumes_with_no_apply_repeated(
        env: SimEnvironment, driver: Driver) -> None:
    await driver.create()
    for stage in ("Accepting", "Issuing", "Dropping"):
        await driver.run(until=at(stage))
        driver.crash_after_applies = len(driver.applies) + 2
    assert isinstance(await driver.run(), Done)
    for machine in env.machine_names:
        assert len(env.applies(machine)) == 3, machine


async def test_an_adopted_rotation_yaml_is_used_not_replaced(env: SimEnvironment, driver: Driver) -> None:
    from ichord.operations.ca_rotation.bundle_secret import save_rotation

    saved = await save_rotation(driver.kube, env.namespace, env.secret_name, (Target.TALOS, Target.KUBERNETES))
    assert not saved.adopted
    await driver.create()
    await driver.run(until=lambda o: (o.get("status") or {}).get("caRotation", {}).get("stage") == "Accepting")
    rotation = live_rotation(env)
    assert rotation is not None and rotation.fingerprints() == saved.rotation.fingerprints()
    op = await driver.get()
    assert cert(op["status"], "talos")["next"] == ca_fingerprint(saved.rotation.new[Target.TALOS])


async def test_an_early_acknowledgement_is_ignored(env: SimEnvironment, driver: Driver) -> None:
    driver.acknowledge = False
    await driver.create()
    await driver.run(until=lambda o: (o.get("status") or {}).get("caRotation", {}).get("stage") == "Accepting")
    op = await driver.get()
    from ichord.operations.ca_rotation.plan import handoff_token

    token = handoff_token(op["status"]["caRotation"]["certificates"])
    await crds.operations(driver.kube).patch(env.namespace, driver.op_name, {"metadata": {
        "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
    await driver.run(until=lambda o: (o.get("status") or {}).get("caRotation", {}).get("stage")
                     == "AwaitingCredentials")
    for _ in range(3):
        await driver.step()
    op = await driver.get()
    assert op["status"]["caRotation"]["stage"] == "AwaitingCredentials"
    assert names.CREDENTIALS_HANDOFF_ANNOTATION not in (op["metadata"].get("annotations") or {})
    # Given while it waits, it is honoured.
    driver.acknowledge = True
    await driver.run(until=lambda o: (o.get("status") or {}).get("caRotation", {}).get("stage") == "Issuing")


async def test_a_machine_not_converged_blocks_the_start_and_writes_nothing(
        env: SimEnvironment, driver: Driver) -> None:
    before = secret_data(env)
    # A pending change the machine reconciler has not rolled out yet: the render differs from what nodes run.
    patch = "machine:\n  sysctls:\n    net.core.somaxconn: \"4096\"\n"
    await crds.clusters(driver.kube).patch(env.namespace, env.cluster_name, {"spec": {"patches": [patch]}})
    await driver.create()
    outcome = await driver.step()
    assert isinstance(outcome, Blocked)
    op = await driver.get()
    cond = find(op["status"]["conditions"], names.CA_ROTATION)
    assert cond is not None and cond["reason"] == "Blocked"
    assert "does not run the configuration ichord renders" in cond["message"]
    # The way out is named, in the order that works: config-apply is refused while this rotation exists.
    ns, name = env.namespace, op["metadata"]["name"]
    assert (f"`ichord cluster config-apply {env.cluster_name} -n {ns}`, which is refused while this rotation exists: "
            f"delete it first (`kubectl -n {ns} delete talosoperation {name}`; it has not started") in cond["message"]
    assert secret_data(env) == before and "caRotation" not in op["status"]
    assert driver.applies == [] and all(env.applies(m) == [] for m in env.machine_names)


async def test_paused_after_the_start_holds_at_a_step_boundary_and_resumes(env: SimEnvironment,
                                                                          driver: Driver) -> None:
    await driver.create()
    await driver.run(until=at("Issuing"))
    op = await driver.get()
    uid = op["metadata"]["uid"]
    await crds.operations(driver.kube).patch(env.namespace, driver.op_name, {"spec": {"paused": True}})
    applies, trusted = len(driver.applies), len(driver.trusted)
    for _ in range(3):  # held, step after step: nothing applied, the lock renewed, the trust pool still fed
        outcome = await driver.step()
        assert isinstance(outcome, Blocked) and outcome.reason == "Paused", outcome
    op = await driver.get()
    cond = find(op["status"]["conditions"], names.CA_ROTATION)
    assert op["status"]["phase"] == "Paused" and op["status"]["caRotation"]["stage"] == "Issuing"
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Paused")
    assert "spec.paused" in cond["message"] and "Issuing" in cond["message"]
    assert len(driver.applies) == applies and len(driver.trusted) > trusted
    assert await lock_holder(driver.kube, env.namespace, env.cluster_name) == uid
    await driver.recorder.drain()
    events = env.management.store.list(env.management.store.resolve("", "v1", "events"), env.namespace)[0]
    assert sum(1 for e in events if e.get("reason") == "OperationPaused") == 1  # once, not per step

    await crds.operations(driver.kube).patch(env.namespace, driver.op_name, {"spec": {"paused": False}})
    assert isinstance(await driver.run(), Done)
    final = driver.snapshots[-1]
    assert final["status"]["phase"] == "Completed"
    await driver.recorder.drain()
    events = env.management.store.list(env.management.store.resolve("", "v1", "events"), env.namespace)[0]
    assert [e["message"] for e in events if e.get("reason") == "OperationResumed"] == [
        "resumed in Issuing: spec.paused is false"]
    # No machine was applied twice in one pass: 3 passes x 4 machines in all.
    assert len(driver.applies) == 3 * len(env.machine_names)
