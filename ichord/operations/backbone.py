"""The lifecycle every disruptive operation shares, parameterised by its kind (condition type, finalizer).

    created with spec.paused: true   -> plan only (status.plan, phase Pending, reason Planned); nothing runs
    started                          -> finalizer, then the cluster lock (acquired, renewed every step)
    spec.paused: true while running  -> held at the next step boundary (phase Paused, reason Paused, one
                                        OperationPaused Event), the lock kept; false resumes in the same stage
    a normal wait                    -> InProgress with the reason of what is awaited (no Warning)
    a fault, or a bound exceeded     -> Blocked: phase Paused, reason Blocked, one OperationBlocked Warning;
                                        retried every Timing.retry (each step is idempotent)
    an invalid spec                  -> Failed (terminal): only a change of the inputs wakes it
    Completed / Failed               -> the lock released, the finalizer removed

Status is written in one place (``write``): a fresh read on conflict, messages scrubbed, the Succeeded
condition kept with the phase, observedGeneration recorded, and the step's scope told of the new copy. A change of
phase and condition that goes with an Event is a ``Transition`` (operations/op_status.py, the one writer of them):
decided on the object as read for the write, stamped with the step's clock, its Event posted only when the write
sent moved the condition. An
operation kind declares only its stage table and its stage functions; everything here is shared.
The abandon/DeletionHeld decision (docs/decisions.md#abandon-or-hold) plugs in through ``OperationKind.abandonable``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from ichord.api import contract_match, names
from ichord.api.conditions import Condition, find, now_rfc3339, parse_time
from ichord.api.names import Phase
from ichord.api.operation_kinds import KindDescription, describe, sections
from ichord.api.views import MachineView, OperationView
from ichord.contract import ContractMismatchError
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import Conflict, Forbidden, KubeError, NotFound
from ichord.kube.events import EventRecorder, ObjectRef
from ichord.kube.forbidden import forbidden_message
from ichord.kube.status import update_status
from ichord.metrics import OPERATION_STAGE_DURATION
from ichord.operations import op_status, windows
from ichord.operations.lock import Exclusion, acquire_disruptive_lock, release_lock
from ichord.operations.op_status import Decision, Transition
from ichord.operations.outcome import Blocked, Failed, Outcome, Requeue
from ichord.operations.progress import history_of, note_progress, predicted_seconds
from ichord.pki.scrub import SCRUBBER
from ichord.render.trusted_cas import BundleMismatchError, describe_refusals
from ichord.settings import Timing

log = structlog.get_logger("ichord.operations")

Obj = dict[str, Any]
Mutation = Callable[[Obj], None]

BLOCKED = "Blocked"
FORBIDDEN = names.EventReason.FORBIDDEN
PAUSED = "Paused"
PLANNED = "Planned"
IN_PROGRESS = "InProgress"


@dataclass(frozen=True)
class OperationKind:
    """What the backbone needs to know of a kind: its description (name, condition, finalizer, abandon rules: one
    table in api/operation_kinds.py) and the behaviour only the kind can compute."""

    description: KindDescription
    #: The TalosMachines (names) a running operation covers: their deletion waits for it (operations/guard.py).
    covers: Callable[[OperationView, list[MachineView]], set[str]] = lambda _op, machines: approved(machines)

    @property
    def kind(self) -> str:
        return self.description.name

    @property
    def condition_type(self) -> str:
        return self.description.condition_type

    @property
    def finalizer(self) -> str:
        return self.description.finalizer

    def abandonable(self, op: OperationView) -> bool:
        """docs/decisions.md#abandon-or-hold: may ``op`` in its state be abandoned when deleted?"""
        return self.description.abandonable(op)


def approved(machines: list[MachineView]) -> set[str]:
    """Every approved machine of the cluster (what a ca-rotation's passes visit)."""
    return {m.name for m in machines if m.approved}


class Context(Protocol):
    """The shared handles of a step (managed.context.StepContext is one)."""

    kube: KubeClient
    namespace: str  # the controller namespace (a cluster's lock Lease lives in the cluster's own namespace)
    recorder: EventRecorder
    timing: Timing

    def now(self) -> dt.datetime: ...

    def observe(self, obj: Obj) -> None: ...


class Subject(Protocol):
    """The operation a step works on, kept current by ``write`` (managed.inputs.Inputs is one)."""

    op: Obj

    @property
    def name(self) -> str: ...

    @property
    def op_namespace(self) -> str: ...

    @property
    def uid(self) -> str: ...

    @property
    def status(self) -> Obj: ...

    @property
    def cluster_name(self) -> str: ...


