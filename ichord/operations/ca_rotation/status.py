"""The ca-rotation's status vocabulary: the backbone's writer and transitions, bound to the CARotation kind.

Timers (caClientSettleDelay, caKubeletSettleDelay, caClientRestartTimeout) are measured from the
CARotation condition's lastTransitionTime; a change of *reason* also moves it (``timed=True``): the
wait named by the reason starts when the reason is first written and survives a restart. The pass
stages name their step explicitly (``status.caRotation.step``: apply, verify) and the bound on a
pass's normal waits is timed from when the verify step began.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ichord.api import names, operation_kinds
from ichord.api.conditions import Condition, find, now_rfc3339
from ichord.operations import backbone, intent, op_status
from ichord.operations.backbone import Mutation, OperationKind
from ichord.operations.managed.context import Obj, StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.operations.outcome import Blocked, Requeue
from ichord.pki.scrub import SCRUBBER

#: What the backbone knows of a ca-rotation (its description: api/operation_kinds.py).
CA_ROTATION = OperationKind(operation_kinds.CA_ROTATION)

#: The steps of a pass stage (status.caRotation.step): apply where a node differs, then verify.
APPLY_STEP = "apply"
VERIFY_STEP = "verify"
#: The pass is verified; the stage's gates run (kube-root-ca.crt, the aggregator ConfigMap, the settle delays),
#: and their steps do not read every machine again (a node lost meanwhile is met by the next stage's pass).
GATES_STEP = "gates"
#: Finalizing's steps, in order (explicit, not inferred from a condition reason).
FINALIZING_VERIFY = "verify-replaced"
FINALIZING_AGGREGATOR = "reset-aggregator"
FINALIZING_SETTLE = "settle-nodes"
FINALIZING_RESTART = "restart-clients"

__all__ = ["APPLY_STEP", "CA_ROTATION", "FINALIZING_AGGREGATOR", "FINALIZING_RESTART", "FINALIZING_SETTLE",
           "FINALIZING_VERIFY", "GATES_STEP", "VERIFY_STEP", "Mutation", "blocked", "ca_status", "condition", "event",
           "in_progress", "log_transition", "phase",
           "set_ca_condition", "since_transition", "started", "step", "step_since", "wait_within_bound", "write"]

phase = backbone.phase


def ca_status(inputs: Inputs) -> Obj:
    """The operation's ``status.caRotation`` as the step read it (a copy)."""
    return dict(inputs.status.get("caRotation") or {})


def set_ca_condition(status: Obj, cond: Condition, now: dt.datetime, *, timed: bool = False) -> None:
    backbone.set_kind_condition(status, cond, now, timed=timed)


def since_transition(op_status: Obj, reason: str, now: dt.datetime) -> float | None:
    """Seconds since the CARotation condition took ``reason`` (None when it does not hold that reason)."""
    return backbone.since_transition(CA_ROTATION, op_status, reason, now)


async def write(ctx: StepContext, inputs: Inputs, *mutations: Mutation) -> Obj:
    return await backbone.write(ctx, inputs, *mutations)


def condition(ctx: StepContext, status_value: str, reason: str, message: str, *, timed: bool = False) -> Mutation:
    return backbone.condition(ctx, CA_ROTATION, status_value, reason, message, timed=timed)


def in_progress(ctx: StepContext, reason: str, message: str, *, timed: bool = False) -> list[Mutation]:
    return backbone.in_progress(ctx, CA_ROTATION, reason, message, timed=timed)


def started(ctx: StepContext, op: Obj) -> list[Mutation]:
    """Out of Pending: when, and the spec it was started from (the accepted intent, operations/intent.py), in one
    write with the phase, so the chart's admission policy (which reads the phase) and ichord (which runs on the
    accepted spec) fix the intent at the same moment."""
    now = ctx.now()
    stamp = now_rfc3339(now)

    def m(status: Obj) -> None:
        status.setdefault("startedAt", stamp)
        if status.get("phase") in (None, "", names.Phase.PENDING):
            op_status.set_phase(status, names.Phase.IN_PROGRESS, "started: checking the cluster before the first "
                                "change", now)

    return [m, intent.accept(op)]


event = backbone.event


def log_transition(inputs: Inputs, what: str, **fields: Any) -> None:
    backbone.log_transition(CA_ROTATION, inputs, what, **fields)


async def blocked(ctx: StepContext, inputs: Inputs, message: str, *,
                  reason: str = names.CARotationReason.BLOCKED, machines: list[Obj] | None = None) -> Blocked:
    """Paused, CARotation=False/Blocked naming the cause; retried every Timing.retry
    (docs/decisions.md#rotation-state)."""
    return await backbone.blocked(ctx, CA_ROTATION, inputs, message, reason=reason, machines=machines)


def step(name: str, now: dt.datetime) -> Mutation:
    """Name the step under way in ``status.caRotation`` and when it began (bounds are timed from it)."""
    return backbone.step(name, now, section="caRotation")


def step_since(op_status: Obj, name: str) -> dt.datetime | None:
    return backbone.step_since(op_status, name, section="caRotation")


async def wait_within_bound(ctx: StepContext, inputs: Inputs, reason: str, message: str, *,
                            machines: list[Obj] | None = None, step_name: str = VERIFY_STEP) -> Blocked | Requeue:
    """A normal wait of a pass (machines answering again, Nodes Ready): InProgress naming what it waits for,
    no Warning; past ``ca_pass_wait_bound`` (timed from ``step_name``'s persisted start: a pass's verify step,
    or Finalizing's verify-replaced) it is Blocked."""
    now = ctx.now()
    since = step_since(inputs.status, step_name)
    bound = ctx.timing.ca_pass_wait_bound
    elapsed = 0.0 if since is None else (now - since).total_seconds()
    if elapsed >= bound:
        return await blocked(ctx, inputs, f"{message} (waited more than {bound:g} s)", machines=machines)
    cond = find(inputs.status.get("conditions"), names.CA_ROTATION)
    if since is None or cond is None or (cond.get("reason"), cond.get("message")) != (reason, SCRUBBER.text(message)):
        muts: list[Mutation] = [step(step_name, now), *in_progress(ctx, reason, message)]
        if machines is not None:
            muts.append(lambda s: s.__setitem__("machines", machines))
        await write(ctx, inputs, *muts)
    return Requeue(min(ctx.timing.ca_pass_verify_delay, bound - elapsed), reason)
