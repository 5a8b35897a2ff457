"""The ca-rotation's lifecycle around the stages: the lock, the finalizer, stage transitions, failing and
letting go. Each helper writes status through ``status.write`` (scrubbed) and is idempotent."""

from __future__ import annotations

import contextlib

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.conditions import Condition, find, set_condition, set_operation_phase
from ichord.api.names import CARotationReason, Phase
from ichord.kube import crds
from ichord.kube.errors import Conflict, KubeError, NotFound
from ichord.kube.events import ObjectRef
from ichord.kube.status import update_status
from ichord.operations.ca_rotation.context import Inputs, Obj, RotationContext
from ichord.operations.ca_rotation.plan import certificates_status, verify_dial
from ichord.operations.ca_rotation.status import (
    APPLY_STEP,
    Mutation,
    blocked,
    in_progress,
    log_transition,
    step,
    write,
)
from ichord.operations.lock import acquire_disruptive_lock, release_lock
from ichord.operations.outcome import Blocked, Failed, Outcome
from ichord.pki.rotation import Rotation, Target
from ichord.pki.scrub import SCRUBBER
from ichord.talos.dial import DialBundle

KIND = "ca-rotation"


def is_ca_rotation(op: Obj) -> bool:
    return (op.get("spec") or {}).get("kind") == KIND


def hand_trust(ctx: RotationContext, rotation: Rotation, current_k8s_pem: bytes) -> None:
    new = rotation.new.get(Target.KUBERNETES)
    if new is not None:
        # public parts only; the keys never leave the Secret. The current CA lets the hook tell whether
        # this is the cluster ichord's own API server belongs to.
        ctx.trust_hook(new.cert_pem, current_k8s_pem)


def issuing_dial(inputs: Inputs, rotation: Rotation) -> DialBundle:
    return verify_dial(inputs.bundle, rotation, Stage.ISSUING)


def ca_reason(inputs: Inputs) -> str | None:
    for c in inputs.status.get("conditions") or []:
        if c.get("type") == names.CA_ROTATION:
            return str(c.get("reason"))
    return None


def stage_mutations(ctx: RotationContext, inputs: Inputs, rotation: Rotation, stage: Stage) -> list[Mutation]:
    certs = certificates_status(inputs.bundle, rotation, stage)

    def m(s: Obj) -> None:
        ca = s.setdefault("caRotation", {})
        ca["stage"] = stage.value
        ca["targets"] = [t.value for t in rotation.targets]
        ca["certificates"] = certs
        ca.pop("step", None)  # a new stage starts at its first step
        s["machines"] = []  # emptied when the stage changes

    return [m, step(APPLY_STEP, ctx.now())]


async def enter(ctx: RotationContext, inputs: Inputs, rotation: Rotation, stage: Stage,
                 extra: list[Mutation] | None = None) -> None:
    message = f"stage {stage.value}"
    await write(ctx, inputs, *stage_mutations(ctx, inputs, rotation, stage), *(extra or []),
                *in_progress(ctx, CARotationReason.IN_PROGRESS, message))
    log_transition(inputs, "ca-rotation stage", to=stage.value)


async def enter_finalizing(ctx: RotationContext, inputs: Inputs) -> None:
    def m(s: Obj) -> None:
        ca = s.setdefault("caRotation", {})
        ca["stage"] = Stage.FINALIZING.value
        s["machines"] = []

    await write(ctx, inputs, m, *in_progress(ctx, CARotationReason.IN_PROGRESS,
                                             "stage Finalizing: the bundle Secret holds the new CAs"))
    log_transition(inputs, "ca-rotation stage", to=Stage.FINALIZING.value)


async def lock(ctx: RotationContext, inputs: Inputs) -> Outcome | None:
    """Take or renew the cluster lock; the refusal as a Blocked outcome (status written) otherwise."""
    other = await other_rotation(ctx, inputs)
    decision = await acquire_disruptive_lock(
        ctx.kube, ctx.namespace, inputs.cluster_name, inputs.uid,
        approved_control_planes=len(inputs.control_planes), rotating_operation_uid=other,
        duration=ctx.timing.cluster_lock_duration, now=ctx.now)
    if decision.acquired:
        return None
    return await blocked(ctx, inputs, decision.message, reason=decision.reason)