# ---- the status writer (the one place) ------------------------------------------------------------


async def write(ctx: Context, subject: Subject, *mutations: Mutation) -> Obj:
    """Apply ``mutations`` to a fresh read of the status (conflicts retried); keeps ``subject.op`` current."""
    return await _write(ctx, subject, mutations)


async def transition(ctx: Context, subject: Subject, change: Transition, *also: Mutation) -> bool:
    """Write ``change`` (with ``also`` in the same write) on a fresh read; True when the condition transitioned
    (the change's Event then posted)."""
    decision = Decision()
    await _write(ctx, subject, also, change, decision)
    return op_status.announce(ctx.recorder, subject.op, change, decision)


async def _write(ctx: Context, subject: Subject, mutations: tuple[Mutation, ...], change: Transition | None = None,
                 decision: Decision | None = None) -> Obj:
    ended: list[StageEnded] = []
    history = history_of([v.obj for v in getattr(ctx, "operations", None) or []], subject.uid)

    def mutate(status: Obj, obj: Obj) -> Obj | None:
        before = stage_of(status)
        ended.clear()
        if change is not None and decision is not None and not decision.track(change, status, obj, ctx.now()):
            return None  # the object as read already says it
        for m in mutations:
            m(status)
        mirror_stage(status, obj)
        described = describe(str((obj.get("spec") or {}).get("kind") or ""))
        if described is not None:  # in this write, never one of its own; the past from the step's list, no read
            note_progress(described, status, ctx.now(), history, carried=_carried(status, obj))
        status["observedGeneration"] = int((obj.get("metadata") or {}).get("generation") or 0)
        ended[:] = note_stage_change(obj, status, before, ctx.now())
        return status

    obj = await update_status(crds.operations(ctx.kube), subject.op_namespace, subject.name, mutate)
    observe_stages(ended)  # only once written (a conflict runs the mutation again)
    subject.op = obj
    ctx.observe(obj)
    return obj


def _carried(status: Obj, obj: Obj) -> bool:
    """The write changes more than the progress: it is sent anyway (a new mark of a step under way rides on it)."""
    read = obj.get("status") or {}
    return any(status.get(k) != read.get(k) for k in {*status, *read} - {"progress", "observedGeneration"})


def mirror_stage(status: Obj, obj: Obj) -> None:
    """The stage and step of a kind that keeps them in its own section (a ca-rotation's status.caRotation) also at
    status.stage/status.step, where every kind keeps them, so the STAGE and STEP printer columns read one path for
    every kind (api/operation_kinds.STAGE_COLUMN; the kind's own record stays its section's)."""
    kind = describe(str((obj.get("spec") or {}).get("kind") or ""))
    if kind is None or kind.section is None:
        return
    section = status.get(kind.section)
    if isinstance(section, dict) and section.get("stage"):
        status["stage"] = section.get("stage")
        status["step"] = section.get("step") or None  # None: the merge patch removes a step the stage no longer has


def stage_of(status: Obj) -> str:
    """The stage a status records: its kind's section's (the one a status has), else status.stage."""
    for name in sections():
        stage = (status.get(name) or {}).get("stage")
        if stage:
            return str(stage)
    return str(status.get("stage") or "")


@dataclass(frozen=True)
class StageEnded:
    kind: str
    stage: str
    seconds: float


def note_stage_change(obj: Obj, status: Obj, before: str, now: dt.datetime) -> list[StageEnded]:
    """When a write moves the stage: stamp when the new one began (status.stageSince) and say how long the last
    one took, for ``observe_stages`` once the write succeeded. ``now``: the step's clock, as every other time the
    step writes.

    Every status write that can move a stage calls it (``write``, and any write made outside it, such as the
    hand-off's resourceVersion-guarded one)."""
    if stage_of(status) == before:
        return []
    since = status.get("stageSince")
    status["stageSince"] = now_rfc3339(now)
    if not before or not since:
        return []
    try:
        seconds = max(0.0, (now - parse_time(str(since))).total_seconds())
    except ValueError:
        return []
    return [StageEnded(str((obj.get("spec") or {}).get("kind") or ""), before, seconds)]


def observe_stages(ended: list[StageEnded]) -> None:
    for e in ended:
        OPERATION_STAGE_DURATION.labels(kind=e.kind, stage=e.stage).observe(e.seconds)


