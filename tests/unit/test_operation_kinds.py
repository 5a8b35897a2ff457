"""Issue 29: a kind is one description (api/operation_kinds.py), and the code that asks about operations reads it.

A made-up kind, ``drill``, is described here and only here: it keeps its stage and step in ``status.drill``,
reports in a ``Drilled`` condition, holds the machine reconciler off the nodes and excludes other operations while
under way. The views, the backbone's lock exclusion and stage mirror, the actor's scope and ``ichord cluster status``
answer for it correctly without a line of them changed; ``ca-rotation`` and ``config`` answer as before.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import Any, cast

import pytest

from ichord.api import names, operation_kinds
from ichord.api.operation_kinds import KINDS, KindDescription, describe, register
from ichord.api.views import MachineView, OperationView
from ichord.cluster_status import ClusterView, format_status, next_step
from ichord.kube.client import KubeClient
from ichord.kube.events import EventRecorder
from ichord.machines.reconciler import reconcile_machine
from ichord.operations import backbone
from ichord.operations.backbone import OperationKind
from ichord.operations.kinds import default_registry
from ichord.operations.lock import Exclusion
from ichord.operations.outcome import Done
from ichord.operations.registry import Operation, Registry
from ichord.operations.scope import ClusterScope
from ichord.pki.bundle import SecretsBundle
from ichord.render.inputs import ClusterInputs
from ichord.settings import Timing
from ichord.talos.client import TalosClient

Obj = dict[str, Any]
NS = "ops"
NOW = dt.datetime(2026, 12, 1, 17, 0, 0, tzinfo=dt.UTC)

DRILL = KindDescription(name="drill", condition_type="Drilled", finalizer="example.test/drill", title="a drill",
                        section="drill", holds_machines=True, excludes_others=True, awaits_credentials="Surveying",
                        abandonable=lambda op: op.stage != "Boring")
#: A kind that keeps its stage at status.stage and neither holds nor excludes (as ``config`` does).
PROBE = KindDescription(name="probe", condition_type="Probed", finalizer="example.test/probe", title="a probe")


@pytest.fixture
def described() -> Iterator[None]:
    register(DRILL)
    register(PROBE)
    try:
        yield
    finally:
        del KINDS[DRILL.name], KINDS[PROBE.name]


def op(kind: str, name: str = "op-1", *, status: Obj | None = None, uid: str = "u1") -> Obj:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid, "creationTimestamp": "2026-12-01T16:00:00Z"},
            "spec": {"clusterRef": {"name": "demo"}, "kind": kind}, "status": status or {}}


def drilling(stage: str = "Boring", phase: str = "InProgress") -> Obj:
    cond = {"type": "Drilled", "status": "False", "reason": "AwaitingBit", "message": "the bit is on its way",
            "lastTransitionTime": "2026-12-01T16:30:00Z"}
    return {"phase": phase, "drill": {"stage": stage, "step": "bore"}, "conditions": [cond]}


def test_a_described_kind_is_registered_once(described: None) -> None:
    assert describe("drill") is DRILL
    with pytest.raises(ValueError, match="described twice"):
        register(DRILL)
    assert describe("no-such-kind") is None


def test_the_view_reads_stage_condition_and_properties_where_the_description_says(described: None) -> None:
    view = OperationView.of(op("drill", status=drilling()))
    assert (view.description, view.condition_type, view.stage, view.step) == (DRILL, "Drilled", "Boring", "bore")
    assert view.condition() is not None and view.condition()["reason"] == "AwaitingBit"  # type: ignore[index]
    assert view.under_way and view.holds_machines and view.excludes_others
    assert not DRILL.abandonable(view) and DRILL.abandonable(OperationView.of(op("drill", status=drilling("Digging"))))
    # Not started, or done: nothing held, nobody excluded.
    for status in ({}, drilling("Done"), drilling(phase="Completed")):
        quiet = OperationView.of(op("drill", status=status))
        assert not quiet.holds_machines and not quiet.excludes_others, status
    # A kind at status.stage that neither holds nor excludes.
    probe = OperationView.of(op("probe", status={"phase": "InProgress", "stage": "Probing", "step": "ping"}))
    assert (probe.condition_type, probe.stage, probe.step) == ("Probed", "Probing", "ping")
    assert probe.under_way and not probe.holds_machines and not probe.excludes_others
    assert not PROBE.abandonable(probe)  # a description that gives no abandon rule is held on a delete, never guessed


def test_the_known_kinds_answer_as_before() -> None:
    rotation = OperationView.of(op("ca-rotation", status={"phase": "InProgress", "stage": "stale",
                                                          "caRotation": {"stage": "Issuing", "step": "verify"}}))
    assert (rotation.condition_type, rotation.stage, rotation.step) == ("CARotation", "Issuing", "verify")
    assert rotation.holds_machines and rotation.excludes_others
    config = OperationView.of(op("config", status={"phase": "InProgress", "stage": "Rolling", "step": "drain"}))
    assert (config.condition_type, config.stage, config.step) == ("ConfigRollout", "Rolling", "drain")
    assert config.under_way and not config.holds_machines and not config.excludes_others
    assert operation_kinds.CONFIG.abandonable(config)  # deleting a rollout gives back its cordons
    unknown = OperationView.of(op("drill", status=drilling()))  # not described outside the fixture
    assert (unknown.description, unknown.condition_type, unknown.stage) == (None, "Succeeded", "")
    assert not unknown.holds_machines and not unknown.excludes_others


def test_the_lock_refuses_beside_an_excluding_kind_only(described: None) -> None:
    drill = OperationView.of(op("drill", "d", status=drilling(), uid="drill-uid"))
    probe = OperationView.of(op("probe", "p", status={"phase": "InProgress", "stage": "Probing"}, uid="probe-uid"))
    assert backbone.other_under_way([drill, probe], "probe-uid") == "drill-uid"
    assert backbone.other_under_way([drill, probe], "drill-uid") is None  # itself, and a probe excludes nobody
    done = OperationView.of(op("drill", "d", status=drilling("Done"), uid="drill-uid"))
    assert backbone.other_under_way([done, probe], "probe-uid") is None


def test_the_backbone_mirrors_a_sections_stage_to_the_printer_columns(described: None) -> None:
    obj = op("drill", status=drilling())
    status = obj["status"]
    assert backbone.stage_of(status) == "Boring"
    backbone.mirror_stage(status, obj)
    assert (status["stage"], status["step"]) == ("Boring", "bore")
    plain = op("probe", status={"stage": "Probing"})
    backbone.mirror_stage(plain["status"], plain)
    assert plain["status"] == {"stage": "Probing"}


def test_the_actors_scope_holds_machines_off_for_a_holding_kind(described: None) -> None:
    def scope(*ops: Obj) -> ClusterScope:
        return ClusterScope(cast(KubeClient, None), "ichord", NS, "demo", None, [],
                            [OperationView.of(o) for o in ops], cast(EventRecorder, None), Timing())

    held = scope(op("probe", "p", status={"phase": "InProgress", "stage": "Probing"}, uid="probe-uid"),
                 op("drill", "d", status=drilling(), uid="drill-uid")).machines_held_by
    assert held is not None and held.uid == "drill-uid"
    assert scope(op("probe", status={"phase": "InProgress", "stage": "Probing"})).machines_held_by is None
    assert scope(op("drill", status=drilling(phase="Completed"))).machines_held_by is None


@pytest.mark.anyio
async def test_the_reconciler_stands_aside_for_a_holding_kind_in_its_words(described: None) -> None:
    """Issue 29: a holding kind that rotates no CA: Ready=Unknown/OperationUnderWay, its title and name in the
    message, the node not touched; ca-rotation keeps CARotationInProgress."""
    machine = MachineView.of({"metadata": {"namespace": NS, "name": "w1"},
                              "spec": {"clusterRef": {"name": "demo"}, "role": "worker", "address": "10.0.0.9",
                                       "approved": True}})

    async def ready(holder: Obj) -> tuple[str, str, str]:
        # No Talos client, no bundle, no cluster: standing aside uses none of them.
        result = await reconcile_machine(cast(TalosClient, None), cast(SecretsBundle, None),
                                         cast(ClusterInputs, None), machine, held_by=OperationView.of(holder),
                                         retry_after=30.0, resync_after=300.0, now=NOW)
        assert not result.applied and result.event is None
        return result.ready.status, result.ready.reason, result.ready.message

    status, reason, message = await ready(op("drill", "bore-1", status=drilling()))
    assert (status, reason) == ("Unknown", names.ReadyReason.OPERATION_UNDER_WAY)
    assert message.startswith(f"a drill (TalosOperation {NS}/bore-1) is under way") and "rotation" not in message
    rotation = op("ca-rotation", "rotate", status={"phase": "InProgress", "caRotation": {"stage": "Issuing"}})
    status, reason, message = await ready(rotation)
    assert (status, reason) == ("Unknown", names.ReadyReason.CA_ROTATION_IN_PROGRESS)
    assert message.startswith(f"a CA rotation (TalosOperation {NS}/rotate) is under way")


def test_the_lock_refusal_names_an_excluding_kind_by_its_title(described: None) -> None:
    """Issue 29: beside a drill the lock refuses with ClusterOperationExclusive and the drill's title; beside a
    ca-rotation with ClusterCARotating, as users, the runbook and alerts know it."""
    drill = Exclusion("drill-uid", f"{NS}/bore-1", describe("drill"))
    reason, message = drill.refusal("demo")
    assert reason == names.LockRefusal.CLUSTER_OPERATION_EXCLUSIVE
    assert message == f"a drill (operation {NS}/bore-1) is under way on cluster demo; this operation waits until it " \
        "completes"
    reason, message = Exclusion("rot-uid", f"{NS}/rotate", operation_kinds.CA_ROTATION).refusal("demo")
    assert reason == names.LockRefusal.CLUSTER_CA_ROTATING
    assert message.startswith(f"a CA rotation (operation {NS}/rotate) is under way on cluster demo")


def test_cluster_status_reads_the_description(described: None) -> None:
    cluster = {"metadata": {"name": "demo", "namespace": NS}, "status": {"conditions": []}}
    view = ClusterView(NS, "demo", cluster, [], [op("drill", "drill-1", status=drilling())])
    out = format_status(view, NOW)
    assert "drill-1  drill  phase InProgress  stage Boring  step bore" in out
    assert "waiting for: AwaitingBit: the bit is on its way" in out
    assert "Rotating" not in out  # a drill rotates no CA: no CA table, no ROTATION column
    # The stage in which its description says the operator runs `ichord cluster credentials`.
    assert next_step(op("drill", status=drilling("Surveying")), "demo", NS) == \
        f"ichord cluster credentials demo -n {NS} --acknowledge"
    assert next_step(op("drill", status=drilling()), "demo", NS) == "nothing: the daemon is working on it"


def test_the_table_holds_the_known_kinds() -> None:
    assert set(KINDS) == {"ca-rotation", "config"}
    assert KINDS["ca-rotation"] is operation_kinds.CA_ROTATION and KINDS["config"] is operation_kinds.CONFIG


async def _never_advances(_scope: Any, _op: OperationView) -> Done:
    raise AssertionError("not stepped here")


def test_registering_a_kinds_behaviour_is_its_one_registration_line() -> None:
    """Issue 29: ``Registry.register`` of a behaviour that carries its description puts that description in the
    table the views read; registering ichord's own kinds again (every registry built) changes nothing; another
    description under a registered name is refused, and nothing of it is registered."""
    registry = Registry()
    try:
        registry.register(Operation(OperationKind(PROBE), _never_advances))
        assert describe("probe") is PROBE and "probe" in registry.kinds
        assert OperationView.of(op("probe")).condition_type == "Probed"
    finally:
        KINDS.pop(PROBE.name, None)
    default_registry()
    assert set(KINDS) == {"ca-rotation", "config"}
    impostor = dataclasses.replace(operation_kinds.CONFIG, condition_type="Impostor")
    fresh = Registry()
    with pytest.raises(ValueError, match="described twice"):
        fresh.register(Operation(OperationKind(impostor), _never_advances))
    assert fresh.kinds == {} and KINDS["config"] is operation_kinds.CONFIG
