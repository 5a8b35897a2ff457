"""The etcd CA target on the simulators: three passes, each followed by a reboot roll of the control planes.

Driven step by step (a fresh context per step, as after a restart). The checks are the invariants of
docs/decisions.md#invariants read from the Talos simulator's history (tests/_etcd_history.py) plus what
docs/decisions.md#etcd-reboot-roll promises the operator sees (plan, RebootingEtcd, EtcdMemberRebooted, the
per-stage etcdRestarted).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube.client import from_kubeconfig
from ichord.kube.events import EventRecorder
from ichord.operations.outcome import Blocked, Done
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosError
from tests._etcd_history import ca_fp, etcd_violations, final_trust
from tests.integration._ca_rotation_driver import (
    Driver,
    add_clients,
    at,
    blocked_on,
    driving,
    live_bundle,
    secret_data,
    stages_seen,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
SCALE = 0.02

Obj = dict[str, Any]


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE) as e:
        add_clients(e)
        yield e


def control_planes(env: SimEnvironment) -> list[str]:
    return [m for m in env.machine_names if "cp" in m]


def reasons(snapshots: list[Obj]) -> list[str]:
    out: list[str] = []
    for s in snapshots:
        cond = find((s.get("status") or {}).get("conditions"), names.CA_ROTATION)
        if cond and (not out or out[-1] != cond["reason"]):
            out.append(cond["reason"])
    return out


async def test_an_etcd_rotation_reboots_each_control_plane_once_per_pass_and_never_loses_quorum(
        env: SimEnvironment, driver: Driver, bundle: SecretsBundle) -> None:
    cps = control_planes(env)
    dialled_while_rebooting: list[str] = []

    def no_config_read_of_the_rebooting_node(method: str, endpoint: str) -> None:
        store = env.management.store
        op = store.get(store.resolve(names.GROUP, names.VERSION, "talosoperations"), env.namespace, "rotate")
        machine = ((op.get("status") or {}).get("caRotation") or {}).get("etcdRebooting")
        if method == "MachineConfig" and machine and env.endpoints[machine] == endpoint:
            dialled_while_rebooting.append(machine)

    driver.inject = no_config_read_of_the_rebooting_node
    await driver.create(targets=["etcd"])
    outcome = await driver.run(max_steps=1500)
    assert isinstance(outcome, Done)
    assert dialled_while_rebooting == []  # the pass does nothing else while a node reboots
    # Each pass's applies restart kube-apiserver (its etcd client CA): one control plane at a time
    # (docs/decisions.md#etcd-reboot-roll). At this time scale a restart is shorter than an apply, so overlaps could not
    # show here: the record is what is checked; tests/e2e/test_ca_rotation_etcd_daemon.py checks overlaps where they
    # could happen.
    recorded = {i["machine"] for snap in driver.snapshots
                for i in ((snap.get("status") or {}).get("caRotation") or {}).get("apiServerInstances") or []}
    assert recorded == set(cps)  # each control plane's restart was recorded and awaited before the next apply

    # No hand-off (neither talos nor kubernetes), the stages only forward.
    assert stages_seen(driver.snapshots) == ["Accepting", "Issuing", "Dropping", "Finalizing", "Done"]
    plan = driver.snapshots[-1]["status"]["plan"]
    assert [m["reboots"] for m in plan["machines"]] == [True, True, True, False]
    assert any("9 for 3" in w for w in plan["warnings"]) and any("etcd snapshot" in w for w in plan["warnings"])
    assert plan["kubernetesAPIUnavailable"] is False
    assert "RebootingEtcd" in reasons(driver.snapshots)
    await driver.recorder.drain()
    store = env.management.store
    rebooted = [e for e in store.list(store.resolve("", "v1", "events"), env.namespace)[0]
                if e["reason"] == "EtcdMemberRebooted"]
    assert sum(int(e.get("count") or 1) for e in rebooted) == 3 * len(cps)

    # From the simulator: quorum never lost, members always talking, one round of reboots per pass, in order.
    events = env.talos.history.events
    assert etcd_violations(events, cps, rounds=3) == []
    assert not env.talos.history.of("reboot", env.machine_names[-1])  # the worker never reboots
    # One admin kubeconfig per stage (preflight, the three passes, Finalizing): a pass's roll steps and its
    # verification share the client the driver keeps, as the daemon's registry keeps it (issue 19), where each roll
    # step asked for its own before (ten per pass on three control planes).
    assert sum(env.node(m).rpcs["Kubeconfig"] for m in env.machine_names) == 5
    assert not [e for e in events if e["kind"] == "service_restart"]
    # The per-stage record: each pass ended with every control plane listed once, in order.
    for stage in ("Accepting", "Issuing", "Dropping"):
        last = [s for s in driver.snapshots if s["status"].get("caRotation", {}).get("stage") == stage][-1]
        assert last["status"]["caRotation"]["etcdRestarted"] == cps, stage
        assert not last["status"]["caRotation"].get("etcdRebooting")

    # At the end every member signs with and trusts only the new etcd CA, which the bundle Secret holds.
    new = live_bundle(env)
    assert ca_fingerprint(new.etcd) != ca_fingerprint(bundle.etcd)
    assert names.ROTATION_KEY not in secret_data(env)
    new_fp = ca_fp(new.etcd.cert_pem)
    assert final_trust(env.talos.etcd.state()) == {cp: (new_fp, [new_fp]) for cp in cps}
    # The other CAs did not change; no node is left cordoned.
    assert ca_fingerprint(new.os) == ca_fingerprint(bundle.os) and ca_fingerprint(new.k8s) == ca_fingerprint(bundle.k8s)
    store = env.kube.store
    for node in store.list(store.resolve("", "v1", "nodes"), None)[0]:
        assert not node["spec"].get("unschedulable"), node["metadata"]["name"]


async def test_the_hardware_observation_an_apply_leaves_etcd_on_the_old_ca_until_the_reboot(
        env: SimEnvironment, driver: Driver, bundle: SecretsBundle) -> None:
    """docs/decisions.md#etcd-reboot-roll: ServiceRestart("etcd") is refused; after the Accepting apply ca.crt holds
    two certificates while etcd still runs on the old CA; the roll's reboot is what loads them."""
    cps = control_planes(env)
    await driver.create(targets=["etcd"])
    await driver.run(max_steps=400, until=lambda o: o["status"].get("caRotation", {}).get("step") == "roll")
    old_fp = ca_fp(bundle.etcd.cert_pem)
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2, rpc_timeout=5) as c:
        with pytest.raises(TalosError, match="doesn't support restart"):
            await c.service_restart(env.endpoints[cps[0]], "etcd")
        ca = await c.read(env.endpoints[cps[0]], "/system/secrets/etcd/ca.crt")
    assert ca.count(b"BEGIN CERTIFICATE") == 2
    members = final_trust(env.talos.etcd.state())
    assert all(signer == old_fp and trusted == [old_fp] for signer, trusted in members.values()), members
    assert env.talos.history.of("etcd_reboot_required")
    assert isinstance(await driver.run(max_steps=1500), Done)
    assert etcd_violations(env.talos.history.events, cps, rounds=3) == []


