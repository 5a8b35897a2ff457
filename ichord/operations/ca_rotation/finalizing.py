"""Finalizing, after the one Secret update (docs/decisions.md#rotation-state and its amendments), as explicit steps
(``status.caRotation.step``, with ``stepSince``), each a row of ``STEPS``:

    verify-replaced   the replaced bundle on every machine (plain dial, configuration equal to its render)
    reset-aggregator  AggregatorAuthReset, when the aggregator CA was rotated (aggregator.py; SettlingAggregator)
    settle-nodes      Nodes read live, Ready continuously for caKubeletSettleDelay (AwaitingNodes / SettlingNodes)
    restart-clients   clients restarted one at a time, bounded by caClientRestartTimeout (RestartingClients)
    -> Done: Completed (Rotated or RotatedClientsNotBack), CAClientsNotRestarted, lock and finalizer let go
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from ichord.api.carotation import Stage
from ichord.api.conditions import now_rfc3339
from ichord.api.names import CARotationReason, EventReason, Phase
from ichord.failpoints import failpoint
from ichord.kube.client import KubeClient
from ichord.operations.ca_rotation import aggregator, clients, cluster_conditions, custody
from ichord.operations.ca_rotation.lifecycle import ca_reason, let_go, lock
from ichord.operations.ca_rotation.managed_objects import not_ready_nodes
from ichord.operations.ca_rotation.plan import EXTENSION_APISERVERS_NOTE, replaced_by
from ichord.operations.ca_rotation.status import (
    FINALIZING_AGGREGATOR,
    FINALIZING_RESTART,
    FINALIZING_SETTLE,
    FINALIZING_VERIFY,
    blocked,
    ca_status,
    condition,
    event,
    in_progress,
    log_transition,
    phase,
    since_transition,
    wait_within_bound,
    write,
)
from ichord.operations.ca_rotation.status import step as status_step
from ichord.operations.managed.clients import cluster_client
from ichord.operations.managed.context import Obj, StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.operations.managed.rendered import Mismatch, divergence
from ichord.operations.outcome import Done, Outcome, Requeue
from ichord.pki.rotation import Target
from ichord.talos.dial import DialBundle

#: An operation a previous version left in Finalizing has no step: its condition's reason said which it was.
_STEP_OF_REASON = {CARotationReason.AWAITING_NODES: FINALIZING_SETTLE,
                   CARotationReason.SETTLING_NODES: FINALIZING_SETTLE,
                   CARotationReason.RESTARTING_CLIENTS: FINALIZING_RESTART}


def current_step(inputs: Inputs) -> str:
    named = str(ca_status(inputs).get("step") or "")
    if named in STEPS:
        return named
    return _STEP_OF_REASON.get(ca_reason(inputs) or "", FINALIZING_VERIFY)


async def step(ctx: StepContext, inputs: Inputs) -> Outcome:
    certs = ca_status(inputs).get("certificates") or []
    if inputs.rotation is not None or not replaced_by(inputs.bundle, certs):
        return await blocked(ctx, inputs, "the bundle Secret does not hold the new CAs although the rotation is in "
                                          "Finalizing; restore the Secret from the rotation's backup")
    refusal = await lock(ctx, inputs)
    if refusal is not None:
        return refusal
    return await STEPS[current_step(inputs)](ctx, inputs)


async def _verify(ctx: StepContext, inputs: Inputs) -> Outcome:
    """Verified once, on entry: the steps that follow only read Nodes and workloads."""
    problem = await verify_replaced(ctx, inputs)
    if isinstance(problem, Unanswered):
        # A node slow to answer (busy, its kubelet restarting) is a wait, as in a pass: Paused only past the bound.
        return await wait_within_bound(ctx, inputs, CARotationReason.VERIFYING_PASS, problem.message,
                                       step_name=FINALIZING_VERIFY)
    if problem is not None:
        return await blocked(ctx, inputs, problem)
    if _rotated_aggregator(inputs):
        await write(ctx, inputs, status_step(FINALIZING_AGGREGATOR, ctx.now()))
        return await _reset_aggregator(ctx, inputs)
    await write(ctx, inputs, status_step(FINALIZING_SETTLE, ctx.now()))
    return await _settle(ctx, inputs)


def _rotated_aggregator(inputs: Inputs) -> bool:
    return Target.KUBERNETES_AGGREGATOR.value in (ca_status(inputs).get("targets") or [])


async def _reset_aggregator(ctx: StepContext, inputs: Inputs) -> Outcome:
    """AggregatorAuthReset (docs/decisions.md#aggregator-ca): checked every Timing.retry until the ConfigMap holds the
    new aggregator CA alone; then the Nodes settle."""
    async with _managed(ctx, inputs) as kc:
        result = await aggregator.reset_step(kc, inputs.bundle.k8s_aggregator.cert_pem)
    if not result.settled:
        await write(ctx, inputs, *in_progress(ctx, CARotationReason.SETTLING_AGGREGATOR, result.message))
        return Requeue(ctx.timing.retry, "settling the aggregator")
    event(ctx, inputs, "Normal", EventReason.STAGE_VERIFIED, result.message)
    await write(ctx, inputs, status_step(FINALIZING_SETTLE, ctx.now()))
    return await _settle(ctx, inputs)


async def _settle(ctx: StepContext, inputs: Inputs) -> Outcome:
    async with _managed(ctx, inputs) as kc:
        return await settle_nodes(ctx, inputs, kc, ca_reason(inputs), ctx.now())


async def _restart(ctx: StepContext, inputs: Inputs) -> Outcome:
    async with _managed(ctx, inputs) as kc:
        return await restart_clients(ctx, inputs, kc, ctx.now())


@contextlib.asynccontextmanager
async def _managed(ctx: StepContext, inputs: Inputs) -> AsyncIterator[KubeClient]:
    """The managed cluster's API through a Talos-issued admin kubeconfig, from the replaced bundle."""
    talos = ctx.talos_factory(DialBundle.from_bundle(inputs.bundle))
    try:
        async with cluster_client(ctx.managed, inputs.cluster_key, talos, inputs.control_planes,
                                  [inputs.bundle.k8s.cert_pem], issued_in=Stage.FINALIZING.value) as kc:
            yield kc
    finally:
        talos.close()


STEPS: dict[str, Callable[[StepContext, Inputs], Awaitable[Outcome]]] = {
    FINALIZING_VERIFY: _verify,
    FINALIZING_AGGREGATOR: _reset_aggregator,
    FINALIZING_SETTLE: _settle,
    FINALIZING_RESTART: _restart,
}


async def settle_nodes(ctx: StepContext, inputs: Inputs, kc: KubeClient, reason: str | None,
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
    await write(ctx, inputs, status_step(FINALIZING_RESTART, now),
                *in_progress(ctx, CARotationReason.RESTARTING_CLIENTS, message, timed=True))
    return Requeue(0.0, "restarting clients")


async def restart_clients(ctx: StepContext, inputs: Inputs, kc: KubeClient, now: dt.datetime) -> Outcome:
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


async def complete(ctx: StepContext, inputs: Inputs, not_back: list[str]) -> Outcome:
    preset = str(((inputs.cluster.get("spec") or {}).get("cni") or {}).get("preset") or "flannel")
    note = "" if clients.cni_restarted(preset) else (
        " The CNI is unmanaged and was not restarted: restart its pods if they report x509 errors.")
    if _rotated_aggregator(inputs):
        note += f" Note: {EXTENSION_APISERVERS_NOTE}."
    if not_back:
        reason = CARotationReason.ROTATED_CLIENTS_NOT_BACK
        message = (f"the CAs were rotated, but these clients were not available again within "
                   f"{ctx.timing.ca_client_restart_timeout:g} s: {', '.join(not_back)}.{note} Export the bundle: "
                   f"`{cluster_conditions.export_command(ctx, inputs)}`")
    else:
        reason = CARotationReason.ROTATED
        message = (f"the CAs were rotated and the clients restarted.{note} Export the bundle: "
                   f"`{cluster_conditions.export_command(ctx, inputs)}`")
    await cluster_conditions.set_clients_not_restarted(ctx, inputs, not_back)
    # The bundle Secret holds the new CAs as current and was verified: its finalizer and the custody copy go.
    await custody.release(ctx.kube, inputs.op, (inputs.secret.namespace, inputs.secret.name))
    failpoint("ca-rotation.done.before")
    stamp = now_rfc3339(ctx.now())

    def done(s: Obj) -> None:
        ca = s.setdefault("caRotation", {})
        ca["stage"] = Stage.DONE.value
        ca["step"] = None  # Done has no step (merge patch: removed); restart-clients ended with Finalizing
        s["machines"] = []
        s["completedAt"] = stamp

    await write(ctx, inputs, done, phase(ctx, Phase.COMPLETED, message), condition(ctx, "True", reason, message))
    event(ctx, inputs, "Normal", EventReason.ROTATION_COMPLETED, message)
    log_transition(inputs, "ca-rotation completed", reason=reason)
    await let_go(ctx, inputs.op)
    return Done()


@dataclass(frozen=True)
class Unanswered:
    """A machine did not answer the replaced bundle's dial (unreachable, timed out): waited for, not blocked on."""

    message: str


async def verify_replaced(ctx: StepContext, inputs: Inputs) -> str | Unanswered | None:
    """None when every machine answers the replaced bundle's plain dial and runs exactly its render; what is wrong
    otherwise (Unanswered when a machine did not answer at all)."""
    talos = ctx.talos_factory(DialBundle.from_bundle(inputs.bundle))
    try:
        for m in inputs.machines:
            found = await divergence(talos, inputs, m)
            if found is None:
                continue
            if found.mismatch is Mismatch.UNRENDERABLE:
                return f"machine {m.name} cannot be rendered from the replaced bundle: {found.detail}"
            if found.mismatch is Mismatch.UNREACHABLE:
                return Unanswered(f"machine {m.name} ({m.address}) does not answer the replaced bundle yet: "
                                  f"{found.detail}")
            if found.mismatch is Mismatch.UNREADABLE:
                return f"machine {m.name} ({m.address}) does not answer the replaced bundle: {found.detail}"
            return f"machine {m.name} does not run what the replaced bundle renders"
        return None
    finally:
        talos.close()
