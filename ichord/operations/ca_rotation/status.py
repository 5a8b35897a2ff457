"""The one place a ca-rotation writes its TalosOperation status; every message goes through the scrubber.

Timers (caClientSettleDelay, caKubeletSettleDelay, caClientRestartTimeout) are measured from the
CARotation condition's lastTransitionTime. Unlike plain metav1 semantics, a change of *reason* also
moves it here (``timed=True``): the wait named by the reason starts when the reason is first written,
and is kept, persisted, while the same reason is rewritten (so it survives a restart).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import structlog

from ichord.api import names
from ichord.api.conditions import Condition, find, now_rfc3339, parse_time, set_condition, set_operation_phase
from ichord.api.names import CARotationReason, Phase
from ichord.kube import crds
from ichord.kube.events import ObjectRef
from ichord.kube.status import update_status
from ichord.operations.ca_rotation.context import Inputs, Obj, RotationContext
from ichord.operations.outcome import Blocked, Requeue
from ichord.pki.scrub import SCRUBBER

log = structlog.get_logger("ichord.operations.ca_rotation")

Mutation = Callable[[Obj], None]

#: The steps of a pass stage (status.caRotation.step): apply where a node differs, then verify.
APPLY_STEP = "apply"
VERIFY_STEP = "verify"


def set_ca_condition(status: Obj, cond: Condition, now: dt.datetime, *, timed: bool = False) -> None:
    conditions = status.get("conditions") or []
    old = find(conditions, cond.type)
    if timed and old is not None and old.get("reason") != cond.reason:
        conditions = [c for c in conditions if c.get("type") != cond.type]
    status["conditions"] = set_condition(conditions, cond, now=now)


def since_transition(op_status: Obj, reason: str, now: dt.datetime) -> float | None:
    """Seconds since the CARotation condition took ``reason`` (None when it does not hold that reason)."""
    cond = find(op_status.get("conditions"), names.CA_ROTATION)
    if cond is None or cond.get("reason") != reason or not cond.get("lastTransitionTime"):
        return None
    return (now - parse_time(str(cond["lastTransitionTime"]))).total_seconds()


async def write(ctx: RotationContext, inputs: Inputs, *mutations: Mutation) -> Obj:
    """Apply ``mutations`` to a fresh read of the status (conflicts retried) and keep ``inputs.op`` current."""

    def mutate(status: Obj, obj: Obj) -> Obj:
        for m in mutations:
            m(status)
        status["observedGeneration"] = int((obj.get("metadata") or {}).get("generation") or 0)
        return status

    obj = await update_status(crds.operations(ctx.kube), inputs.op_namespace, inputs.name, mutate)
    inputs.op = obj
    return obj


def phase(value: str, message: str, now: dt.datetime | None = None) -> Mutation:
    def m(status: Obj) -> None:
        set_operation_phase(status, value, SCRUBBER.text(message), now=now)

    return m


def condition(ctx: RotationContext, status_value: str, reason: str, message: str, *, timed: bool = False) -> Mutation:
    now = ctx.now()

    def m(status: Obj) -> None:
        set_ca_condition(status, Condition(names.CA_ROTATION, status_value, reason, SCRUBBER.text(message)), now,
                         timed=timed)

    return m


def started(ctx: RotationContext) -> Mutation:
    stamp = now_rfc3339(ctx.now())

    def m(status: Obj) -> None:
        status.setdefault("startedAt", stamp)

    return m


def in_progress(ctx: RotationContext, reason: str, message: str, *, timed: bool = False) -> list[Mutation]:
    return [phase(Phase.IN_PROGRESS, message), condition(ctx, "Unknown", reason, message, timed=timed)]


def event(ctx: RotationContext, inputs: Inputs, type_: str, reason: str, message: str) -> None:
    ctx.recorder.record(ObjectRef.of(inputs.op), type_, reason, SCRUBBER.text(message))


def log_transition(inputs: Inputs, what: str, **fields: Any) -> None:
    log.info(SCRUBBER.text(what), cluster=inputs.cluster_name, operation=inputs.name,
             stage=inputs.ca_status.get("stage") or "", **{k: SCRUBBER.value(v) for k, v in fields.items()})


def step(name: str, now: dt.datetime) -> Mutation:
    """Name the step under way in ``status.caRotation`` and when it began (bounds are timed from it)."""
    stamp = now_rfc3339(now)

    def m(status: Obj) -> None:
        ca = status.setdefault("caRotation", {})
        if ca.get("step") != name:
            ca["step"], ca["stepSince"] = name, stamp

    return m


def step_since(op_status: Obj, name: str) -> dt.datetime | None:
    ca = op_status.get("caRotation") or {}
    if ca.get("step") != name or not ca.get("stepSince"):
        return None
    return parse_time(str(ca["stepSince"]))


async def wait_within_bound(ctx: RotationContext, inputs: Inputs, reason: str, message: str, *,
                            machines: list[Obj] | None = None) -> Blocked | Requeue:
    """A normal wait of a pass (machines answering again, Nodes Ready): InProgress naming what it waits for,
    no Warning; past ``ca_pass_wait_bound`` (timed from the verify step's persisted start) it is Blocked."""
    now = ctx.now()
    since = step_since(inputs.status, VERIFY_STEP)
    bound = ctx.timing.ca_pass_wait_bound
    elapsed = 0.0 if since is None else (now - since).total_seconds()
    if elapsed >= bound:
        return await blocked(ctx, inputs, f"{message} (waited more than {bound:g} s)", machines=machines)
    cond = find(inputs.status.get("conditions"), names.CA_ROTATION)
    if since is None or cond is None or (cond.get("reason"), cond.get("message")) != (reason, SCRUBBER.text(message)):
        muts: list[Mutation] = [step(VERIFY_STEP, now), *in_progress(ctx, reason, message)]
        if machines is not None:
            muts.append(lambda s: s.__setitem__("machines", machines))
        await write(ctx, inputs, *muts)
    return Requeue(min(ctx.timing.ca_pass_verify_delay, bound - elapsed), reason)


async def blocked(ctx: RotationContext, inputs: Inputs, message: str, *,
                  reason: str = CARotationReason.BLOCKED, machines: list[Obj] | None = None) -> Blocked:
    """Paused, CARotation=False/Blocked naming the cause; retried every Timing.retry (ADR 0063)."""
    message = SCRUBBER.text(message)
    before = find(inputs.status.get("conditions"), names.CA_ROTATION)
    muts: list[Mutation] = [phase(Phase.PAUSED, message), condition(ctx, "False", CARotationReason.BLOCKED, message)]
    if machines is not None:
        muts.append(lambda s: s.__setitem__("machines", machines))
    await write(ctx, inputs, *muts)
    if before is None or before.get("message") != message or before.get("reason") != CARotationReason.BLOCKED:
        event(ctx, inputs, "Warning", names.EventReason.OPERATION_BLOCKED, message)
        log_transition(inputs, "ca-rotation blocked", cause=message)
    return Blocked(reason, message, ctx.timing.retry)
