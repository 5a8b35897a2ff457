"""The ca-rotation around its stages: trust hand-off, stage transitions, and the backbone's lock, finalizer,
fail and let-go bound to the CARotation kind. Each helper writes status through ``status.write`` (scrubbed)
and is idempotent."""

from __future__ import annotations

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.names import CARotationReason
from ichord.api.views import OperationView
from ichord.kube import crds
from ichord.operations import backbone
from ichord.operations.ca_rotation.plan import certificates_status, verify_dial
from ichord.operations.ca_rotation.status import (
    APPLY_STEP,
    CA_ROTATION,
    Mutation,
    in_progress,
    log_transition,
    step,
    write,
)
from ichord.operations.managed.context import Obj, StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.operations.outcome import Blocked, Failed
from ichord.pki.rotation import Rotation, Target
from ichord.talos.dial import DialBundle


def hand_trust(ctx: StepContext, rotation: Rotation, current_k8s_pem: bytes) -> None:
    new = rotation.new.get(Target.KUBERNETES)
    if new is not None:
        # public parts only; the keys never leave the Secret. The current CA lets the hook tell whether
        # this is the cluster ichord's own API server belongs to.
        ctx.trust_hook(new.cert_pem, current_k8s_pem)


def issuing_dial(inputs: Inputs, rotation: Rotation) -> DialBundle:
    return verify_dial(inputs.bundle, rotation, Stage.ISSUING)


def ca_reason(inputs: Inputs) -> str | None:
    cond = OperationView.of(inputs.op).condition(names.CA_ROTATION)
    return str(cond.get("reason")) if cond else None


def stage_mutations(ctx: StepContext, inputs: Inputs, rotation: Rotation, stage: Stage) -> list[Mutation]:
    certs = certificates_status(inputs.bundle, rotation, stage)

    def m(s: Obj) -> None:
        ca = s.setdefault("caRotation", {})
        before = str(ca.get("stage") or "")
        ca["stage"] = stage.value
        ca["targets"] = [t.value for t in rotation.targets]
        ca["certificates"] = certs
        ca.pop("step", None)  # a new stage starts at its first step
        ca.pop("apiServerInstances", None)  # per stage, like status.machines
        # Emptied when the stage changes, but for the per-node CA view the last verification read, kept (under
        # the stage it was read in) until the new stage's pass reads the machine again.
        s["machines"] = [{"name": e["name"], "state": before, "message": f"runs {before}; {stage.value} not yet",
                          "cas": e["cas"]} for e in s.get("machines") or []
                         if before and isinstance(e, dict) and e.get("name") and e.get("cas")]
        if Target.ETCD in rotation.targets:
            # The etcd roll's per-stage record starts again (docs/decisions.md#etcd-reboot-roll); etcdRestartedAt stays.
            ca["etcdRestarted"] = []
            ca.pop("etcdRebooting", None)
            ca.pop("etcdRebootBootID", None)

    if stage is Stage.AWAITING_CREDENTIALS:
        return [m]  # a hold for the operator, no pass: no step (the STEP column shows none)
    return [m, step(APPLY_STEP, ctx.now())]


async def enter(ctx: StepContext, inputs: Inputs, rotation: Rotation, stage: Stage,
                extra: list[Mutation] | None = None) -> None:
    message = f"stage {stage.value}"
    await write(ctx, inputs, *stage_mutations(ctx, inputs, rotation, stage), *(extra or []),
                *in_progress(ctx, CARotationReason.IN_PROGRESS, message))
    log_transition(inputs, "ca-rotation stage", to=stage.value)


async def enter_finalizing(ctx: StepContext, inputs: Inputs, first_step: str) -> None:
    def m(s: Obj) -> None:
        ca = s.setdefault("caRotation", {})
        ca["stage"] = Stage.FINALIZING.value
        ca.pop("step", None)
        ca.pop("apiServerInstances", None)
        s["machines"] = []
        if "etcdRestarted" in ca:
            ca["etcdRestarted"] = []  # per stage, like status.machines; Finalizing reboots nothing

    await write(ctx, inputs, m, step(first_step, ctx.now()),
                *in_progress(ctx, CARotationReason.IN_PROGRESS,
                             "stage Finalizing: the bundle Secret holds the new CAs"))
    log_transition(inputs, "ca-rotation stage", to=Stage.FINALIZING.value)


async def lock(ctx: StepContext, inputs: Inputs) -> Blocked | None:
    """Take or renew the cluster lock; the refusal as a Blocked outcome (status written) otherwise."""
    return await backbone.lock(ctx, CA_ROTATION, inputs, approved_control_planes=len(inputs.control_planes),
                               other_under_way=await other_rotation(ctx, inputs))


async def other_rotation(ctx: StepContext, inputs: Inputs) -> str | None:
    """Another ca-rotation of the cluster under way (from the step's scope; listed when there is none)."""
    operations = ctx.operations
    if operations is None:
        objs, _ = await crds.operations(ctx.kube).list_objects(inputs.op_namespace)
        operations = [OperationView.of(o) for o in objs]
    ours = [op for op in operations if op.of_cluster(inputs.op_namespace, inputs.cluster_name)]
    return backbone.other_under_way(ours, inputs.uid)


async def ensure_finalizer(ctx: StepContext, inputs: Inputs) -> None:
    await backbone.ensure_finalizer(ctx, CA_ROTATION, inputs)


async def let_go(ctx: StepContext, op: Obj) -> None:
    """Release the lock (only if this operation holds it) and remove the finalizer; idempotent."""
    await backbone.let_go(ctx, CA_ROTATION, op)


async def fail(ctx: StepContext, op: Obj, reason: str, message: str) -> Failed:
    return await backbone.fail(ctx, CA_ROTATION, op, reason, message)


async def blocked_without_inputs(ctx: StepContext, op: Obj, message: str) -> Blocked:
    return await backbone.blocked_before_read(ctx, CA_ROTATION, op, message)
