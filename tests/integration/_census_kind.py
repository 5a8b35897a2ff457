"""Issue 29: a made-up operation kind, ``census``, written only in this file, the way a real kind is written
(docs/architecture.md#how-to-add-an-operation-kind) but without touching ichord: it reads each approved node's Talos
version over mutual TLS (the cluster's own bundle, as every kind dials) and records it, one node per step.

    stage       what one step does                                               abandonable on delete
    ''          paused: the plan only; else the finalizer, the lock, Surveying   yes (nothing started)
    Surveying   Version of the next unread machine -> status.census.versions     yes (nothing to undo)
    Confirming  Version of every machine again; all as recorded -> Done          no: DeletionHeld, runs on
    Done        Completed, the lock released, the finalizer removed              -

Confirming is held on delete only to show the other branch of docs/decisions.md#abandon-or-hold on a kind
that is not ca-rotation; a read-only survey would have nothing to protect.

The CRD ichord ships admits only its own kinds: ``census_crd`` is the copy a test serves, with ``census`` in
``spec.kind``'s enum and the ``status.census`` section (what step 3 of the how-to adds to the chart's CRD).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from ichord.api import names, operation_kinds
from ichord.api.names import Phase
from ichord.api.operation_kinds import KindDescription
from ichord.api.views import OperationView
from ichord.kube.events import ObjectRef
from ichord.operations import backbone, deletion
from ichord.operations.backbone import OperationKind
from ichord.operations.managed.context import StepContext, context_of
from ichord.operations.managed.inputs import Inputs, InputsError, load_inputs
from ichord.operations.outcome import Done, Outcome, Requeue
from ichord.operations.registry import Operation
from ichord.operations.scope import ClusterScope
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosError

Obj = dict[str, Any]

KIND = "census"
CONDITION = "Census"
SECTION = "census"
SURVEYING = "Surveying"
CONFIRMING = "Confirming"
SURVEYED = "Surveyed"
VERSION_CHANGED = "VersionChanged"
#: The stages a deleted census may be abandoned in (docs/decisions.md#abandon-or-hold).
ABANDONABLE = frozenset({"", SURVEYING})


def _abandonable(op: OperationView) -> bool:
    return op.stage in ABANDONABLE


DESCRIPTION = KindDescription(KIND, CONDITION, f"{names.GROUP}/census", "a census", section=SECTION,
                              abandonable=_abandonable)
CENSUS = OperationKind(DESCRIPTION)


#: The census as a kind that, under way, holds the machine reconciler off the nodes and excludes other operations
#: (as ca-rotation does) while rotating no CA: the reconciler and the lock say so in its own words.
HOLDING = dataclasses.replace(DESCRIPTION, holds_machines=True, excludes_others=True)


def census_operation(description: KindDescription = DESCRIPTION) -> Operation:
    """The kind's behaviour, carrying its description: ``Registry.register`` of it is the one registration line (it
    puts the description in ichord's table of kinds too). ``advance`` answers to the name, condition and finalizer,
    which ``HOLDING`` shares with ``DESCRIPTION``."""
    return Operation(OperationKind(description), advance)


def _versions(status: Obj) -> dict[str, str]:
    return dict((status.get(SECTION) or {}).get("versions") or {})


def _section(**fields: Any) -> backbone.Mutation:
    """Set fields of status.census (None: remove the field)."""
    def m(status: Obj) -> None:
        section = status.setdefault(SECTION, {})
        section.update({k: v for k, v in fields.items() if v is not None})
        for k in [k for k, v in fields.items() if v is None]:
            section.pop(k, None)

    return m


def _recorded(machine: str, tag: str) -> backbone.Mutation:
    """One node's version added to the versions of the status as freshly read (never a copy from before)."""
    def m(status: Obj) -> None:
        status.setdefault(SECTION, {}).setdefault("versions", {})[machine] = tag

    return m


async def advance(scope: ClusterScope, op: OperationView) -> Outcome:
    ctx = context_of(scope)
    if op.finished or (op.deleting and CENSUS.finalizer not in op.finalizers):
        await backbone.let_go(ctx, CENSUS, op.obj)
        return Done()
    if deletion.must_abandon(CENSUS, op.obj):
        message = f"census {op.name} was deleted in {op.stage or 'Pending'} and abandoned: nothing to undo"
        ctx.recorder.record(ObjectRef.of(op.obj), "Normal", names.EventReason.OPERATION_ABANDONED, message)
        await backbone.let_go(ctx, CENSUS, op.obj)
        return Done()
    try:
        inputs = await load_inputs(ctx, op.obj)
    except InputsError as exc:
        return await backbone.blocked_before_read(ctx, CENSUS, op.obj, exc.message)
    other = backbone.other_under_way(scope.operations, inputs.uid)
    if not op.stage:
        return await _start(ctx, op, inputs, other)
    refused = await backbone.lock(ctx, CENSUS, inputs, approved_control_planes=len(inputs.control_planes),
                                  other_under_way=other)
    if refused is not None:
        return refused
    if op.deleting:
        await deletion.hold_deletion(ctx, CENSUS, inputs, op.stage, "The census reads versions only.")
    if op.paused:
        return await backbone.hold_paused(ctx, CENSUS, inputs, op.stage)
    await backbone.resume_if_paused(ctx, CENSUS, inputs, op.stage)
    if op.stage == SURVEYING:
        return await _survey(ctx, inputs)
    if op.stage == CONFIRMING:
        return await _confirm(ctx, inputs)
    await backbone.let_go(ctx, CENSUS, inputs.op)
    return Done()