def phase(ctx: Context, value: str, message: str) -> Mutation:
    """The operation's phase and its Succeeded condition, stamped with the step's clock (as the kind's condition is)."""
    def m(status: Obj) -> None:
        op_status.set_phase(status, value, SCRUBBER.text(message), ctx.now())

    return m


set_kind_condition = op_status.set_kind_condition


def condition(ctx: Context, kind: OperationKind, status_value: str, reason: str, message: str, *,
              timed: bool = False) -> Mutation:
    now = ctx.now()

    def m(status: Obj) -> None:
        set_kind_condition(status, Condition(kind.condition_type, status_value, reason, SCRUBBER.text(message)), now,
                           timed=timed)

    return m


def in_progress(ctx: Context, kind: OperationKind, reason: str, message: str, *,
                timed: bool = False) -> list[Mutation]:
    return [phase(ctx, Phase.IN_PROGRESS, message), condition(ctx, kind, "Unknown", reason, message, timed=timed)]


def since_transition(kind: OperationKind, op_status: Obj, reason: str, now: dt.datetime) -> float | None:
    """Seconds since the kind's condition took ``reason`` (None when it does not hold that reason)."""
    cond = find(op_status.get("conditions"), kind.condition_type)
    if cond is None or cond.get("reason") != reason or not cond.get("lastTransitionTime"):
        return None
    return (now - parse_time(str(cond["lastTransitionTime"]))).total_seconds()


def event(ctx: Context, subject: Subject, type_: str, reason: str, message: str) -> None:
    ctx.recorder.record(ObjectRef.of(subject.op), type_, reason, SCRUBBER.text(message))


def log_transition(kind: OperationKind, subject: Subject, what: str, **fields: Any) -> None:
    log.info(SCRUBBER.text(what), kind=kind.kind, cluster=f"{subject.op_namespace}/{subject.cluster_name}",
             operation=subject.name, stage=OperationView.of(subject.op).stage,
             **{k: SCRUBBER.value(v) for k, v in fields.items()})


# ---- the shared transitions -------------------------------------------------------------------------


async def blocked(ctx: Context, kind: OperationKind, subject: Subject, message: str, *,
                  reason: str = BLOCKED, machines: list[Obj] | None = None) -> Blocked:
    """Paused, the kind's condition False/Blocked naming the cause, one Warning per cause; retried."""
    message = SCRUBBER.text(message)
    change = Transition(Condition(kind.condition_type, "False", BLOCKED, message), phase=Phase.PAUSED,
                        event=("Warning", names.EventReason.OPERATION_BLOCKED), per_message=True, said=None)
    also: list[Mutation] = [] if machines is None else [lambda s: s.__setitem__("machines", machines)]
    if await transition(ctx, subject, change, *also):
        log_transition(kind, subject, f"{kind.kind} blocked", cause=message)
    return Blocked(reason, message, ctx.timing.retry)


def window_closed(ctx: Context, cluster: Obj, what: str,
                  need: Callable[[], float] = lambda: 0.0) -> windows.Closed | None:
    """docs/decisions.md#maintenance-windows: None when ``what`` (a node's or a pass's first disruptive call) may
    start now; else why not and when to look again (at the opening, or before the cluster lock lapses). ``need``:
    the seconds ``what`` is predicted to take (``predicted_step``; asked only while a window is open), which must fit
    in what is left of the window.
    Asked on the step's clock as it reads now: call it right before the call it admits."""
    return windows.verdict(cluster, ctx.now(), what=what, recheck=ctx.timing.cluster_lock_duration / 3, need=need)


def predicted_step(ctx: Context, op: Obj, node: str) -> float:
    """What the next step of ``node`` in ``op`` is predicted to take (docs/maintenance-windows.md): as the ETA prices
    it from this run's timed steps and the cluster's past operations (operations/progress.py), else
    ``Timing.node_step_estimate``."""
    described = describe(str((op.get("spec") or {}).get("kind") or ""))
    uid = str((op.get("metadata") or {}).get("uid") or "")
    found = None if described is None else predicted_seconds(
        described, op.get("status") or {}, node,
        history_of([v.obj for v in getattr(ctx, "operations", None) or []], uid))
    return ctx.timing.node_step_estimate if found is None else found


