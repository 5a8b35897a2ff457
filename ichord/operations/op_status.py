"""The one writer of an operation's phase, its conditions and the Event that goes with a transition.

Every place that says something about a TalosOperation in its status (a step's wait or block, a kind this
ichord does not run, a cluster that does not exist, steps that keep failing, a deletion held past the point of no
return, a spec changed after the start) describes the change as a ``Transition`` and writes it here:

- through kube/status.update_status, so a conflict is a fresh read and never a lost update;
- decided on the object as read for the write, never on an informer's or a step's older copy: a condition that
  already says it (``said``) is not written again, and a finished operation is not reopened when asked;
- stamped with the step's clock (the scope's or the step context's ``now``), never the wall clock, so a
  lastTransitionTime and the bounds timed from it agree with every other time the step writes;
- the Event (a Warning for what needs a person, Normal for a planned hold) posted once, only when the write
  that was sent moved the condition (its reason, or for ``per_message`` its message: one Warning per cause).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ichord.api.conditions import Condition, find, set_condition, set_operation_phase
from ichord.api.views import OperationView
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.events import EventRecorder, ObjectRef
from ichord.kube.status import update_status

Obj = dict[str, Any]
Clock = Callable[[], dt.datetime]
#: A change of the status beside the transition (the plan, the machines' list), applied in the same write.
Mutation = Callable[[Obj], None]
#: The phase to write, decided on the object as read (e.g. Paused once started, else Pending).
PhaseOf = Callable[[OperationView], str]


def _same_reason(cond: Condition, before: Obj | None) -> bool:
    return before is not None and before.get("reason") == cond.reason


@dataclass(frozen=True)
class Transition:
    """What one write says: the condition, the phase with it (None: the phase is left alone), the Event that goes
    with a transition of the condition."""

    condition: Condition
    phase: str | PhaseOf | None = None
    #: (type, reason) of the Event posted when the write moves the condition; None: no Event.
    event: tuple[str, str] | None = None
    #: A new message is a new transition too (Blocked: one Warning per cause).
    per_message: bool = False
    #: A change of reason restarts lastTransitionTime even when the status stays (waits timed from the reason).
    timed: bool = False
    #: Record the generation read in status.observedGeneration and on the condition.
    generation: bool = False
    #: Leave a finished (Completed, Failed) operation as it is.
    unfinished_only: bool = False
    #: The condition as read already says this: nothing is written, no Event (default: it has the same reason).
    #: None: always written (a message or phase kept current), the Event still only on a transition.
    said: Callable[[Condition, Obj | None], bool] | None = _same_reason

    def moves(self, before: Obj | None) -> bool:
        """Whether writing this over ``before`` (the condition as read) is a transition worth its Event."""
        if before is None or before.get("reason") != self.condition.reason:
            return True
        return self.per_message and before.get("message") != self.condition.message

    def apply(self, status: Obj, obj: Obj, now: dt.datetime) -> bool | None:
        """Apply to ``status`` of ``obj`` (both as read for the write): None when there is nothing to write, else
        whether the condition transitioned."""
        view = OperationView.of(obj)
        before = find(status.get("conditions"), self.condition.type)
        if (self.unfinished_only and view.finished) or (self.said is not None and self.said(self.condition, before)):
            return None
        generation = view.generation if self.generation else None
        if self.phase is not None:
            value = self.phase if isinstance(self.phase, str) else self.phase(view)
            set_operation_phase(status, value, self.condition.message, now=now, observed_generation=generation)
        set_kind_condition(status, self.condition, now, timed=self.timed, observed_generation=generation)
        return self.moves(before)


def set_kind_condition(status: Obj, cond: Condition, now: dt.datetime, *, timed: bool = False,
                       observed_generation: int | None = None) -> None:
    """Set a condition stamped ``now``; ``timed``: a change of reason restarts lastTransitionTime (the wait named by
    the reason is timed from when the reason was first written, and survives a restart)."""
    conditions = status.get("conditions") or []
    old = find(conditions, cond.type)
    if timed and old is not None and old.get("reason") != cond.reason:
        conditions = [c for c in conditions if c.get("type") != cond.type]
    status["conditions"] = set_condition(conditions, cond, now=now, observed_generation=observed_generation)


def set_phase(status: Obj, phase: str, message: str, now: dt.datetime) -> None:
    """The phase and its Succeeded condition alone (a step's progress beside its kind's condition)."""
    set_operation_phase(status, phase, message, now=now)


class Decision:
    """What ``Transition.apply`` decided in the mutation of the write that was sent (a conflict runs it again)."""

    def __init__(self) -> None:
        self.moved: bool | None = None

    def track(self, transition: Transition, status: Obj, obj: Obj, now: dt.datetime) -> bool:
        """Apply ``transition``; False when it has nothing to write."""
        self.moved = transition.apply(status, obj, now)
        return self.moved is not None

    @property
    def transitioned(self) -> bool:
        return bool(self.moved)


def announce(recorder: EventRecorder, op: Obj, transition: Transition, decision: Decision) -> bool:
    """Post the transition's Event when the write sent moved the condition; True when it did."""
    if not decision.transitioned:
        return False
    if transition.event is not None:
        type_, reason = transition.event
        recorder.record(ObjectRef.of(op), type_, reason, transition.condition.message)
    return True


async def transition(kube: KubeClient, recorder: EventRecorder, now: Clock, op: Obj, change: Transition, *,
                     current: Obj | None = None, also: Sequence[Mutation] = ()) -> tuple[Obj, bool]:
    """Write ``change`` to the operation ``op`` names; the object as written (or as read, when nothing was to be
    written) and whether the condition transitioned (its Event then posted). ``current``: a copy to try first
    (its resourceVersion guards the write). NotFound and API errors propagate."""
    meta = op["metadata"]
    decision = Decision()

    def mutate(status: Obj, obj: Obj) -> Obj | None:
        if not decision.track(change, status, obj, now()):
            return None
        for m in also:
            m(status)
        return status

    written = await update_status(crds.operations(kube), meta["namespace"], meta["name"], mutate, current=current)
    return written, announce(recorder, op, change, decision)