async def test_preflight_refuses_an_etcd_that_is_not_whole_and_writes_nothing(
        env: SimEnvironment, driver: Driver) -> None:
    before = secret_data(env)
    cps = control_planes(env)
    env.node(cps[2]).raise_etcd_alarm(1)
    await driver.create(targets=["etcd"])
    outcome = await driver.step()
    assert isinstance(outcome, Blocked)
    op = await driver.get()
    cond = find(op["status"]["conditions"], names.CA_ROTATION)
    assert op["status"]["phase"] == "Paused" and cond is not None and cond["reason"] == "Blocked"
    assert "NOSPACE" in cond["message"] and cps[2] in cond["message"]
    assert secret_data(env) == before and "caRotation" not in op["status"]
    env.talos.etcd.disarm(cps[2])
    env.node(cps[1]).set_etcd_unhealthy(True)
    outcome = await driver.step()
    assert isinstance(outcome, Blocked)
    cond = find((await driver.get())["status"]["conditions"], names.CA_ROTATION)
    assert cond is not None and f"etcd service on {cps[1]} is not healthy" in cond["message"]
    assert secret_data(env) == before
    env.node(cps[1]).set_etcd_unhealthy(False)
    await driver.run(until=at("Accepting"))


async def test_an_alarm_raised_mid_roll_pauses_before_the_next_reboot_then_it_goes_on(
        env: SimEnvironment, driver: Driver) -> None:
    cps = control_planes(env)
    await driver.create(targets=["etcd"])
    await driver.run(max_steps=600, until=lambda o: o["status"].get("caRotation", {}).get("etcdRestarted") == cps[:1])
    env.node(cps[0]).raise_etcd_alarm(2)
    await driver.run(max_steps=200, until=blocked_on("CORRUPT"))
    reboots = len(env.talos.history.of("reboot"))
    for _ in range(5):
        assert isinstance(await driver.step(), Blocked)
    assert len(env.talos.history.of("reboot")) == reboots  # nothing rebooted while the alarm is up
    env.talos.etcd.disarm(cps[0])
    assert isinstance(await driver.run(max_steps=1500), Done)
    assert etcd_violations(env.talos.history.events, cps, rounds=3) == []


async def test_an_extra_member_is_refused_at_preflight(env: SimEnvironment, driver: Driver,
                                                       bundle: SecretsBundle) -> None:
    env.talos.etcd.start_member("stranger", "127.9.9.9", bundle.etcd.cert_pem)
    await driver.create(targets=["etcd"])
    assert isinstance(await driver.step(), Blocked)
    cond = find((await driver.get())["status"]["conditions"], names.CA_ROTATION)
    assert cond is not None and "stranger" in cond["message"] and "no approved control plane" in cond["message"]


def rebooting(machine: str) -> Any:
    return lambda o: o["status"].get("caRotation", {}).get("etcdRebooting") == machine


