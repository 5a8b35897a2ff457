"""The ca-rotation's stage table: ``advance(ctx, op)`` runs one step and says when to run the next.

Every step reads everything it decides on (operation, cluster, machines, bundle Secret, nodes) and
writes status in the step that decided it; nothing lives in memory between steps (docs/decisions.md#rotation-state). The
stage only moves forward, and only after the stage under way is verified. The lifecycle around the
stages (plan only, pause/resume, lock, finalizer, blocked, fail) is the backbone's (operations/backbone).

    stage ""             plan, finalizer, lock, preflight, rotation.yaml saved      -> Accepting
    (a pass stage)       starts only inside a maintenance window (backbone.window_closed): else
                         InProgress WaitingForWindow; once started (passStarted) it runs to its end
    Accepting            pass (apply, later verify)                                 -> AwaitingCredentials
    AwaitingCredentials  the hand-off annotation equals the token                   -> Issuing
    Issuing              pass, kube-root-ca.crt everywhere, caClientSettleDelay     -> Dropping
    Dropping             pass, then the one Secret update                           -> Finalizing
    Finalizing           replaced bundle verified, Nodes settled, clients restarted -> Done (Completed)

``STAGES`` maps each stage to its step function; a pass stage's steps are ``apply``, ``verify`` and ``gates``
(status.caRotation.step), with ``roll`` between apply and verify when etcd is a target (etcd_roll.py: the control
planes rebooted one at a time); Finalizing's are in ``finalizing.STEPS``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.names import CARotationReason, EventReason, Phase
from ichord.api.views import OperationView
from ichord.failpoints import failpoint
from ichord.operations import backbone, etcd_snapshot, guard
from ichord.operations.bundle_source import BundleSourceError
from ichord.operations.ca_rotation import (
    abandon,
    aggregator,
    apiserver_instances,
    cluster_conditions,
    custody,
    etcd_roll,
    finalizing,
    handoff,
    pass_gates,
)
from ichord.operations.ca_rotation.bundle_secret import replace_bundle
from ichord.operations.ca_rotation.lifecycle import (
    blocked_without_inputs,
    ensure_finalizer,
    enter,
    enter_finalizing,
    fail,
    hand_trust,
    issuing_dial,
    let_go,
    lock,
    stage_mutations,
)
from ichord.operations.ca_rotation.managed_objects import root_ca_lagging
from ichord.operations.ca_rotation.passes import PassWait, apply_pass, kubernetes_cas, verify_pass
from ichord.operations.ca_rotation.plan import (
    PlannedMachine,
    TargetSpecError,
    UnsupportedTargetError,
    contract_refusal,
    next_stage,
    plan_status,
    replaced_by,
    spec_targets,
    verify_dial,
)
from ichord.operations.ca_rotation.preflight import preflight
from ichord.operations.ca_rotation.status import (
    APPLY_STEP,
    CA_ROTATION,
    FINALIZING_VERIFY,
    GATES_STEP,
    VERIFY_STEP,
    blocked,
    ca_status,
    event,
    in_progress,
    log_transition,
    since_transition,
    started,
    step,
    wait_within_bound,
    write,
)
from ichord.operations.etcd_snapshot import Destination, plan_entry
from ichord.operations.etcd_snapshot import hint as snapshot_hint
from ichord.operations.managed.clients import cluster_client
from ichord.operations.managed.context import Obj, StepContext
from ichord.operations.managed.inputs import Inputs, InputsError, load_inputs
from ichord.operations.outcome import Done, Outcome, Requeue
from ichord.pki.rotation import Rotation, Target

log = structlog.get_logger("ichord.operations.ca_rotation")


#: A bundle Secret that cannot be read as one (gone, no secrets.yaml, a broken rotation.yaml) mid-rotation.
_BUNDLE_LOST = frozenset({BundleSourceError.SECRET_NOT_FOUND, BundleSourceError.INVALID,
                          BundleSourceError.ROTATION_INVALID})


def _stage_of(op: Obj) -> Stage | None:
    text = ((op.get("status") or {}).get("caRotation") or {}).get("stage") or ""
    return Stage.parse(text) if text else None


async def advance(ctx: StepContext, op: Obj) -> Outcome:
    """One step of the ca-rotation ``op`` (a TalosOperation as read)."""
    if OperationView.of(op).kind != names.KIND_CA_ROTATION:
        return Done()
    # An API that does not answer (often the managed cluster's own, restarting for the new CA) raises: the
    # registry's one error policy retries the step with backoff (operations/step_errors.py).
    return await _advance(ctx, op)


async def _advance(ctx: StepContext, op: Obj) -> Outcome:
    status = op.get("status") or {}
    if status.get("phase") in (Phase.COMPLETED, Phase.FAILED):
        await custody.release(ctx.kube, op)  # done before Completed; again here after a kill between the two
        await let_go(ctx, op)
        return Done()
    stage = _stage_of(op)
    if stage is None:
        try:
            spec_targets(op)
        except (UnsupportedTargetError, TargetSpecError) as exc:
            reason = (CARotationReason.UNSUPPORTED_TARGET if isinstance(exc, UnsupportedTargetError)
                      else CARotationReason.INVALID_SPEC)
            return await fail(ctx, op, reason, str(exc))
    try:
        inputs = await load_inputs(ctx, op)
    except InputsError as exc:
        if exc.reason == backbone.FORBIDDEN:
            return await backbone.blocked_before_read(ctx, CA_ROTATION, op, exc.message, reason=backbone.FORBIDDEN)
        if stage is not None and exc.reason in _BUNDLE_LOST:  # under way: the keys must come back (custody.py)
            return await custody.lost(ctx, op, stage, exc.reason == BundleSourceError.SECRET_NOT_FOUND)
        return await blocked_without_inputs(ctx, op, f"{exc.reason}: {exc.message}")
    if abandon.must_abandon(inputs):  # deleted before its point of no return (docs/decisions.md#abandon-or-hold)
        return await abandon.abandon(ctx, inputs, stage)
    if stage is None:
        return await _start(ctx, inputs)
    restore = await custody.check(ctx, inputs, stage)  # the bundle Secret still holds the rotation's keys
    if restore is not None:
        return restore
    if OperationView.of(op).deleting and stage is not Stage.DONE:
        await abandon.hold(ctx, inputs, stage)
    if stage is not Stage.DONE and (op.get("spec") or {}).get("paused"):
        return await _held_by_spec(ctx, inputs, stage)
    await backbone.resume_if_paused(ctx, CA_ROTATION, inputs, stage.value)
    return await STAGES[stage](ctx, inputs, stage)


# ---- start --------------------------------------------------------------------------------


async def _start(ctx: StepContext, inputs: Inputs) -> Outcome:
    targets = spec_targets(inputs.op)
    start = started(ctx, inputs.op)  # the spec planned from here is the accepted intent, whatever changes later
    refusal_of_contract = contract_refusal(targets, inputs.cluster_inputs.contract)
    if refusal_of_contract is not None:  # refused at plan: nothing is written (docs/decisions.md#ca-rotation-passes)
        return await fail(ctx, inputs.op, CARotationReason.UNSUPPORTED_TARGET, refusal_of_contract)
    destination = Destination.of(inputs.cluster.get("spec") or {})
    plan = plan_status(targets, [PlannedMachine(m.name, m.role) for m in inputs.machines], inputs.worker_bound,
                       etcd_snapshot=plan_entry(destination, inputs.status),
                       snapshot_hint=snapshot_hint(inputs.cluster_name, inputs.op_namespace))
    spec = inputs.op.get("spec") or {}
    if spec.get("paused"):
        await backbone.plan_only(ctx, CA_ROTATION, inputs, plan)
        return Done()
    if inputs.status.get("plan") != plan:
        await write(ctx, inputs, lambda s: s.__setitem__("plan", plan), *start)
    held = await guard.hold_for_start(ctx.kube, inputs.cluster, inputs.machines)  # before anything irreversible
    if held is not None:
        return await blocked(ctx, inputs, held)
    await ensure_finalizer(ctx, inputs)
    refusal = await lock(ctx, inputs)
    if refusal is not None:
        return refusal
    if Target.KUBERNETES in targets:
        untrusted = ctx.trust_refusal(inputs.bundle.k8s.cert_pem)
        if untrusted is not None:
            return await blocked(ctx, inputs, untrusted)
    problems = await preflight(ctx, inputs, targets)
    if problems:
        return await blocked(ctx, inputs, "preflight: " + "; ".join(problems))
    if Target.ETCD in targets and destination is not None:
        # The etcd roll reboots every control plane: a snapshot first, before anything is changed.
        refused = await etcd_snapshot.take_before_reboots(ctx, CA_ROTATION, inputs, destination)
        if refused is not None:
            return refused
    failpoint("ca-rotation.save.before")
    saved = await custody.save(ctx.kube, inputs.op, inputs.secret.namespace, inputs.secret.name, targets)
    failpoint("ca-rotation.saved")
    rotation = saved.rotation
    hand_trust(ctx, rotation, inputs.bundle.k8s.cert_pem)
    how = "adopted the rotation.yaml a previous start saved" if saved.adopted else "saved the new CAs to rotation.yaml"
    await enter(ctx, inputs, rotation, Stage.ACCEPTING, extra=start)
    event(ctx, inputs, "Normal", EventReason.OPERATION_STARTED,
          f"CA rotation of {', '.join(t.value for t in rotation.targets)} started: {how}")
    return Requeue(0.0, "stage Accepting")


async def _held_by_spec(ctx: StepContext, inputs: Inputs, stage: Stage) -> Outcome:
    """spec.paused set after the start: hold at this step boundary, keep the lock and the trust pool fed.

    Nothing is applied or replaced while it holds; the stage stays, so unpausing resumes exactly here
    (the informer's update runs the next step at once). Timers measured from the CARotation condition
    (settle delays, the client-restart bound) start again after it, which only ever waits longer.
    """
    if inputs.rotation is not None:
        hand_trust(ctx, inputs.rotation, inputs.bundle.k8s.cert_pem)
    refusal = await lock(ctx, inputs)
    if refusal is not None:
        return refusal
    return await backbone.hold_paused(ctx, CA_ROTATION, inputs, stage.value)


# ---- passes -------------------------------------------------------------------------------


#: status.caRotation.passStarted: the stage whose pass has started (a maintenance window admitted it).
PASS_STARTED = "passStarted"  # noqa: S105 (a status field, not a password)


async def _pass(ctx: StepContext, inputs: Inputs, stage: Stage) -> Outcome:
    rotation = inputs.rotation
    certs = ca_status(inputs).get("certificates") or []
    if rotation is None:
        if stage is Stage.DROPPING and replaced_by(inputs.bundle, certs):
            # The Secret was replaced but the process died before status learned it (docs/decisions.md#rotation-state).
            await cluster_conditions.raise_backup_stale(ctx, inputs)
            await enter_finalizing(ctx, inputs, FINALIZING_VERIFY)
            return Requeue(0.0, "stage Finalizing")
        return await blocked(ctx, inputs, f"the bundle Secret holds no {names.ROTATION_KEY} although the rotation is "
                                          f"in {stage.value}; restore it from a backup of the Secret")
    hand_trust(ctx, rotation, inputs.bundle.k8s.cert_pem)
    refusal = await lock(ctx, inputs)
    if refusal is not None:
        return refusal
    if ca_status(inputs).get(PASS_STARTED) != stage.value:
        # docs/decisions.md#maintenance-windows: a pass starts only inside a window, and once started it is run to
        # its end (its nodes are in flight); the record is written before the pass's first apply.
        closed = backbone.window_closed(ctx, inputs.cluster, f"the {stage.value} pass")
        if closed is not None:
            return await backbone.wait_for_window(ctx, CA_ROTATION, inputs, closed)
        # docs/decisions.md#health-gates: and only once its health gates pass (and the soak is over); never re-asked
        # mid-pass.
        held = await pass_gates.before_pass(ctx, inputs, rotation, stage)
        if held is not None:
            return held
        await write(ctx, inputs, lambda s: s.setdefault("caRotation", {}).__setitem__(PASS_STARTED, stage.value))
    rolls = etcd_roll.rolls(rotation.targets)
    if rolls and etcd_roll.rolling(inputs):
        # docs/decisions.md#etcd-reboot-roll: while the roll runs the pass does nothing else (no configuration read).
        return await etcd_roll.roll_step(ctx, inputs, stage)
    result = await apply_pass(ctx, inputs, rotation, stage)
    if result.problem is not None:
        if result.restarting and result.waiting:  # one kube-apiserver restart at a time
            return await apiserver_instances.report(ctx, inputs, result.problem, result.machines)
        if result.waiting:  # a machine that does not answer: a wait within the bound, not a fault yet
            return await wait_within_bound(ctx, inputs, CARotationReason.VERIFYING_PASS, result.problem,
                                           machines=result.machines)
        return await blocked(ctx, inputs, result.problem, machines=result.machines)
    if result.applied:
        then = "rebooting the control planes for etcd next" if rolls else "verifying in the next step"
        message = f"{stage.value}: applied to {', '.join(result.applied)}; {then}"
        # With etcd the roll starts only once every machine runs the stage (below): control planes may be
        # applied over several steps, one kube-apiserver restart at a time (apiserver_instances).
        await write(ctx, inputs, lambda s: s.__setitem__("machines", result.machines),
                    step(APPLY_STEP if rolls else VERIFY_STEP, ctx.now()),
                    *in_progress(ctx, CARotationReason.VERIFYING_PASS, message))
        event(ctx, inputs, "Normal", EventReason.STAGE_APPLIED, message)
        return Requeue(ctx.timing.ca_pass_verify_delay, f"verify {stage.value}")
    if rolls and not etcd_roll.rolled(inputs):
        # Every machine runs the stage (the apply and the roll are separate steps); the roll comes first. Decided
        # by the roll's own record (etcdRestarted, emptied at every stage change), not by the step, which a wait
        # may have set to verify meanwhile.
        await write(ctx, inputs, step(etcd_roll.ROLL_STEP, ctx.now()))
        return Requeue(0.0, f"etcd roll of {stage.value}")
    if ca_status(inputs).get("step") != GATES_STEP:
        verified = await verify_pass(ctx, inputs, rotation, stage)
        if isinstance(verified, PassWait):
            return await wait_within_bound(ctx, inputs, verified.reason, verified.message, machines=result.machines)
        # The per-node CA view the verification read (ca_view); the next stage keeps it until it reads again.
        machines = verified.machines(result.machines)
        await write(ctx, inputs, lambda s: s.__setitem__("machines", machines), step(GATES_STEP, ctx.now()))
    if stage is Stage.ACCEPTING:
        return await _after_accepting(ctx, inputs, rotation)
    if stage is Stage.ISSUING:
        return await _issuing_gate(ctx, inputs, rotation)
    return await _replace(ctx, inputs, rotation)


async def _after_accepting(ctx: StepContext, inputs: Inputs, rotation: Rotation) -> Outcome:
    if Target.KUBERNETES_AGGREGATOR in rotation.targets:
        waiting = await _aggregator_gate(ctx, inputs, rotation)
        if waiting is not None:
            return waiting
    nxt = next_stage(Stage.ACCEPTING, rotation.targets)
    event(ctx, inputs, "Normal", EventReason.STAGE_VERIFIED, "Accepting verified on every machine")
    if nxt is not Stage.AWAITING_CREDENTIALS:
        await enter(ctx, inputs, rotation, nxt)
        return Requeue(0.0, f"stage {nxt.value}")
    message = (f"waiting for the operator's credentials from the new CAs: run `ichord cluster credentials "
               f"{inputs.cluster_name} -n {inputs.op_namespace} --acknowledge`")
    entered = await handoff.enter(ctx, inputs, *stage_mutations(ctx, inputs, rotation, nxt),
                                  *in_progress(ctx, CARotationReason.AWAITING_CREDENTIALS, message))
    if not entered:
        return Requeue(0.0, "the operation changed while entering AwaitingCredentials")
    event(ctx, inputs, "Normal", EventReason.AWAITING_CREDENTIALS,
          f"Accepting verified; the operator must now take credentials from the new CAs: run `ichord cluster "
          f"credentials {inputs.cluster_name} -n {inputs.op_namespace} --acknowledge` (it writes a talosconfig and "
          f"a kubeconfig, checks both against the cluster, then lets the rotation go on to Issuing)")
    log_transition(inputs, "ca-rotation stage", to=nxt.value)
    return Requeue(ctx.timing.retry, "awaiting credentials")


async def _aggregator_gate(ctx: StepContext, inputs: Inputs, rotation: Rotation) -> Outcome | None:
    """extension-apiserver-authentication holds the new front-proxy CA, then ClientSettleDelay
    (docs/decisions.md#aggregator-ca)."""
    new_agg = rotation.new[Target.KUBERNETES_AGGREGATOR]
    talos = ctx.talos_factory(verify_dial(inputs.bundle, rotation, Stage.ACCEPTING))
    try:
        async with cluster_client(ctx.managed, inputs.cluster_key, talos, inputs.control_planes,
                                  kubernetes_cas(inputs, rotation), issued_in=Stage.ACCEPTING.value) as kc:
            auth = await aggregator.read_extension_auth(kc)
    finally:
        talos.close()
    now = ctx.now()
    if not aggregator.holds(auth, new_agg.cert_pem):
        message = (f"Accepting verified; waiting for kube-system/{names.EXTENSION_AUTH_CONFIGMAP} to list the new "
                   "aggregator CA (kube-apiserver publishes it once every control plane accepts it)")
        cond = OperationView.of(inputs.op).condition(names.CA_ROTATION)
        if cond is None or cond.get("reason") != CARotationReason.AWAITING_AGGREGATOR_CA:
            await write(ctx, inputs, *in_progress(ctx, CARotationReason.AWAITING_AGGREGATOR_CA, message, timed=True))
        return Requeue(ctx.timing.ca_pass_verify_delay, "awaiting the aggregator CA")
    delay = ctx.timing.ca_client_settle_delay
    elapsed = since_transition(inputs.status, CARotationReason.SETTLING_CLIENTS, now)
    if elapsed is None:
        message = (f"kube-system/{names.EXTENSION_AUTH_CONFIGMAP} lists the new aggregator CA; letting extension "
                   f"API servers reload it for {delay:g} s before Issuing signs the front-proxy certificate with it")
        await write(ctx, inputs, *in_progress(ctx, CARotationReason.SETTLING_CLIENTS, message, timed=True))
        return Requeue(delay, "settling extension API servers")
    if elapsed < delay:
        return Requeue(delay - elapsed, "settling extension API servers")
    return None


async def _await_credentials(ctx: StepContext, inputs: Inputs, _stage: Stage) -> Outcome:
    rotation = inputs.rotation
    if rotation is None:
        return await blocked(ctx, inputs, f"the bundle Secret holds no {names.ROTATION_KEY} in AwaitingCredentials")
    hand_trust(ctx, rotation, inputs.bundle.k8s.cert_pem)
    refusal = await lock(ctx, inputs)
    if refusal is not None:
        return refusal
    if handoff.acknowledged(inputs.op):
        await enter(ctx, inputs, rotation, Stage.ISSUING)
        return Requeue(0.0, "stage Issuing")
    message = (f"waiting for the operator's credentials from the new CAs: run `ichord cluster credentials "
               f"{inputs.cluster_name} -n {inputs.op_namespace} --acknowledge`")
    await write(ctx, inputs, *in_progress(ctx, CARotationReason.AWAITING_CREDENTIALS, message))
    return Requeue(ctx.timing.retry, "awaiting credentials")


async def _issuing_gate(ctx: StepContext, inputs: Inputs, rotation: Rotation) -> Outcome:
    """kube-root-ca.crt holds the new Kubernetes CA everywhere, then caClientSettleDelay
    (docs/decisions.md#rotation-state)."""
    new_k8s = rotation.new.get(Target.KUBERNETES)
    if new_k8s is not None:
        talos = ctx.talos_factory(issuing_dial(inputs, rotation))
        try:
            async with cluster_client(ctx.managed, inputs.cluster_key, talos, inputs.control_planes,
                                      kubernetes_cas(inputs, rotation), issued_in=Stage.ISSUING.value) as kc:
                lagging = await root_ca_lagging(kc, new_k8s.cert_pem)
        finally:
            talos.close()
        if lagging:
            shown = ", ".join(lagging[:5]) + (f" and {len(lagging) - 5} more" if len(lagging) > 5 else "")
            message = f"Issuing verified; waiting for {names.ROOT_CA_CONFIGMAP} to hold the new CA in: {shown}"
            await write(ctx, inputs, *in_progress(ctx, CARotationReason.IN_PROGRESS, message))
            return Requeue(ctx.timing.ca_pass_verify_delay, "kube-root-ca.crt")
    delay = ctx.timing.ca_client_settle_delay
    elapsed = since_transition(inputs.status, CARotationReason.SETTLING_CLIENTS, ctx.now())
    if elapsed is None:
        # Only a rotation of the Kubernetes CA waits for kube-root-ca.crt: say so only then (an etcd or aggregator
        # rotation's message names nothing it did not rotate).
        held = f" and {names.ROOT_CA_CONFIGMAP} holds the new CA" if new_k8s is not None else ""
        message = f"Issuing verified{held}; letting in-cluster clients settle for {delay:g} s"
        await write(ctx, inputs, *in_progress(ctx, CARotationReason.SETTLING_CLIENTS, message, timed=True))
        return Requeue(delay, "settling clients")
    if elapsed < delay:
        return Requeue(delay - elapsed, "settling clients")
    event(ctx, inputs, "Normal", EventReason.STAGE_VERIFIED, "Issuing verified and clients settled")
    await enter(ctx, inputs, rotation, Stage.DROPPING)
    return Requeue(0.0, "stage Dropping")


async def _replace(ctx: StepContext, inputs: Inputs, rotation: Rotation) -> Outcome:
    """Dropping verified: the one Secret update, then Finalizing."""
    event(ctx, inputs, "Normal", EventReason.STAGE_VERIFIED, "Dropping verified on every machine")
    failpoint("ca-rotation.replace.before")
    inputs.bundle = await replace_bundle(ctx.kube, inputs.secret.namespace, inputs.secret.name, inputs.bundle, rotation,
                                         inputs.secret.resource_version)
    failpoint("ca-rotation.replace.after")
    await cluster_conditions.raise_backup_stale(ctx, inputs)
    await enter_finalizing(ctx, inputs, FINALIZING_VERIFY)
    return Requeue(0.0, "stage Finalizing")


async def _finalizing(ctx: StepContext, inputs: Inputs, _stage: Stage) -> Outcome:
    return await finalizing.step(ctx, inputs)


async def _done(ctx: StepContext, inputs: Inputs, _stage: Stage) -> Outcome:
    return await finalizing.complete(ctx, inputs, [])  # Done written, Completed not yet


#: The stage table: what one step does in each stage (the order and the per-target stages are in ``plan``).
STAGES: dict[Stage, Callable[[StepContext, Inputs, Stage], Awaitable[Outcome]]] = {
    Stage.ACCEPTING: _pass,
    Stage.AWAITING_CREDENTIALS: _await_credentials,
    Stage.ISSUING: _pass,
    Stage.DROPPING: _pass,
    Stage.FINALIZING: _finalizing,
    Stage.DONE: _done,
}
