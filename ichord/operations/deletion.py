"""A deleted operation that is past its point of no return (docs/decisions.md#abandon-or-hold): held, said once, run on.

The kind decides through ``OperationKind.abandonable``; an operation it may not abandon gets the condition
DeletionHeld=True (reason PastPointOfNoReturn, the stage in the message) and one DeletionHeld Warning, then
goes on to Done, where the backbone's let-go removes the finalizer and the delete completes.
"""

from __future__ import annotations

from ichord.api import names
from ichord.api.conditions import Condition, find
from ichord.api.names import DeletionHeldReason, EventReason
from ichord.api.views import OperationView
from ichord.operations.backbone import Context, Obj, OperationKind, Subject, log_transition, transition
from ichord.operations.op_status import Transition
from ichord.pki.scrub import SCRUBBER


def deletion_held(op: Obj) -> bool:
    cond = find((op.get("status") or {}).get("conditions"), names.DELETION_HELD)
    return cond is not None and cond.get("status") == "True"


def must_abandon(kind: OperationKind, op: Obj) -> bool:
    """Deleted, still under way, and the kind's table says it may be abandoned (never once held)."""
    view = OperationView.of(op)
    return view.deleting and view.unfinished and not deletion_held(op) and kind.abandonable(view)


def _held_already(_cond: Condition, before: Obj | None) -> bool:
    return before is not None and before.get("status") == "True"


async def hold_deletion(ctx: Context, kind: OperationKind, subject: Subject, stage: str, detail: str) -> None:
    """DeletionHeld=True once, with one Warning; the operation goes on (its finalizer goes at Done).

    Written through the one writer (operations/op_status.py): decided on the object as read for the write, so a
    step holding an older copy neither writes it again nor posts a second Warning."""
    if deletion_held(subject.op):
        return
    message = SCRUBBER.text(
        f"deleted in {stage}, past the point of no return: the {kind.kind} cannot be abandoned now and runs on to "
        f"Done, then the delete completes. {detail}")
    change = Transition(Condition(names.DELETION_HELD, "True", DeletionHeldReason.PAST_POINT_OF_NO_RETURN, message),
                        event=("Warning", EventReason.DELETION_HELD), said=_held_already)
    if await transition(ctx, subject, change):
        log_transition(kind, subject, f"{kind.kind} deletion held")
