"""The ca-rotation as the registry runs it: one step of one operation in the cluster actor's scope."""

from __future__ import annotations

from ichord.api.views import OperationView
from ichord.operations.ca_rotation.context import RotationContext
from ichord.operations.ca_rotation.stage_table import advance
from ichord.operations.ca_rotation.status import CA_ROTATION
from ichord.operations.outcome import Outcome
from ichord.operations.registry import Operation
from ichord.operations.scope import ClusterScope


def context_of(scope: ClusterScope) -> RotationContext:
    """The rotation's handles from the step's scope: its trust hooks, its clock, its operations list."""
    return RotationContext(scope.kube, scope.controller_namespace, scope.recorder, scope.timing, now=scope.now,
                           trust_hook=scope.trust.trust, trust_refusal=scope.trust.refusal, observe=scope.observe,
                           operations=scope.operations, allowed_secret_namespaces=scope.allowed_secret_namespaces)


async def advance_in_scope(scope: ClusterScope, op: OperationView) -> Outcome:
    return await advance(context_of(scope), op.obj)


OPERATION = Operation(CA_ROTATION, advance_in_scope)
