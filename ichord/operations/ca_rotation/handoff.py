"""AwaitingCredentials: the operator's hand-off (docs/decisions.md#credentials-handoff;
docs/decisions.md#credentials-handoff and "an early acknowledgement").

Entering the stage removes whatever hand-off annotation the operation carries (a merge patch carrying
the read resourceVersion), and the stage is written with the resourceVersion that patch returned: an
annotation set between the two makes the status write fail, and the step runs again. An annotation
set while the stage waits, equal to CARotationHandoffToken, lets the rotation go on.
"""

from __future__ import annotations

import copy
from typing import Any

from ichord.api import names
from ichord.kube import crds
from ichord.kube.errors import Conflict
from ichord.operations import backbone
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.operations.ca_rotation.status import Mutation
from ichord.operations.managed.context import Obj, StepContext
from ichord.operations.managed.inputs import Inputs


def acknowledged(op: Obj) -> bool:
    """The annotation equals the token of the new CAs status shows."""
    token = handoff_token((op.get("status") or {}).get("caRotation", {}).get("certificates") or [])
    value = ((op.get("metadata") or {}).get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION)
    return bool(token) and value == token


async def enter(ctx: StepContext, inputs: Inputs, *mutations: Mutation) -> bool:
    """Drop any early acknowledgement, then write the stage on exactly that object; False on a race."""
    ops = crds.operations(ctx.kube)
    meta = inputs.op["metadata"]
    patched: dict[str, Any] = inputs.op
    if names.CREDENTIALS_HANDOFF_ANNOTATION in (meta.get("annotations") or {}):
        try:
            patched = await ops.patch(inputs.op_namespace, inputs.name, {"metadata": {
                "resourceVersion": meta["resourceVersion"],
                "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: None}}})
        except Conflict:
            return False
    status = copy.deepcopy(patched.get("status") or {})
    before = backbone.stage_of(status)
    for m in mutations:
        m(status)
    backbone.mirror_stage(status, patched)
    status["observedGeneration"] = int((patched.get("metadata") or {}).get("generation") or 0)
    ended = backbone.note_stage_change(patched, status, before, ctx.now())
    # A merge patch keeps what it does not name: what the mutations removed (the previous stage's step, its
    # apiServerInstances) is sent as null, or AwaitingCredentials would carry Accepting's step on.
    old_status = patched.get("status") or {}
    for key in set(old_status) - set(status):
        status[key] = None
    old_ca, new_ca = old_status.get("caRotation") or {}, status.get("caRotation")
    if isinstance(new_ca, dict):
        for key in set(old_ca) - set(new_ca):
            new_ca[key] = None
    body = {"metadata": {"resourceVersion": patched["metadata"]["resourceVersion"]}, "status": status}
    try:
        inputs.op = await ops.patch_status(inputs.op_namespace, inputs.name, body)
    except Conflict:
        return False
    backbone.observe_stages(ended)
    ctx.observe(inputs.op)
    return True
