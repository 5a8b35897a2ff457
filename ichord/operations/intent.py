"""An operation's intent is immutable once it started: the accepted spec, and what ichord does when it changes.

The API server refuses the change itself when the chart's ValidatingAdmissionPolicy is installed
(helm/ichord/templates/validatingadmissionpolicy.yaml: every spec field but ``paused`` is fixed once the stored
object's ``status.phase`` has left Pending; see there why a policy and not a CRD validation rule).

Where no such policy runs (the API simulator, or the chart's policy disabled), ichord keeps the intent it
accepted: the step that moves the operation out of Pending records the spec it planned from in
``status.acceptedSpec`` (``accept``), and every later step runs on that spec with only ``paused`` taken live
(``keep``). A spec that differs raises the ``SpecChangeIgnored`` condition naming the fields, and one Warning
Event per distinct change; putting the spec back lowers it. ``ichord cluster status`` shows the condition.
"""

from __future__ import annotations

import copy
from typing import Any

import structlog

from ichord.api import names
from ichord.api.conditions import Condition, find
from ichord.api.views import OperationView
from ichord.operations.op_status import Transition
from ichord.operations.scope import ClusterScope
from ichord.pki.scrub import SCRUBBER

log = structlog.get_logger("ichord.operations")

Obj = dict[str, Any]

#: The one spec field that may change after the start (it holds or resumes the operation).
MUTABLE = frozenset({"paused"})
#: status.acceptedSpec: the spec the operation was started from, ``paused`` left out.
ACCEPTED_SPEC = "acceptedSpec"


def intent_of(spec: Obj) -> Obj:
    """The spec without what may change after the start."""
    return {k: copy.deepcopy(v) for k, v in spec.items() if k not in MUTABLE}


def accept(op: Obj) -> Any:
    """A status mutation recording ``op``'s spec (as the step read it and planned from) as the accepted intent.

    Written in the same status write that moves the operation out of Pending; kept if already there."""
    intent = intent_of(op.get("spec") or {})

    def m(status: Obj) -> None:
        status.setdefault(ACCEPTED_SPEC, intent)

    return m


def changed_fields(accepted: Obj, spec: Obj) -> list[str]:
    """The spec paths (``spec.caRotation.targets``) whose value differs from the accepted intent."""
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{path}.{key}")
        elif a != b:
            out.append(path)

    current = intent_of(spec)
    for key in sorted(set(accepted) | set(current)):
        walk(accepted.get(key), current.get(key), f"spec.{key}")
    return out


def effective(op: OperationView) -> OperationView:
    """The operation as its steps must see it: the accepted spec, with ``paused`` as it is now."""
    accepted = op.status.get(ACCEPTED_SPEC)
    if not isinstance(accepted, dict):
        return op
    obj = dict(op.obj)
    live = op.spec
    spec = copy.deepcopy(accepted)
    for key in MUTABLE:
        if key in live:
            spec[key] = live[key]
    obj["spec"] = spec
    return OperationView.of(obj)


def _message(fields: list[str]) -> str:
    return (f"{', '.join(fields)} changed after the operation started; ichord ignores the change and keeps the "
            f"spec it accepted (status.{ACCEPTED_SPEC}). Only spec.paused may change once an operation has left "
            f"Pending: put the field back, or create a new TalosOperation once this one finished "
            f"(the chart's ValidatingAdmissionPolicy refuses such a change outright)")


def _says(cond: Condition, before: Obj | None) -> bool:
    """The condition as read says this already (its status and message): nothing to write, nothing to Warn."""
    return before is not None and (before.get("status"), before.get("message")) == (cond.status, cond.message)


async def keep(scope: ClusterScope, op: OperationView) -> OperationView:
    """Report a spec changed since the start (condition + one Warning per distinct change); the effective view.

    Written through the one writer (operations/op_status.py) on a fresh read, stamped with the step's clock: the
    Warning goes only with the write that raised the condition or changed its message."""
    accepted = op.status.get(ACCEPTED_SPEC)
    if not isinstance(accepted, dict) or op.finished:
        return op
    fields = changed_fields(accepted, op.spec)
    current = find(op.status.get("conditions"), names.SPEC_CHANGE_IGNORED)
    if fields:
        message = SCRUBBER.text(_message(fields))
        if _says(Condition(names.SPEC_CHANGE_IGNORED, "True", names.SpecChangeReason.IGNORED, message), current):
            return effective(op)  # the step's copy says it already: no read, no write
        change = Transition(Condition(names.SPEC_CHANGE_IGNORED, "True", names.SpecChangeReason.IGNORED, message),
                            event=("Warning", names.EventReason.SPEC_CHANGE_IGNORED), per_message=True,
                            generation=True, said=_says)
        if await scope.transition(op, change, from_copy=False):
            log.warning("operation spec changed after its start; ignored", cluster=scope.key,
                        operation=op.name, fields=fields)
    elif current is not None and current.get("status") == "True":
        await scope.transition(op, Transition(
            Condition(names.SPEC_CHANGE_IGNORED, "False", names.SpecChangeReason.AS_ACCEPTED,
                      "the spec is the one the operation was started from again"),
            generation=True, said=_says), from_copy=False)
    return effective(op)
