"""Deleting a ca-rotation that is under way (docs/decisions.md#abandon-or-hold): abandon it, or hold the delete.

``api.abandonable`` decides (RotationAbandonable). An abandonable rotation is let go at once, every step
idempotent and the whole retried on any error:

    1. rotation.yaml removed from the bundle Secret (an update refused if the Secret changed; only when it is
       this rotation's: the CAs match status, or, before the first stage, no other rotation is under way)
    2. the control plane an etcd roll left cordoned is uncordoned (spec.hostname, status.nodeName or the name)
    3. a Warning Event on the cluster naming what is left for the operator
    4. the lock released and the finalizer removed (the backbone's let-go)

The machine reconciler then renders the old CAs again; the nodes still accept the new ones, which it reports
(RebootRequired / APIServerRestartRequired) and never applies by itself: a ``config`` operation clears them.
One past the point of no return gets DeletionHeld and runs on to Done (``operations.deletion``).
"""

from __future__ import annotations

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.names import EventReason
from ichord.failpoints import failpoint
from ichord.kube.errors import NotFound
from ichord.kube.events import ObjectRef
from ichord.kube.nodes import uncordon
from ichord.operations import deletion
from ichord.operations.ca_rotation import custody
from ichord.operations.ca_rotation.bundle_secret import remove_rotation
from ichord.operations.ca_rotation.lifecycle import let_go, other_rotation
from ichord.operations.ca_rotation.passes import kubernetes_cas
from ichord.operations.ca_rotation.plan import verify_dial
from ichord.operations.ca_rotation.status import CA_ROTATION, ca_status, log_transition
from ichord.operations.lock import lock_holder
from ichord.operations.managed.clients import admin_client
from ichord.operations.managed.context import StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.operations.outcome import Done, Outcome
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.scrub import SCRUBBER
from ichord.talos.dial import DialBundle

__all__ = ["abandon", "hold", "must_abandon"]


def must_abandon(inputs: Inputs) -> bool:
    return deletion.must_abandon(CA_ROTATION, inputs.op)


async def hold(ctx: StepContext, inputs: Inputs, stage: Stage) -> None:
    """Past the point of no return: DeletionHeld once; the rotation goes on."""
    await deletion.hold_deletion(ctx, CA_ROTATION, inputs, stage.value,
                                 "status.machines shows which CAs each machine already signs with and trusts.")


async def _rotation_is_ours(ctx: StepContext, inputs: Inputs, stage: Stage | None) -> bool:
    rotation = inputs.rotation
    if rotation is None:
        return False
    if stage is None:  # saved by a start that died before the stage was written, if anyone's: the lock says whose
        holder = await lock_holder(ctx.kube, inputs.op_namespace, inputs.cluster_name)
        return holder in (None, inputs.uid) and await other_rotation(ctx, inputs) is None
    nexts = {str(c.get("name")): c.get("next") for c in ca_status(inputs).get("certificates") or []}
    return all(nexts.get(t.value) == ca_fingerprint(ca) for t, ca in rotation.new.items())


async def _uncordon_rebooting(ctx: StepContext, inputs: Inputs, stage: Stage | None) -> str | None:
    """The control plane an etcd roll was rebooting, uncordoned if ichord cordoned it; its Node name, or None."""
    rebooting = str(ca_status(inputs).get("etcdRebooting") or "")
    if not rebooting:
        return None
    machine = next((m for m in inputs.machines if m.name == rebooting), None)
    node = (machine.hostname or str(machine.status.get("nodeName") or "") or machine.name) if machine else rebooting
    rotation = inputs.rotation
    dial = (verify_dial(inputs.bundle, rotation, stage) if rotation is not None and stage is not None
            else DialBundle.from_bundle(inputs.bundle))
    trusted = kubernetes_cas(inputs, rotation) if rotation is not None else [inputs.bundle.k8s.cert_pem]
    talos = ctx.talos_factory(dial)
    try:
        async with admin_client(talos, inputs.control_planes, trusted) as kc:
            try:
                await uncordon(kc, node)
            except NotFound:
                return None
    finally:
        talos.close()
    return node


async def abandon(ctx: StepContext, inputs: Inputs, stage: Stage | None) -> Outcome:
    """Let the deleted rotation go (the steps above); any error leaves it for the next step to repeat."""
    where = stage.value if stage is not None else "its start"
    removed = False
    if await _rotation_is_ours(ctx, inputs, stage):
        failpoint("ca-rotation.abandon.remove.before")
        removed = await remove_rotation(ctx.kube, inputs.secret.namespace, inputs.secret.name,
                                        inputs.secret.resource_version)
        failpoint("ca-rotation.abandon.remove.after")
    if stage is None and not removed:  # deleted before anything was written: nothing to hold, nothing to say
        await let_go(ctx, inputs.op)
        return Done()
    node = await _uncordon_rebooting(ctx, inputs, stage)
    targets = [str(t) for t in ca_status(inputs).get("targets") or []]
    kept = f"no {names.ROTATION_KEY} of its own was left in the bundle Secret"
    done = [f"{names.ROTATION_KEY} removed from the bundle Secret" if removed else kept, "the cluster lock released"]
    if node:
        done.append(f"Node {node} uncordoned")
    left = ("Nothing reached the nodes." if stage is None else
            f"The nodes still accept the new {', '.join(targets) or 'CAs'} CA(s) next to the old ones; the machines "
            "report them (RebootRequired or APIServerRestartRequired) and ichord never applies them by itself: "
            "create a `config` TalosOperation to remove them, one control plane at a time.")
    message = SCRUBBER.text(f"ca-rotation {inputs.name} was deleted in {where} and abandoned: {', '.join(done)}. "
                            f"{left}")
    ctx.recorder.record(ObjectRef.of(inputs.cluster), "Warning", EventReason.OPERATION_ABANDONED, message)
    log_transition(inputs, "ca-rotation abandoned", removed_rotation=removed)
    await custody.release(ctx.kube, inputs.op, (inputs.secret.namespace, inputs.secret.name))
    failpoint("ca-rotation.abandon.letgo.before")
    await let_go(ctx, inputs.op)
    return Done()