async def wait_for_window(ctx: Context, kind: OperationKind, subject: Subject, closed: windows.Closed) -> Outcome:
    """Outside every maintenance window: InProgress, the kind's condition Unknown/WaitingForWindow naming the next
    opening, one Normal Event (a planned wait); windows that cannot be read are Blocked (a person must fix them)."""
    if closed.invalid:
        return await blocked(ctx, kind, subject, closed.message)
    change = Transition(Condition(kind.condition_type, "Unknown", names.WAITING_FOR_WINDOW,
                                  SCRUBBER.text(closed.message)), phase=Phase.IN_PROGRESS,
                        event=("Normal", names.EventReason.WAITING_FOR_WINDOW), said=_waiting_already)
    if await transition(ctx, subject, change):
        log_transition(kind, subject, f"{kind.kind} waiting for a maintenance window", why=closed.message)
    return Requeue(closed.after, names.WAITING_FOR_WINDOW)


def _waiting_already(cond: Condition, before: Obj | None) -> bool:
    """The same wait as read (a requeue to renew the lock): nothing written. A new opening is written, and its
    Event is posted only when the reason moved (one Event per wait)."""
    return before is not None and (before.get("reason"), before.get("message")) == (cond.reason, cond.message)


async def _write_without_subject(ctx: Context, kind: OperationKind, op: Obj, phase_value: str, reason: str,
                                 message: str, event_reason: str | None = None) -> bool:
    """Phase and the kind's condition (False, ``reason``) on an operation whose inputs were never read; True when
    the condition transitioned (a new reason or message: ``event_reason``'s Warning then posted)."""
    change = Transition(Condition(kind.condition_type, "False", reason, message), phase=phase_value,
                        event=None if event_reason is None else ("Warning", event_reason), per_message=True,
                        generation=True, said=None)
    written, moved = await op_status.transition(ctx.kube, ctx.recorder, ctx.now, op, change)
    ctx.observe(written)
    return moved


async def blocked_before_read(ctx: Context, kind: OperationKind, op: Obj, message: str, *, reason: str = BLOCKED,
                              event_reason: str = names.EventReason.OPERATION_BLOCKED) -> Blocked:
    """Blocked when the step could not even read its inputs (the cluster, the bundle): same shape, best effort.

    ``reason``: the condition's (Blocked, or one naming what the operator must do, e.g. BundleRestoreRequired);
    FORBIDDEN: a 403 of the management API (the condition's reason and the Warning's are Forbidden)."""
    message = SCRUBBER.text(message)
    event_reason = FORBIDDEN if reason == FORBIDDEN else event_reason
    with contextlib.suppress(KubeError):
        await _write_without_subject(ctx, kind, op, Phase.PAUSED, reason, message, event_reason)
    return Blocked(reason, message, ctx.timing.retry)


async def forbidden(ctx: Context, kind: OperationKind, op: Obj, exc: Forbidden) -> Blocked:
    """A 403 of the management API stops the step (the lock Lease, the bundle Secret): Paused, the kind's condition
    False/Forbidden naming the verb, resource and namespace refused and the chart value that grants them, one
    Warning per refusal; retried every Timing.retry, so a grant added later resumes the operation where it was."""
    namespace = str((op.get("metadata") or {}).get("namespace") or "")
    message = forbidden_message(exc, cluster_namespace=namespace)
    if OperationView.of(op).finished:
        # Completed or Failed stays as it is: what it did is the record, and nothing is left to block.
        log.warning("a finished operation's step was refused", operation=f"{namespace}/{op['metadata']['name']}",
                    error=SCRUBBER.text(message))
        return Blocked(FORBIDDEN, message, ctx.timing.retry)
    return await blocked_before_read(ctx, kind, op, message, reason=FORBIDDEN)


async def contract_mismatch(ctx: Context, kind: OperationKind, op: Obj, exc: ContractMismatchError,
                            machines: list[MachineView]) -> Blocked:
    """A step would have applied to a node of another Talos contract than the cluster's (the Talos client refused
    before sending: docs/decisions.md#contract-match): Paused, the kind's condition False/ContractMismatch naming the
    machine and both versions, one Warning per cause; retried every Timing.retry, so the operation goes on by itself
    once the node is upgraded or spec.talosVersion names what it runs. A finished operation is left as it is."""
    view = OperationView.of(op)
    machine = next((m.name for m in machines if m.address == exc.endpoint), "a machine")
    message = contract_match.operation_message(machine, exc.endpoint, exc.running, exc.contract,
                                               cluster=view.cluster or "", namespace=view.namespace)
    if view.finished:
        log.warning("a finished operation's step met a contract mismatch", operation=f"{view.namespace}/{view.name}",
                    error=message)
        return Blocked(names.CONTRACT_MISMATCH, message, ctx.timing.retry)
    return await blocked_before_read(ctx, kind, op, message, reason=names.CONTRACT_MISMATCH)


