"""Rotations planned from expiry (docs/decisions.md#renewal-policy): the cluster actor, on the real wire against the
Kubernetes API simulator (HTTPS) and the Talos node simulators, with a bundle whose talos and kubernetes CAs expire
in 20 days and a TalosCluster whose spec.caRotation.renewBefore is 30d.

What is checked is read back from the API: the TalosOperations that exist (one, under any number of steps and a
restarted actor), their spec, the cluster's RotationDue condition and the Events, and the simulator's request log
(one create).
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.api.views import ClusterView
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import Invalid
from ichord.kube.events import EventRecorder
from ichord.kube.status import update_status
from ichord.operations.outcome import Blocked, Done, Requeue
from ichord.operations.renewal import DueCA, RenewalPass, operation_body, operation_name
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CA_VALIDITY, CAKind, generate_ca
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import Target
from ichord.sim.combined import SimEnvironment
from tests.integration._actor import cluster_actor
from tests.integration._ca_rotation_driver import TIMING
from tests.integration.conftest import ENV_SCALE

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
EXPIRES_IN = dt.timedelta(days=20)


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    """The talos and kubernetes CAs expire in 20 days; etcd and the aggregator in ten years."""
    base = generate_bundle()
    made = dt.datetime.now(dt.UTC) - CA_VALIDITY + EXPIRES_IN
    return base.with_cas({CAKind.OS: generate_ca(CAKind.OS, now=made),
                          CAKind.KUBERNETES: generate_ca(CAKind.KUBERNETES, now=made)})


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=ENV_SCALE) as e:
        yield e


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as k:
        yield k


async def set_policy(kube: KubeClient, env: SimEnvironment, policy: Obj | None) -> None:
    await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"caRotation": policy}})


async def planned(kube: KubeClient, env: SimEnvironment) -> list[Obj]:
    objs, _ = await crds.operations(kube).list_objects(env.namespace)
    return objs


async def rotation_due(kube: KubeClient, env: SimEnvironment) -> Obj | None:
    cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
    return find((cluster.get("status") or {}).get("conditions"), names.ROTATION_DUE)


async def events(kube: KubeClient, env: SimEnvironment, reason: str) -> list[Obj]:
    out = await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events")
    return [e for e in out.get("items") or [] if e.get("reason") == reason]


def expected_name(env: SimEnvironment, bundle: SecretsBundle) -> str:
    due = [DueCA(t, bundle.ca(t.ca_kind).not_after, ca_fingerprint(bundle.ca(t.ca_kind)), "30d")
           for t in (Target.TALOS, Target.KUBERNETES)]
    return operation_name(env.cluster_name, due)


def creates(env: SimEnvironment) -> int:
    return env.management.requests.count("create", resource="talosoperations")


async def test_manual_plans_one_paused_rotation_under_repeated_steps_and_a_restart(
        env: SimEnvironment, kube: KubeClient, bundle: SecretsBundle) -> None:
    await set_policy(kube, env, {"renewBefore": "30d"})
    env.management.requests.clear()
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        for _ in range(4):
            await actor.step({})
    ops = await planned(kube, env)
    assert [o["metadata"]["name"] for o in ops] == [expected_name(env, bundle)]
    (op,) = ops
    assert op["spec"]["paused"] is True and op["spec"]["kind"] == "ca-rotation"
    assert op["spec"]["caRotation"]["targets"] == ["talos", "kubernetes"]
    assert op["metadata"]["labels"] == {names.PLANNED_BY_LABEL: names.PLANNED_BY_RENEWAL}
    owner = op["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == (names.TALOS_CLUSTER, env.cluster_name)
    # The same step planned it (plan only: Pending, nothing applied).
    assert op["status"]["phase"] == names.Phase.PENDING and op["status"]["plan"]["targets"] == ["talos", "kubernetes"]
    assert creates(env) == 1

    cond = await rotation_due(kube, env)
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", names.RotationDueReason.AWAITING_APPROVAL)
    name = op["metadata"]["name"]
    start = (f"kubectl -n {env.namespace} patch talosoperation {name} --type merge -p "
             "'{\"spec\":{\"paused\":false}}'")
    assert start in cond["message"] and "talos (expires on" in cond["message"], cond["message"]
    planned_events = await events(kube, env, names.EventReason.ROTATION_PLANNED)
    assert len(planned_events) == 1 and planned_events[0]["type"] == "Normal"
    assert planned_events[0]["involvedObject"]["kind"] == names.TALOS_CLUSTER
    assert await events(kube, env, names.RotationDueReason.OPERATION_NOT_CREATED) == []

    # A restarted actor (new informers, nothing in memory): no second operation, no second Event, no write.
    env.management.requests.clear()
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
        await actor.step({})
    assert [o["metadata"]["name"] for o in await planned(kube, env)] == [name]
    assert creates(env) == 0
    assert len(await events(kube, env, names.EventReason.ROTATION_PLANNED)) == 1
    assert await rotation_due(kube, env) == cond

    # The operator starts it with the command as printed (here through the API): RotationUnderWay, no new Event.
    await crds.operations(kube).patch(env.namespace, name, {"spec": {"paused": False}})
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
    cond = await rotation_due(kube, env)
    assert cond is not None and cond["reason"] == names.RotationDueReason.ROTATION_UNDER_WAY, cond
    assert f"ichord cluster credentials {env.cluster_name} -n {env.namespace} --acknowledge" in cond["message"]
    assert len(await planned(kube, env)) == 1 and len(await events(kube, env, names.EventReason.ROTATION_PLANNED)) == 1


async def test_killed_between_the_create_and_the_condition_the_next_step_names_it_once(
        env: SimEnvironment, kube: KubeClient, bundle: SecretsBundle) -> None:
    """What a daemon killed at the failpoint renewal.created leaves: the operation, no condition, no Event."""
    await set_policy(kube, env, {"renewBefore": "30d"})
    cluster = ClusterView.of(await crds.clusters(kube).get(env.namespace, env.cluster_name))
    due = tuple(DueCA(t, bundle.ca(t.ca_kind).not_after, ca_fingerprint(bundle.ca(t.ca_kind)), "30d")
                for t in (Target.TALOS, Target.KUBERNETES))
    await crds.operations(kube).create(env.namespace, operation_body(cluster, expected_name(env, bundle), due,
                                                                     "Manual"))
    env.management.requests.clear()
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
        await actor.step({})
    assert creates(env) == 0
    assert [o["metadata"]["name"] for o in await planned(kube, env)] == [expected_name(env, bundle)]
    cond = await rotation_due(kube, env)
    assert cond is not None and cond["reason"] == names.RotationDueReason.AWAITING_APPROVAL
    assert len(await events(kube, env, names.EventReason.ROTATION_PLANNED)) == 1


async def test_automatic_starts_at_once_and_stops_at_the_credentials_hand_off(
        env: SimEnvironment, kube: KubeClient, bundle: SecretsBundle) -> None:
    await set_policy(kube, env, {"renewBefore": "30d", "approval": "Automatic"})
    name = expected_name(env, bundle)
    stage = ""
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        with anyio.fail_after(120):
            while stage != "AwaitingCredentials":
                outcome = await actor.step({})
                op = await crds.operations(kube).get(env.namespace, name)
                stage = ((op.get("status") or {}).get("caRotation") or {}).get("stage") or ""
                delay = outcome.after if isinstance(outcome, Requeue) else (
                    outcome.retry_after if isinstance(outcome, Blocked) else 0.05)
                await anyio.sleep(min(max(delay, 0.01), 0.2))
        # It waits there for the operator: more steps do not move it, and nothing else is created.
        for _ in range(3):
            await actor.step({})
    op = await crds.operations(kube).get(env.namespace, name)
    assert op["spec"]["paused"] is False
    assert op["status"]["caRotation"]["stage"] == "AwaitingCredentials"
    assert len(await planned(kube, env)) == 1
    cond = await rotation_due(kube, env)
    assert cond is not None and cond["reason"] == names.RotationDueReason.ROTATION_UNDER_WAY
    (event,) = await events(kube, env, names.EventReason.ROTATION_PLANNED)
    assert "approval Automatic" in event["message"] and "it starts now." in event["message"]


async def test_no_renew_before_plans_nothing(env: SimEnvironment, kube: KubeClient) -> None:
    await set_policy(kube, env, {"approval": "Automatic"})
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
        await actor.step({})
    assert await planned(kube, env) == []
    assert await rotation_due(kube, env) is None
    # The CAs are inside the expiry warning window all the same: CertificatesExpiring still says so.
    cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
    expiring = find(cluster["status"]["conditions"], names.CERTIFICATES_EXPIRING)
    assert expiring is not None and expiring["status"] == "True"


async def test_a_ca_outside_its_period_is_not_planned_and_the_condition_says_when(
        env: SimEnvironment, kube: KubeClient, bundle: SecretsBundle) -> None:
    await set_policy(kube, env, {"renewBefore": "10d", "renewBeforeByTarget": {"etcd": "60d"}})
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
        # Later steps cost the policy nothing: no write, and the step's one bundle read is shared with the machines.
        env.management.requests.clear()
        await actor.step({})
        await actor.step({})
        log = env.management.requests
        assert log.count("patch", resource="talosclusters") == 0
        assert log.count("get", resource="secrets") == 2
    assert await planned(kube, env) == []
    cond = await rotation_due(kube, env)
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", names.RotationDueReason.NOT_DUE)
    assert "the next is talos" in cond["message"] and "renewBefore 10d" in cond["message"], cond["message"]


@pytest.mark.parametrize("value", ["30 days", "0d", "30", "1.5h", "-1d", "30ms"])
async def test_a_malformed_renew_before_is_refused_by_the_schema(env: SimEnvironment, kube: KubeClient,
                                                                 value: str) -> None:
    for policy in ({"renewBefore": value}, {"renewBeforeByTarget": {"etcd": value}}):
        with pytest.raises(Invalid) as refused:
            await set_policy(kube, env, policy)
        assert "should match" in str(refused.value), str(refused.value)
    with pytest.raises(Invalid) as refused:
        await set_policy(kube, env, {"renewBefore": "30d", "approval": "Sometimes"})
    assert "Unsupported value" in str(refused.value)
    cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
    assert "caRotation" not in cluster["spec"]


async def test_a_renew_before_no_new_ca_can_meet_is_a_condition_and_plans_nothing(
        env: SimEnvironment, kube: KubeClient) -> None:
    await set_policy(kube, env, {"renewBefore": "30d", "renewBeforeByTarget": {"etcd": "3650d"}})
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
    assert await planned(kube, env) == []
    cond = await rotation_due(kube, env)
    assert cond is not None and (cond["status"], cond["reason"]) == ("False",
                                                                      names.RotationDueReason.INVALID_RENEW_BEFORE)
    assert "spec.caRotation.renewBeforeByTarget.etcd 3650d" in cond["message"]
    assert f"kubectl -n {env.namespace} edit taloscluster {env.cluster_name}" in cond["message"]


async def test_a_failed_planned_rotation_is_not_planned_again_for_the_same_cas(
        env: SimEnvironment, kube: KubeClient, bundle: SecretsBundle) -> None:
    """The name is the identity: a planned operation that failed keeps the same CAs from being planned twice."""
    await set_policy(kube, env, {"renewBefore": "30d"})
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
    name = expected_name(env, bundle)

    def failed(status: Obj, _obj: Obj) -> Obj:
        status["phase"] = names.Phase.FAILED
        return status

    await update_status(crds.operations(kube), env.namespace, name, failed)
    env.management.requests.clear()
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
        await actor.step({})
    assert creates(env) == 0 and [o["metadata"]["name"] for o in await planned(kube, env)] == [name]
    cond = await rotation_due(kube, env)
    assert cond is not None and cond["reason"] == names.RotationDueReason.ROTATION_FAILED
    assert f"kubectl -n {env.namespace} delete talosoperation {name}" in cond["message"]

    # Deleted, as the message says: planned again, under the same name (the same CAs).
    await crds.operations(kube).delete(env.namespace, name)
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
    assert [o["metadata"]["name"] for o in await planned(kube, env)] == [name]
    cond = await rotation_due(kube, env)
    assert cond is not None and cond["reason"] == names.RotationDueReason.AWAITING_APPROVAL


async def test_an_operation_made_meanwhile_by_another_leader_is_found_by_name(
        env: SimEnvironment, kube: KubeClient, bundle: SecretsBundle) -> None:
    """A step whose LIST did not show the operation (another leader created it in between) gets AlreadyExists on
    the same name and goes on with it: still one operation."""
    await set_policy(kube, env, {"renewBefore": "30d"})
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
    cluster = ClusterView.of(await crds.clusters(kube).get(env.namespace, env.cluster_name))
    env.management.requests.clear()
    recorder = EventRecorder(kube, instance="test")
    written: list[Obj] = []
    stale = RenewalPass(kube, recorder, cluster, [], TIMING.retry, dt.datetime.now(dt.UTC), written.append,
                        written.append)
    assert isinstance(await stale.run(lambda: _public(env)), Done)
    assert creates(env) == 1 and env.management.requests.count("create", resource="talosoperations",
                                                                status=409) == 1
    assert [o["metadata"]["name"] for o in await planned(kube, env)] == [expected_name(env, bundle)]


async def _public(env: SimEnvironment) -> SecretsBundle:
    assert env.bundle is not None
    return env.bundle


async def test_a_refused_create_is_a_condition_and_one_warning_then_planned_once_granted(
        env: SimEnvironment, kube: KubeClient, bundle: SecretsBundle) -> None:
    await set_policy(kube, env, {"renewBefore": "30d"})
    env.management.faults.denied = {("create", "talosoperations", env.namespace)}
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        for _ in range(3):
            await actor.step({})
    assert await planned(kube, env) == []
    cond = await rotation_due(kube, env)
    assert cond is not None and (cond["status"], cond["reason"]) == ("True",
                                                                      names.RotationDueReason.OPERATION_NOT_CREATED)
    assert "create" in cond["message"] and "talosoperations" in cond["message"], cond["message"]
    (warning,) = await events(kube, env, names.RotationDueReason.OPERATION_NOT_CREATED)
    assert warning["type"] == "Warning" and warning["count"] == 1
    assert await events(kube, env, names.EventReason.ROTATION_PLANNED) == []

    env.management.faults.denied = set()
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
    assert [o["metadata"]["name"] for o in await planned(kube, env)] == [expected_name(env, bundle)]
    cond = await rotation_due(kube, env)
    assert cond is not None and cond["reason"] == names.RotationDueReason.AWAITING_APPROVAL
    assert len(await events(kube, env, names.EventReason.ROTATION_PLANNED)) == 1


async def test_removing_the_policy_lowers_rotation_due(env: SimEnvironment, kube: KubeClient) -> None:
    await set_policy(kube, env, {"renewBefore": "3650d"})
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
        cond = await rotation_due(kube, env)
        assert cond is not None and cond["reason"] == names.RotationDueReason.INVALID_RENEW_BEFORE
        await set_policy(kube, env, None)
        await anyio.sleep(0.2)  # the informer's copy of the cluster
        await actor.step({})
    cond = await rotation_due(kube, env)
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", names.RotationDueReason.NOT_DUE)
    assert "sets no renewBefore" in cond["message"]
    assert await planned(kube, env) == []


async def test_the_next_renewal_period_of_new_cas_plans_a_new_operation(
        env: SimEnvironment, kube: KubeClient, bundle: SecretsBundle) -> None:
    await set_policy(kube, env, {"renewBefore": "30d"})
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
    first = expected_name(env, bundle)

    def completed(status: Obj, _obj: Obj) -> Obj:
        status["phase"] = names.Phase.COMPLETED
        return status

    await update_status(crds.operations(kube), env.namespace, first, completed)
    # The rotation's new CAs, themselves (for the test) already inside their period: another name, another plan.
    made = dt.datetime.now(dt.UTC) - CA_VALIDITY + dt.timedelta(days=5)
    renewed = bundle.with_cas({CAKind.OS: generate_ca(CAKind.OS, now=made),
                               CAKind.KUBERNETES: generate_ca(CAKind.KUBERNETES, now=made)})
    await kube.raw("PATCH", f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}",
                   body={"data": {names.SECRETS_KEY: base64.b64encode(renewed.to_yaml().encode()).decode()}},
                   content_type="application/merge-patch+json")
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        await actor.step({})
        await actor.step({})
    second = expected_name(env, renewed)
    assert second != first
    assert sorted(o["metadata"]["name"] for o in await planned(kube, env)) == sorted([first, second])
    cond = await rotation_due(kube, env)
    assert cond is not None and cond["reason"] == names.RotationDueReason.AWAITING_APPROVAL
    assert second in cond["message"]
    assert len(await events(kube, env, names.EventReason.ROTATION_PLANNED)) == 2


async def test_automatic_under_windows_waits_for_the_window_then_stops_at_the_hand_off(
        env: SimEnvironment, kube: KubeClient, bundle: SecretsBundle) -> None:
    """docs/decisions.md#maintenance-windows: the rotation the policy planned starts at once, but its first pass
    waits (InProgress, WaitingForWindow, one Normal Event) until the window opens; nothing is applied to a node
    before it (the simulator's history says so); then it runs to the hand-off as without windows."""
    opens = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=4)
    window = {"name": "soon", "start": opens.strftime("%Y-%m-%dT%H:%M:%SZ"),
              "end": (opens + dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"maintenance": {"windows": [window]}}})
    await set_policy(kube, env, {"renewBefore": "30d", "approval": "Automatic"})
    name = expected_name(env, bundle)
    since = len(env.talos.history.events)
    waited: list[Obj] = []
    stage = ""
    async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        with anyio.fail_after(120):
            while stage != "AwaitingCredentials":
                outcome = await actor.step({})
                op = await crds.operations(kube).get(env.namespace, name)
                cond = find((op.get("status") or {}).get("conditions"), names.CA_ROTATION) or {}
                if cond.get("reason") == names.WAITING_FOR_WINDOW:
                    waited.append(op)
                stage = ((op.get("status") or {}).get("caRotation") or {}).get("stage") or ""
                delay = outcome.after if isinstance(outcome, Requeue) else (
                    outcome.retry_after if isinstance(outcome, Blocked) else 0.05)
                await anyio.sleep(min(max(delay, 0.01), 0.2))
    assert waited, "the Accepting pass did not wait for the window"
    first = waited[0]["status"]
    assert first["phase"] == "InProgress" and first["caRotation"]["stage"] == "Accepting"
    message = find(first["conditions"], names.CA_ROTATION)["message"]  # type: ignore[index]
    assert message == (f"waiting for the maintenance window soon to start the Accepting pass: it opens at "
                       f"{window['start']}")
    applies = [e for e in env.talos.history.events[since:] if e["kind"] == "apply"]
    assert applies and all(e["wall"] >= opens.timestamp() for e in applies), applies[:1]
    waits = await events(kube, env, names.EventReason.WAITING_FOR_WINDOW)
    assert len(waits) == 1 and waits[0]["type"] == "Normal"
    (event,) = await events(kube, env, names.EventReason.ROTATION_PLANNED)
    assert "its passes wait for the cluster's maintenance windows" in event["message"]