async def _start(ctx: StepContext, op: OperationView, inputs: Inputs, other: str | None) -> Outcome:
    plan = {"machines": [{"name": m.name, "role": m.role, "order": i + 1} for i, m in enumerate(inputs.machines)]}
    if op.paused:
        await backbone.plan_only(ctx, CENSUS, inputs, plan)
        return Done()
    await backbone.ensure_finalizer(ctx, CENSUS, inputs)
    refused = await backbone.lock(ctx, CENSUS, inputs, approved_control_planes=len(inputs.control_planes),
                                  other_under_way=other)
    if refused is not None:
        return refused
    await backbone.write(ctx, inputs, lambda s: s.__setitem__("plan", plan), _section(stage=SURVEYING, versions={}),
                         *backbone.in_progress(ctx, CENSUS, backbone.IN_PROGRESS, "reading each node's version"))
    backbone.log_transition(CENSUS, inputs, "census started")
    return Requeue(0.0, f"stage {SURVEYING}")


async def _survey(ctx: StepContext, inputs: Inputs) -> Outcome:
    """One machine a step: its version over mutual TLS, recorded before the next is read."""
    versions = _versions(inputs.status)
    unread = [m for m in inputs.machines if m.name not in versions]
    if not unread:
        await backbone.write(ctx, inputs, _section(stage=CONFIRMING, step=None))
        return Requeue(0.0, f"stage {CONFIRMING}")
    machine = unread[0]
    await backbone.write(ctx, inputs, backbone.step(f"reading {machine.name}", ctx.now(), section=SECTION))
    async with ctx.talos_factory(DialBundle.from_bundle(inputs.bundle)) as talos:
        try:
            info = await talos.version(machine.address)
        except TalosError as exc:
            return await backbone.blocked(ctx, CENSUS, inputs, f"cannot read the version of {machine.name}: {exc}")
    await backbone.write(ctx, inputs, _recorded(machine.name, info.tag),
                         *backbone.in_progress(ctx, CENSUS, backbone.IN_PROGRESS,
                                               f"read {len(versions) + 1} of {len(inputs.machines)} nodes"))
    return Requeue(0.0, f"read {machine.name}")


async def _confirm(ctx: StepContext, inputs: Inputs) -> Outcome:
    """Every recorded version read again: a node that changed under the census blocks it (said, retried)."""
    versions = _versions(inputs.status)
    await backbone.write(ctx, inputs, backbone.step("reading every node again", ctx.now(), section=SECTION))
    changed = []
    async with ctx.talos_factory(DialBundle.from_bundle(inputs.bundle)) as talos:
        for machine in inputs.machines:
            try:
                tag = (await talos.version(machine.address)).tag
            except TalosError as exc:
                return await backbone.blocked(ctx, CENSUS, inputs, f"cannot read the version of {machine.name}: {exc}")
            if tag != versions.get(machine.name):
                changed.append(f"{machine.name} ({versions.get(machine.name)} -> {tag})")
    if changed:
        return await backbone.blocked(ctx, CENSUS, inputs, "changed during the census: " + ", ".join(changed),
                                      reason=VERSION_CHANGED)
    message = f"{len(versions)} nodes: " + ", ".join(sorted(set(versions.values())))
    await backbone.write(ctx, inputs, _section(stage=operation_kinds.DONE_STAGE, step=None),
                         backbone.phase(ctx, Phase.COMPLETED, message),
                         backbone.condition(ctx, CENSUS, "True", SURVEYED, message))
    backbone.log_transition(CENSUS, inputs, "census done")
    await backbone.let_go(ctx, CENSUS, inputs.op)
    return Done()


def census_crd(chart_crd: Obj) -> Obj:
    """The chart's TalosOperation CRD with ``census`` admitted: its name in spec.kind's enum and its status section."""
    crd = copy.deepcopy(chart_crd)
    for version in crd["spec"]["versions"]:
        props = version["schema"]["openAPIV3Schema"]["properties"]
        props["spec"]["properties"]["kind"]["enum"].append(KIND)
        props["status"]["properties"][SECTION] = {
            "description": "The census: its stage, step and each node's Talos version.", "type": "object",
            "properties": {"stage": {"type": "string"}, "step": {"type": "string"},
                           "stepSince": {"type": "string", "format": "date-time"},
                           "versions": {"type": "object", "additionalProperties": {"type": "string"}}}}
    return crd

