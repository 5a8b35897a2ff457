"""The kubernetes-aggregator target (docs/decisions.md#aggregator-ca) against the simulators: refused on the v1.13
contract before anything is written; extension-apiserver-authentication lists the new CA before Issuing;
AggregatorAuthReset leaves the new CA alone in it (kube-apiserver merges and never removes); the reset never
deletes a ConfigMap kube-apiserver recreated meanwhile."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.contract import V1_13
from ichord.operations.ca_rotation import aggregator
from ichord.operations.outcome import Done, Failed
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube.behaviours import EXT_AUTH
from tests.integration._apiserver_history import overlapping_restarts
from tests.integration._ca_rotation_driver import Driver, driving, live_bundle, secret_data, stages_seen

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
SCALE = 0.02


def ext_auth_cas(env: SimEnvironment) -> list[bytes]:
    store = env.kube.store
    cm = store.get(store.resolve("", "v1", "configmaps"), *EXT_AUTH)
    return _pem.pem_blocks(cm["data"][names.EXTENSION_AUTH_CA_KEY].encode())


def _reasons(snapshots: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for s in snapshots:
        cond = find((s.get("status") or {}).get("conditions"), names.CA_ROTATION)
        stage = ((s.get("status") or {}).get("caRotation") or {}).get("stage") or ""
        if cond and (not out or out[-1] != (stage, cond["reason"])):
            out.append((stage, cond["reason"]))
    return out


async def test_an_aggregator_rotation_ends_with_the_new_ca_alone_in_extension_apiserver_authentication(
        env: SimEnvironment, driver: Driver) -> None:
    old = live_bundle(env).k8s_aggregator.cert_pem
    assert ext_auth_cas(env) == _pem.pem_blocks(old)
    await driver.create(targets=["kubernetes-aggregator"])
    assert isinstance(await driver.run(max_steps=800), Done)

    new = live_bundle(env).k8s_aggregator.cert_pem
    assert new != old and names.ROTATION_KEY not in secret_data(env)
    assert ext_auth_cas(env) == _pem.pem_blocks(new)  # the merged old CA is gone (docs/decisions.md#aggregator-ca)
    assert stages_seen(driver.snapshots)[:2] == ["Accepting", "Issuing"]  # no hand-off for the aggregator alone
    reasons = _reasons(driver.snapshots)
    assert ("Accepting", "SettlingClients") in reasons  # ClientSettleDelay before Issuing signs with the new CA
    assert ("Finalizing", "SettlingAggregator") in reasons
    assert overlapping_restarts(env.talos.history.events) == []
    final = driver.snapshots[-1]["status"]
    assert "metrics-server" in final["message"] and "owners" in final["message"]
    assert any("metrics-server" in w for w in final["plan"]["warnings"])


async def test_the_aggregator_target_is_refused_on_the_v1_13_contract_before_anything_is_written(
        bundle: SecretsBundle) -> None:
    async with SimEnvironment(bundle=generate_bundle(V1_13), time_scale=SCALE, contract=V1_13) as env, \
            driving(env) as driver:
        before = secret_data(env)
        await driver.create(targets=["talos", "kubernetes-aggregator"])
        outcome = await driver.run()
        assert isinstance(outcome, Failed) and outcome.reason == "UnsupportedTarget"
        op = await driver.get()
        assert op["status"]["phase"] == "Failed" and "v1.14" in op["status"]["message"]
        assert "plan" not in op["status"]
        assert secret_data(env) == before and driver.applies == []


async def test_the_reset_never_deletes_a_config_map_recreated_since_it_was_read(
        env: SimEnvironment, driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    store = env.kube.store
    rt = store.resolve("", "v1", "configmaps")
    new_pem = generate_bundle().k8s_aggregator.cert_pem
    recreated: list[str] = []

    def recreate(point: str) -> None:
        if point == "ca-rotation.aggregator.delete.before" and not recreated:
            cm = store.get(rt, *EXT_AUTH)
            store.delete(rt, EXT_AUTH[0], EXT_AUTH[1])
            body = {"metadata": {"name": EXT_AUTH[1], "namespace": EXT_AUTH[0]}, "data": dict(cm["data"])}
            recreated.append(str(store.create(rt, EXT_AUTH[0], body)["metadata"]["uid"]))

    monkeypatch.setattr(aggregator, "failpoint", recreate)
    first = await aggregator.reset_step(driver.kube, new_pem)
    assert not first.settled and recreated
    # The copy kube-apiserver recreated between the read and the delete was not deleted (UID precondition).
    assert str(store.get(rt, *EXT_AUTH)["metadata"]["uid"]) == recreated[0]

    # A read that is current deletes it; kube-apiserver recreates it with what it accepts now.
    env.kube.behaviours.current_aggregator_cas = [new_pem]
    second = await aggregator.reset_step(driver.kube, new_pem)
    assert not second.settled
    for _ in range(200):
        if (await aggregator.reset_step(driver.kube, new_pem)).settled:
            break
        await anyio.sleep(0.01)
    assert ext_auth_cas(env) == _pem.pem_blocks(new_pem)


async def test_a_missing_config_map_is_not_settled(env: SimEnvironment, driver: Driver) -> None:
    store = env.kube.store
    await env.kube.behaviours.stop()  # kube-apiserver does not recreate it meanwhile
    store.delete(store.resolve("", "v1", "configmaps"), EXT_AUTH[0], EXT_AUTH[1])
    step = await aggregator.reset_step(driver.kube, live_bundle(env).k8s_aggregator.cert_pem)
    assert not step.settled and "recreate" in step.message


async def test_status_machines_show_each_nodes_cas_read_from_the_node(env: SimEnvironment, driver: Driver) -> None:
    old = live_bundle(env)
    await driver.create(targets=["talos", "kubernetes-aggregator"])

    def issuing(o: dict[str, Any]) -> bool:
        return ((o.get("status") or {}).get("caRotation") or {}).get("stage") == "Issuing" and len(
            (o.get("status") or {}).get("machines") or []) == len(env.machine_names)

    await driver.run(until=issuing, max_steps=800)
    certs = {c["name"]: c for c in driver.snapshots[-1]["status"]["caRotation"]["certificates"]}
    machines = {m["name"]: m for m in driver.snapshots[-1]["status"]["machines"]}
    for name in env.machine_names:
        cas = machines[name].get("cas") or {}
        assert set(cas["talos"]["trusted"]) == {certs["talos"]["previous"], certs["talos"]["next"]}, name
        if env.node(name).is_control_plane:
            agg = cas["kubernetes-aggregator"]
            assert agg["trusted"][0] == agg["issuing"]
            assert set(agg["trusted"]) == {certs["kubernetes-aggregator"]["previous"],
                                           certs["kubernetes-aggregator"]["next"]}
        else:
            assert "kubernetes-aggregator" not in cas  # a worker runs no kube-apiserver
    assert certs["talos"]["previous"] == ca_fingerprint(old.os)