async def bundle_mismatch(ctx: Context, kind: OperationKind, op: Obj, exc: BundleMismatchError,
                          machines: list[MachineView], secret: str) -> Blocked:
    """A step would have applied to a node a render whose CAs it does not trust (another cluster's bundle in the
    Secret; docs/decisions.md#bundle-belongs): Paused, the kind's condition False/BundleMismatch naming the machine
    and the fingerprints, one Warning per cause; retried every Timing.retry, so the operation goes on by itself
    once the cluster's own bundle is back. A finished operation is left as it is."""
    view = OperationView.of(op)
    machine = next((m.name for m in machines if m.address == exc.endpoint), "a machine")
    refused = describe_refusals(exc.refused, "the node")
    message = (f"nothing is applied to TalosMachine {machine}: {refused}; the bundle in {secret} is not the one "
               "this cluster's nodes trust (another cluster's?). The operation waits here and goes on by itself "
               "once the cluster's own bundle is back in the Secret: see the TalosCluster's Ready "
               f"(`kubectl -n {view.namespace} get tc {view.cluster or ''} -o yaml`)")
    if view.finished:
        log.warning("a finished operation's step met a bundle mismatch", operation=f"{view.namespace}/{view.name}",
                    error=message)
        return Blocked(names.BUNDLE_MISMATCH, message, ctx.timing.retry)
    return await blocked_before_read(ctx, kind, op, message, reason=names.BUNDLE_MISMATCH)


async def fail(ctx: Context, kind: OperationKind, op: Obj, reason: str, message: str, *,
               event_reason: str | None = None) -> Failed:
    """Failed for good (an invalid spec): nothing was started, nothing will run until the spec changes.
    ``event_reason``: the Warning posted with it (once, when the write moved the condition)."""
    message = SCRUBBER.text(message)
    await _write_without_subject(ctx, kind, op, Phase.FAILED, reason, message, event_reason)
    return Failed(reason, message)


async def plan_only(ctx: Context, kind: OperationKind, subject: Subject, plan: Obj) -> None:
    """Created with spec.paused: true: write the plan for review; nothing else runs (the CRDs)."""
    message = "plan only: spec.paused is true; set it to false to start"
    await write(ctx, subject, lambda s: s.__setitem__("plan", plan), phase(ctx, Phase.PENDING, message),
                condition(ctx, kind, "False", PLANNED, message))


async def hold_paused(ctx: Context, kind: OperationKind, subject: Subject, stage: str) -> Blocked:
    """spec.paused set after the start: hold at this step boundary (the lock is the caller's to keep)."""
    message = (f"paused in {stage} by spec.paused: nothing is applied until it is set to false; the cluster lock "
               f"stays held")
    before = find(subject.status.get("conditions"), kind.condition_type)
    if before is None or before.get("reason") != PAUSED:  # the step's copy saves a read on every paused step
        change = Transition(Condition(kind.condition_type, "False", PAUSED, SCRUBBER.text(message)),
                            phase=Phase.PAUSED, event=("Normal", names.EventReason.OPERATION_PAUSED))
        if await transition(ctx, subject, change):
            log_transition(kind, subject, f"{kind.kind} paused by spec")
    return Blocked(PAUSED, message, ctx.timing.retry)


async def resume_if_paused(ctx: Context, kind: OperationKind, subject: Subject, stage: str) -> None:
    """spec.paused is false again: one OperationResumed Event, InProgress in the same stage."""
    cond = find(subject.status.get("conditions"), kind.condition_type)
    if cond is None or cond.get("reason") != PAUSED:
        return
    message = f"resumed in {stage}: spec.paused is false"
    change = Transition(Condition(kind.condition_type, "Unknown", IN_PROGRESS, SCRUBBER.text(message)),
                        phase=Phase.IN_PROGRESS, event=("Normal", names.EventReason.OPERATION_RESUMED),
                        said=_not_paused)
    if await transition(ctx, subject, change):
        log_transition(kind, subject, f"{kind.kind} resumed")


def _not_paused(_cond: Condition, before: Obj | None) -> bool:
    """Resumed already (or never paused) as the object reads now: nothing to say."""
    return before is None or before.get("reason") != PAUSED


