"""What holds a ca-rotation and how it resumes by itself; a restart after the Secret was replaced; deletion
held by the finalizer; and the leak test (dial errors echo CA keys; nothing reaches status, Events, logs)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.errors import NotFound
from ichord.operations.ca_rotation import stage_table
from ichord.operations.outcome import Done
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.scrub import REDACTED
from ichord.sim.combined import SimEnvironment
from ichord.talos.errors import TalosUnreachableError
from tests.integration._ca_rotation_driver import (
    Crash,
    Driver,
    at,
    blocked_on,
    driving,
    live_bundle,
    live_rotation,
    secret_data,
    stages_seen,
)
from tests.integration._kube_helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_an_unreachable_machine_and_a_node_not_ready_hold_the_stage_and_it_resumes(
        env: SimEnvironment, driver: Driver) -> None:
    worker = env.machine_names[-1]
    node = env.node(worker).nodename
    await driver.create()

    # Issuing: the worker stops answering ichord before its apply.
    await driver.run(until=at("Issuing"))
    await env.set_unreachable(worker)
    await driver.run(until=blocked_on(worker))
    op = await driver.get()
    assert op["status"]["phase"] == "Paused" and op["status"]["caRotation"]["stage"] == "Issuing"
    held = [m for m in op["status"]["machines"] if m["name"] == worker]
    assert held and held[0]["state"] == "Unreachable"
    for _ in range(3):  # retried, never advanced
        await driver.step()
    assert (await driver.get())["status"]["caRotation"]["stage"] == "Issuing"
    await env.set_unreachable(worker, False)

    # Dropping: a Node goes NotReady after the applies, before the verification.
    def dropping_applied(o: dict[str, Any]) -> bool:
        machines = (o.get("status") or {}).get("machines") or []
        return at("Dropping")(o) and any(m["name"] == worker and m["message"] == "applied Dropping"
                                         for m in machines)

    await driver.run(until=dropping_applied)
    await anyio.sleep(0.3)  # the simulated kubelet restarts of the apply are over (20 ms at this scale)
    env.kube.behaviours.restart_kubelet(node, duration=60.0)  # NotReady until told otherwise
    await driver.run(until=blocked_on(node))
    op = await driver.get()
    assert op["status"]["caRotation"]["stage"] == "Dropping" and op["status"]["phase"] == "Paused"
    assert live_rotation(env) is not None  # the Secret is not replaced while Dropping is not verified
    env.kube.behaviours.restart_kubelet(node, duration=0.0)  # the kubelet posts Ready again
    with anyio.fail_after(5):
        while env.node_ready(worker) != "True":  # noqa: ASYNC110  # the simulator offers no event
            await anyio.sleep(0.01)

    assert isinstance(await driver.run(), Done)
    assert stages_seen(driver.snapshots)[-3:] == ["Dropping", "Finalizing", "Done"]
    for machine in env.machine_names:
        assert len(env.applies(machine)) == 3, machine


async def test_deletion_is_held_and_a_restart_after_the_secret_replace_carries_on(
        env: SimEnvironment, driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash_at(name: str) -> Callable[[str], None]:
        def fp(point: str) -> None:
            if point == name:
                monkeypatch.setattr(stage_table, "failpoint", lambda _p: None)
                raise Crash(point)
        return fp

    monkeypatch.setattr(stage_table, "failpoint", crash_at("ca-rotation.replace.after"))
    await driver.create()
    await driver.run(until=at("Issuing"))
    await crds.operations(driver.kube).delete(env.namespace, driver.op_name)
    op = await driver.get()
    assert op["metadata"].get("deletionTimestamp")
    assert names.CA_ROTATION_FINALIZER in op["metadata"]["finalizers"]

    assert isinstance(await driver.run(), Done)
    with pytest.raises(NotFound):  # released with the finalizer at Done
        await driver.get()
    # (the object is gone at Done: the last status seen is Finalizing's)
    assert stages_seen(driver.snapshots) == ["Accepting", "AwaitingCredentials", "Issuing", "Dropping",
                                             "Finalizing"]
    assert live_rotation(env) is None and names.ROTATION_KEY not in secret_data(env)
    new = live_bundle(env)
    certs = {c["name"]: c for c in driver.snapshots[-1]["status"]["caRotation"]["certificates"]}
    assert certs["talos"]["next"] == ca_fingerprint(new.os)
    assert certs["kubernetes"]["next"] == ca_fingerprint(new.k8s)
    for machine in env.machine_names:
        assert len(env.applies(machine)) == 3, machine
    cluster = await crds.clusters(driver.kube).get(env.namespace, env.cluster_name)
    stale = find(cluster["status"]["conditions"], names.BUNDLE_BACKUP_STALE)
    assert stale is not None and stale["status"] == "True"


async def test_dial_errors_that_echo_ca_keys_are_redacted_everywhere(
        env: SimEnvironment, driver: Driver, capfd: pytest.CaptureFixture[str]) -> None:
    old = env.bundle
    assert old is not None and old.os.key_pem is not None
    await driver.create()
    await driver.run(until=at("Issuing"))
    rotation = live_rotation(env)
    assert rotation is not None
    keys = [ca.key_pem for ca in rotation.new.values()] + [old.os.key_pem, old.k8s.key_pem]
    echoed = b"".join(k for k in keys if k).decode()
    fired: list[str] = []

    def inject(method: str, endpoint: str) -> None:
        if method == "MachineConfig" and len(fired) < 2:
            fired.append(endpoint)
            raise TalosUnreachableError(endpoint, method, f"handshake failed; the peer said {echoed}")

    driver.inject = inject
    assert isinstance(await driver.run(), Done)
    assert fired
    await driver.recorder.drain()

    store = env.management.store
    events = store.list(store.resolve("", "v1", "events"), env.namespace)[0]
    cluster = store.get(store.resolve(names.GROUP, names.VERSION, "talosclusters"), env.namespace, env.cluster_name)
    out, err = capfd.readouterr()
    haystacks = {"status snapshots": json.dumps(driver.snapshots), "events": json.dumps(events),
                 "cluster": json.dumps(cluster), "logs": out + err}
    lines = [line for key in keys if key for line in key.decode().splitlines() if "-----" not in line]
    for where, text in haystacks.items():
        for line in lines:
            assert line not in text, f"key material in {where}"
        assert "PRIVATE KEY" not in text, where
    # The redaction happened (the cause still reached the user).
    assert any(REDACTED in json.dumps(s.get("status")) for s in driver.snapshots)
    assert any("handshake failed" in json.dumps(s.get("status")) for s in driver.snapshots)


def _events(env: SimEnvironment) -> list[dict[str, Any]]:
    store = env.management.store
    return store.list(store.resolve("", "v1", "events"), env.namespace)[0]


async def test_a_healthy_rotation_never_shows_paused_and_raises_no_warning(env: SimEnvironment) -> None:
    """Issue 12: the normal waits of a pass (machines answering again, Nodes Ready) are InProgress with a
    reason naming what is awaited; Paused and a Warning Event only past the bound or on a fault."""
    from dataclasses import replace

    from tests.integration._ca_rotation_driver import TIMING

    async with driving(env, timing=replace(TIMING, ca_pass_wait_bound=60.0)) as driver:
        await driver.create()
        assert isinstance(await driver.run(), Done)
    phases = {(s.get("status") or {}).get("phase") for s in driver.snapshots}
    assert "Paused" not in phases, phases
    reasons = [find((s.get("status") or {}).get("conditions"), names.CA_ROTATION) for s in driver.snapshots]
    assert not [c for c in reasons if c and c["reason"] == "Blocked"]
    assert {c["reason"] for c in reasons if c} >= {"VerifyingPass", "AwaitingCredentials", "SettlingClients"}
    steps = {((s.get("status") or {}).get("caRotation") or {}).get("step") for s in driver.snapshots}
    assert {"apply", "verify"} <= steps
    # The terminal condition `kubectl wait --for=condition=Succeeded` waits on: Unknown while running, then True.
    succeeded = [find((s.get("status") or {}).get("conditions"), names.SUCCEEDED) for s in driver.snapshots]
    assert {c["status"] for c in succeeded[:-1] if c} == {"Unknown"} and succeeded[-1]["status"] == "True"
    final = driver.snapshots[-1]
    assert final["status"]["observedGeneration"] == final["metadata"]["generation"]
    events = _events(env)
    # The one Warning of a healthy rotation is the call to export the replaced bundle (the CRDs), on the cluster.
    warnings = [(e["involvedObject"]["kind"], e["reason"]) for e in events if e.get("type") == "Warning"]
    assert warnings == [("TalosCluster", "BundleBackupStale")], warnings
    awaiting = [e for e in events if e.get("reason") == "AwaitingCredentials"]
    assert len(awaiting) == 1 and awaiting[0]["type"] == "Normal", awaiting
    assert (f"ichord cluster credentials {env.cluster_name} -n {env.namespace} --acknowledge"
            in awaiting[0]["message"])


async def test_an_unreachable_machine_is_a_wait_first_and_blocked_past_the_bound(env: SimEnvironment) -> None:
    from dataclasses import replace

    from tests.integration._ca_rotation_driver import TIMING

    worker = env.machine_names[-1]
    async with driving(env, timing=replace(TIMING, ca_pass_wait_bound=3.0)) as driver:
        await driver.create()
        await driver.run(until=at("Issuing"))
        await env.set_unreachable(worker)

        def waiting(o: dict[str, Any]) -> bool:
            cond = find((o.get("status") or {}).get("conditions"), names.CA_ROTATION)
            return bool(cond and cond["reason"] == "VerifyingPass" and worker in cond["message"])

        await driver.run(until=waiting)
        op = await driver.get()
        assert op["status"]["phase"] == "InProgress" and op["status"]["caRotation"]["step"] == "verify"
        assert not [e for e in _events(env) if e.get("type") == "Warning"]
        await driver.run(until=blocked_on(worker))
        op = await driver.get()
        assert op["status"]["phase"] == "Paused"
        assert "waited more than 3 s" in find(op["status"]["conditions"], names.CA_ROTATION)["message"]
        # The recorder posts from its own task: wait for what it has queued or is posting (not for a time).
        await driver.recorder.drain()
        await eventually(lambda: any(e.get("type") == "Warning" for e in _events(env)))
        warnings = [e for e in _events(env) if e.get("type") == "Warning"]
        assert [e["reason"] for e in warnings] == ["OperationBlocked"] and worker in warnings[0]["message"]
        await env.set_unreachable(worker, False)
        assert isinstance(await driver.run(), Done)


async def test_a_machine_slow_to_answer_the_replaced_bundle_is_a_wait_in_finalizing(env: SimEnvironment) -> None:
    """Finalizing verifies every machine on the replaced bundle: one that does not answer (busy, its kubelet
    restarting) is waited for, InProgress and no Warning, as in a pass; Paused only past the bound. It was Blocked
    at the first dial that took longer than the timeout (a loaded CI machine)."""
    from dataclasses import replace

    from tests.integration._ca_rotation_driver import TIMING

    worker = env.machine_names[-1]
    async with driving(env, timing=replace(TIMING, ca_pass_wait_bound=60.0)) as driver:
        await driver.create()
        await driver.run(until=at("Finalizing"))
        await env.set_unreachable(worker)

        def waiting(o: dict[str, Any]) -> bool:
            cond = find((o.get("status") or {}).get("conditions"), names.CA_ROTATION)
            return bool(cond and cond["reason"] == "VerifyingPass" and worker in cond["message"])

        await driver.run(until=waiting)
        op = await driver.get()
        assert op["status"]["phase"] == "InProgress" and op["status"]["caRotation"]["step"] == "verify-replaced"
        assert "replaced bundle" in find(op["status"]["conditions"], names.CA_ROTATION)["message"]
        await env.set_unreachable(worker, False)
        assert isinstance(await driver.run(), Done)
    assert "Paused" not in {(s.get("status") or {}).get("phase") for s in driver.snapshots}
    await driver.recorder.drain()
    warnings = [(e["involvedObject"]["kind"], e["reason"]) for e in _events(env) if e.get("type") == "Warning"]
    assert warnings == [("TalosCluster", "BundleBackupStale")], warnings