async def other_rotation(ctx: RotationContext, inputs: Inputs) -> str | None:
    ops, _ = await crds.operations(ctx.kube).list_objects(inputs.op_namespace)
    for op in ops:
        uid = str((op.get("metadata") or {}).get("uid"))
        ref = ((op.get("spec") or {}).get("clusterRef") or {}).get("name")
        st = op.get("status") or {}
        if (uid != inputs.uid and ref == inputs.cluster_name and is_ca_rotation(op)
                and (st.get("caRotation") or {}).get("stage") and st.get("phase") != Phase.COMPLETED
                and (st.get("caRotation") or {}).get("stage") != Stage.DONE.value):
            return uid
    return None


async def ensure_finalizer(ctx: RotationContext, inputs: Inputs) -> None:
    meta = inputs.op["metadata"]
    finalizers = list(meta.get("finalizers") or [])
    if names.CA_ROTATION_FINALIZER in finalizers:
        return
    inputs.op = await crds.operations(ctx.kube).patch(inputs.op_namespace, inputs.name, {"metadata": {
        "resourceVersion": meta["resourceVersion"], "finalizers": [*finalizers, names.CA_ROTATION_FINALIZER]}})


async def let_go(ctx: RotationContext, op: Obj) -> None:
    """Release the lock (only if this operation holds it) and remove the finalizer; idempotent."""
    meta = op.get("metadata") or {}
    ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
    cluster = str(((op.get("spec") or {}).get("clusterRef") or {}).get("name") or "")
    if cluster:
        await release_lock(ctx.kube, ctx.namespace, cluster, uid)
    finalizers = list(meta.get("finalizers") or [])
    if names.CA_ROTATION_FINALIZER not in finalizers:
        return
    rest = [f for f in finalizers if f != names.CA_ROTATION_FINALIZER]
    try:
        await crds.operations(ctx.kube).patch(ns, name, {"metadata": {
            "resourceVersion": meta.get("resourceVersion"), "finalizers": rest or None}})
    except (NotFound, Conflict):
        return  # gone already, or changed: the next step sees the fresh object


async def fail(ctx: RotationContext, op: Obj, reason: str, message: str) -> Outcome:
    message = SCRUBBER.text(message)
    meta = op["metadata"]
    now = ctx.now()

    def mutate(status: Obj, obj: Obj) -> Obj:
        generation = int((obj.get("metadata") or {}).get("generation") or 0)
        set_operation_phase(status, Phase.FAILED, message, now=now, observed_generation=generation)
        status["conditions"] = set_condition(status.get("conditions"),
                                             Condition(names.CA_ROTATION, "False", reason, message), now=now)
        return status

    await update_status(crds.operations(ctx.kube), meta["namespace"], meta["name"], mutate)
    return Failed(reason, message)


async def blocked_without_inputs(ctx: RotationContext, op: Obj, message: str) -> Outcome:
    message = SCRUBBER.text(message)
    meta = op["metadata"]
    now = ctx.now()

    def mutate(status: Obj, obj: Obj) -> Obj:
        generation = int((obj.get("metadata") or {}).get("generation") or 0)
        set_operation_phase(status, Phase.PAUSED, message, now=now, observed_generation=generation)
        status["conditions"] = set_condition(
            status.get("conditions"), Condition(names.CA_ROTATION, "False", CARotationReason.BLOCKED, message),
            now=now)
        return status

    before = find((op.get("status") or {}).get("conditions"), names.CA_ROTATION)
    with contextlib.suppress(KubeError):
        await update_status(crds.operations(ctx.kube), meta["namespace"], meta["name"], mutate)
        if before is None or (before.get("reason"), before.get("message")) != (CARotationReason.BLOCKED, message):
            ctx.recorder.record(ObjectRef.of(op), "Warning", names.EventReason.OPERATION_BLOCKED, message)
    return Blocked(CARotationReason.BLOCKED, message, ctx.timing.retry)
