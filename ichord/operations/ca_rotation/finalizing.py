"""Finalizing, after the one Secret update (ADR 0063 step 4 and its amendments).

    replaced bundle verified on every machine (plain dial, configuration equal to its render)
    -> Nodes read live, Ready continuously for caKubeletSettleDelay (AwaitingNodes / SettlingNodes)
    -> clients restarted one at a time, bounded by caClientRestartTimeout (RestartingClients)
    -> Done: Completed (Rotated or RotatedClientsNotBack), CAClientsNotRestarted, lock and finalizer let go
"""

from __future__ import annotations

import datetime as dt

from ichord.api.carotation import Stage
from ichord.api.conditions import now_rfc3339
from ichord.api.names import CARotationReason, EventReason, Phase
from ichord.failpoints import failpoint
from ichord.kube.client import KubeClient
from ichord.operations.ca_rotation import clients, cluster_conditions
from ichord.operations.ca_rotation.context import Inputs, Obj, RotationContext
from ichord.operations.ca_rotation.lifecycle import ca_reason, let_go, lock
from ichord.operations.ca_rotation.managed import admin_client, not_ready_nodes
from ichord.operations.ca_rotation.plan import replaced_by
from ichord.operations.ca_rotation.status import (
    blocked,
    condition,
    event,
    in_progress,
    log_transition,
    phase,
    since_transition,
    write,
)
from ichord.operations.outcome import Done, Outcome, Requeue
from ichord.pki.scrub import SCRUBBER
from ichord.render.config import ConfigParseError, MachineConfig
from ichord.render.errors import RenderError
from ichord.render.generate import render
from ichord.render.inputs import MachineInputs
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosError

#: Finalizing's waits, entered only after the replaced bundle was verified on every machine.
FINALIZING_WAITS = (CARotationReason.AWAITING_NODES, CARotationReason.SETTLING_NODES,
                    CARotationReason.RESTARTING_CLIENTS)


async def step(ctx: RotationContext, inputs: Inputs) -> Outcome:
    certs = inputs.ca_status.get("certificates") or []
    if inputs.rotation is not None or not replaced_by(inputs.bundle, certs):
        return await blocked(ctx, inputs, "the bundle Secret does not hold the new CAs although the rotation is in "
                                          "Finalizing; restore the Secret from the rotation's backup")
    refusal = await lock(ctx, inputs)
    if refusal is not None:
        return refusal
    reason = ca_reason(inputs)
    if reason not in FINALIZING_WAITS:
        # Verified once, on entry (and again after any Blocked): the waits that follow only read Nodes/workloads.
        problem = await verify_replaced(ctx, inputs)
        if problem is not None:
            return await blocked(ctx, inputs, problem)
    now = ctx.now()
    talos = ctx.talos_factory(DialBundle.from_bundle(inputs.bundle))
    try:
        async with admin_client(talos, inputs.control_planes, [inputs.bundle.k8s.cert_pem]) as kc:
            if reason != CARotationReason.RESTARTING_CLIENTS:
                return await settle_nodes(ctx, inputs, kc, reason, now)
            return await restart_clients(ctx, inputs, kc, now)
    finally:
        talos.close()


async def settle_nodes(ctx: RotationContext, inputs: Inputs, kc: KubeClient, reason: str | None,
                       now: dt.datetime) -> Outcome:
    """Nodes read live and Ready continuously for caKubeletSettleDelay; a NotReady read resets it (waits, no pause)."""
    poll = ctx.timing.ca_pass_verify_delay
    not_ready = await not_ready_nodes(kc)
    if not_ready:
        message = f"waiting for Node(s) to be Ready after the CA change: {', '.join(not_ready)}"
        await write(ctx, inputs, *in_progress(ctx, CARotationReason.AWAITING_NODES, message, timed=True))
        return Requeue(poll, "awaiting nodes")
    delay = ctx.timing.ca_kubelet_settle_delay
    elapsed = since_transition(inputs.status, CARotationReason.SETTLING_NODES, now)
    if elapsed is None:
        message = f"every Node is Ready; requiring it for {delay:g} s before restarting clients"
        await write(ctx, inputs, *in_progress(ctx, CARotationReason.SETTLING_NODES, message, timed=True))
        return Requeue(min(poll, delay), "settling nodes")
    if elapsed < delay:
        return Requeue(min(poll, delay - elapsed), "settling nodes")
    message = "every Node stayed Ready; restarting the clients that keep the old CA, one at a time"
    await write(ctx, inputs, *in_progress(ctx, CARotationReason.RESTARTING_CLIENTS, message, timed=True))
    return Requeue(0.0, "restarting clients")