async def lock(ctx: Context, kind: OperationKind, subject: Subject, *, approved_control_planes: int,
               other_under_way: str | None) -> Blocked | None:
    """Take or renew the cluster lock (a Lease in the cluster's namespace, where the operation is too); the refusal
    as a Blocked outcome (status written) otherwise."""
    # A 403 (the Lease not granted in the cluster's namespace) raises: the registry turns it into Forbidden.
    listed = getattr(ctx, "operations", None)
    if other_under_way is not None and other_under_way not in {op.uid for op in listed or []}:
        # The refusal names the operation under way and its kind: read it once (only on this refusal) when the step
        # did not list it.
        objs, _ = await crds.operations(ctx.kube).list_objects(subject.op_namespace)
        listed = [OperationView.of(o) for o in objs]
    known = {op.uid: f"{op.namespace}/{op.name}" for op in listed or []}
    excluding = None
    if other_under_way is not None:
        other = next((op for op in listed or [] if op.uid == other_under_way), None)
        excluding = Exclusion(other_under_way, known.get(other_under_way, f"with UID {other_under_way}"),
                              other.description if other is not None else None)
    decision = await acquire_disruptive_lock(
        ctx.kube, subject.op_namespace, subject.cluster_name, subject.uid,
        approved_control_planes=approved_control_planes, excluding=excluding,
        duration=ctx.timing.cluster_lock_duration, now=ctx.now,
        name_of=lambda uid: known.get(uid, f"with UID {uid}"), memo=getattr(ctx, "lock_memo", None))
    if decision.acquired:
        return None
    return await blocked(ctx, kind, subject, decision.message, reason=decision.reason)


async def ensure_finalizer(ctx: Context, kind: OperationKind, subject: Subject) -> None:
    meta = subject.op["metadata"]
    finalizers = list(meta.get("finalizers") or [])
    if kind.finalizer in finalizers:
        return
    subject.op = await crds.operations(ctx.kube).patch(subject.op_namespace, subject.name, {"metadata": {
        "resourceVersion": meta["resourceVersion"], "finalizers": [*finalizers, kind.finalizer]}})
    ctx.observe(subject.op)


async def let_go(ctx: Context, kind: OperationKind, op: Obj) -> None:
    """Release the lock (only if this operation holds it) and remove the finalizer; idempotent."""
    view = OperationView.of(op)
    if view.cluster:
        try:
            await release_lock(ctx.kube, view.namespace, view.cluster, view.uid)
        except Forbidden as exc:
            # The lock is not released early, but it lapses on its own (its holder stops renewing it and the next
            # operation takes over an expired lock): the finalizer still goes, and the operation keeps its phase.
            log.warning("cannot release the cluster lock; it expires on its own", operation=f"{view.namespace}/"
                        f"{view.name}", error=SCRUBBER.text(forbidden_message(exc, cluster_namespace=view.namespace)))
    if kind.finalizer not in view.finalizers:
        return
    rest = [f for f in view.finalizers if f != kind.finalizer]
    try:
        ctx.observe(await crds.operations(ctx.kube).patch(view.namespace, view.name, {"metadata": {
            "resourceVersion": view.resource_version, "finalizers": rest or None}}))
    except (NotFound, Conflict):
        return  # gone already, or changed: the next step sees the fresh object


# ---- steps inside a stage (explicit, persisted: bounds are timed from them) -----------------------------


def step(name: str, now: dt.datetime, *, section: str | None = None) -> Mutation:
    """Name the step under way (``status.<section>.step`` or ``status.step``) and when it began."""
    stamp = now_rfc3339(now)

    def m(status: Obj) -> None:
        target = status.setdefault(section, {}) if section else status
        if target.get("step") != name:
            target["step"], target["stepSince"] = name, stamp

    return m


def step_since(op_status: Obj, name: str, *, section: str | None = None) -> dt.datetime | None:
    target = (op_status.get(section) or {}) if section else op_status
    if target.get("step") != name or not target.get("stepSince"):
        return None
    return parse_time(str(target["stepSince"]))


def other_under_way(operations: list[OperationView], subject_uid: str) -> str | None:
    """The UID of another operation of the cluster under way whose kind excludes others (a ca-rotation's does):
    the lock refuses to start beside it."""
    for op in operations:
        if op.uid != subject_uid and op.excludes_others:
            return op.uid
    return None