async def test_a_member_that_does_not_come_back_pauses_naming_it_then_the_roll_goes_on(
        env: SimEnvironment, driver: Driver) -> None:
    cps = control_planes(env)
    await driver.create(targets=["etcd"])
    await driver.run(max_steps=600, until=rebooting(cps[1]))
    env.node(cps[1]).faults.unreachable = True  # it goes down for the reboot and stays down
    await driver.run(max_steps=600, until=blocked_on("did not come back"))
    op = await driver.get()
    cond = find(op["status"]["conditions"], names.CA_ROTATION)
    assert op["status"]["phase"] == "Paused" and cond is not None and cps[1] in cond["message"]
    assert not env.talos.history.of("reboot_requested", cps[2])  # the next one waits
    await env.set_unreachable(cps[1], False)
    assert isinstance(await driver.run(max_steps=1500), Done)
    assert etcd_violations(env.talos.history.events, cps, rounds=3) == []


async def test_a_refused_reboot_clears_the_marker_uncordons_and_is_asked_again(
        env: SimEnvironment, driver: Driver) -> None:
    cps = control_planes(env)
    env.node(cps[0]).faults.reboot_error = "failed to acquire lock: sequence is already running"
    await driver.create(targets=["etcd"])
    await driver.run(max_steps=600, until=blocked_on("refused the reboot"))
    op = await driver.get()
    assert not op["status"]["caRotation"].get("etcdRebooting")
    store = env.kube.store
    assert not store.get(store.resolve("", "v1", "nodes"), None, cps[0])["spec"].get("unschedulable")
    env.node(cps[0]).faults.reboot_error = None
    assert isinstance(await driver.run(max_steps=1500), Done)
    assert etcd_violations(env.talos.history.events, cps, rounds=3) == []


async def test_a_member_joining_mid_roll_that_is_no_approved_machine_holds_the_roll(
        env: SimEnvironment, driver: Driver, bundle: SecretsBundle) -> None:
    cps = control_planes(env)
    await driver.create(targets=["etcd"])
    await driver.run(max_steps=600, until=lambda o: o["status"].get("caRotation", {}).get("etcdRestarted") == cps[:1])
    etcd = env.talos.etcd
    etcd.start_member("stranger", "127.9.9.9", bundle.etcd.cert_pem)
    await driver.run(max_steps=200, until=blocked_on("stranger"))
    reboots = len(env.talos.history.of("reboot_requested"))
    assert isinstance(await driver.step(), Blocked)
    assert len(env.talos.history.of("reboot_requested")) == reboots
    etcd.remove_member("stranger")  # talosctl etcd remove-member
    assert isinstance(await driver.run(max_steps=1500), Done)
    assert etcd_violations(env.talos.history.events, cps, rounds=3) == []


async def test_if_the_second_certificate_of_the_bundle_is_not_trusted_the_roll_stops_with_quorum_kept(
        bundle: SecretsBundle) -> None:
    """The open question of docs/decisions.md#ca-rotation-passes answered "no" by the simulator: after the Issuing apply
    kube-apiserver presents a certificate of the new CA that no member (which loaded only the old one) trusts. The roll
    stops before any Issuing reboot, pauses, and quorum is never lost."""
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, management_api="separate") as env, \
            await from_kubeconfig(env.kubeconfig) as kube:
        env.talos.etcd.trust_first_only = True
        recorder = EventRecorder(kube)
        async with anyio.create_task_group() as tg:
            tg.start_soon(recorder.run)
            driver = Driver(env, kube, recorder)
            cps = control_planes(env)
            await driver.create(targets=["etcd"])
            await driver.run(max_steps=6000, until=lambda o: o["status"].get("caRotation", {}).get("stage")
                             == "Issuing" and o["status"].get("phase") == "Paused")
            op = await driver.get()
            cond = find(op["status"]["conditions"], names.CA_ROTATION)
            assert cond is not None and cond["reason"] == "Blocked", cond
            issuing_from = next(e["seq"] for e in env.talos.history.events
                                if e["kind"] == "apply" and e["node"] == cps[0] and e["seq"] > max(
                                    r["seq"] for r in env.talos.history.of("reboot")))
            assert not [e for e in env.talos.history.events if e["kind"] == "reboot_requested"
                        and e["seq"] > issuing_from]
            assert etcd_violations(env.talos.history.events, cps, rounds=1) == []
            tg.cancel_scope.cancel()


async def test_a_single_control_plane_rotates_with_its_api_away_during_each_reboot(bundle: SecretsBundle) -> None:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, control_planes=1) as env:
        add_clients(env)
        async with driving(env) as driver:
            await driver.create(targets=["etcd"])
            assert isinstance(await driver.run(max_steps=1500), Done)
            assert driver.snapshots[-1]["status"]["plan"]["kubernetesAPIUnavailable"] is True
            cp = control_planes(env)
            assert etcd_violations(env.talos.history.events, cp, rounds=3) == []
            new_fp = ca_fp(live_bundle(env).etcd.cert_pem)
            assert final_trust(env.talos.etcd.state()) == {cp[0]: (new_fp, [new_fp])}