async def restart_clients(ctx: RotationContext, inputs: Inputs, kc: KubeClient, now: dt.datetime) -> Outcome:
    preset = str(((inputs.cluster.get("spec") or {}).get("cni") or {}).get("preset") or "flannel")
    seq = clients.sequence(preset)
    progress = await clients.restart_step(kc, inputs.uid, seq, now_rfc3339(now))
    if progress.restarted:
        event(ctx, inputs, "Normal", EventReason.CLIENTS_RESTARTED, f"restarted {', '.join(progress.restarted)}")
    if progress.done:
        return await complete(ctx, inputs, [])
    elapsed = since_transition(inputs.status, CARotationReason.RESTARTING_CLIENTS, now) or 0.0
    bound = ctx.timing.ca_client_restart_timeout
    if elapsed >= bound:
        return await complete(ctx, inputs, await clients.not_back(kc, inputs.uid, seq))
    waiting = str(progress.waiting_for) if progress.waiting_for else "the clients"
    message = f"restarting the clients that keep the old CA, one at a time: waiting for {waiting} to be available"
    await write(ctx, inputs, *in_progress(ctx, CARotationReason.RESTARTING_CLIENTS, message, timed=True))
    return Requeue(min(ctx.timing.ca_pass_verify_delay, bound - elapsed), "restarting clients")


async def complete(ctx: RotationContext, inputs: Inputs, not_back: list[str]) -> Outcome:
    preset = str(((inputs.cluster.get("spec") or {}).get("cni") or {}).get("preset") or "flannel")
    note = "" if clients.cni_restarted(preset) else (
        " The CNI is unmanaged and was not restarted: restart its pods if they report x509 errors.")
    if not_back:
        reason = CARotationReason.ROTATED_CLIENTS_NOT_BACK
        message = (f"the CAs were rotated, but these clients were not available again within "
                   f"{ctx.timing.ca_client_restart_timeout:g} s: {', '.join(not_back)}.{note} Export the bundle: "
                   f"`ichord cluster bundle-export {inputs.cluster_name}`")
    else:
        reason = CARotationReason.ROTATED
        message = (f"the CAs were rotated and the clients restarted.{note} Export the bundle: "
                   f"`ichord cluster bundle-export {inputs.cluster_name}`")
    await cluster_conditions.set_clients_not_restarted(ctx, inputs, not_back)
    failpoint("ca-rotation.done.before")
    stamp = now_rfc3339(ctx.now())

    def done(s: Obj) -> None:
        s.setdefault("caRotation", {})["stage"] = Stage.DONE.value
        s["machines"] = []
        s["completedAt"] = stamp

    await write(ctx, inputs, done, phase(Phase.COMPLETED, message), condition(ctx, "True", reason, message))
    event(ctx, inputs, "Normal", EventReason.ROTATION_COMPLETED, message)
    log_transition(inputs, "ca-rotation completed", reason=reason)
    await let_go(ctx, inputs.op)
    return Done()


async def verify_replaced(ctx: RotationContext, inputs: Inputs) -> str | None:
    """None when every machine answers the replaced bundle's plain dial and runs exactly its render."""
    talos = ctx.talos_factory(DialBundle.from_bundle(inputs.bundle))
    try:
        for m in inputs.machines:
            try:
                desired = render(inputs.bundle, inputs.cluster_inputs, MachineInputs.from_spec(m.spec))
            except RenderError as exc:
                return f"machine {m.name} cannot be rendered from the replaced bundle: {SCRUBBER.exception(exc)}"
            try:
                running = MachineConfig.plain_of(await talos.machine_config(m.address))
            except (TalosError, ConfigParseError) as exc:
                return (f"machine {m.name} ({m.address}) does not answer the replaced bundle: "
                        f"{SCRUBBER.exception(exc)}")
            if running != desired.plain():
                return f"machine {m.name} does not run what the replaced bundle renders"
        return None
    finally:
        talos.close()
