"""The ca-rotation as the registry runs it: one step of one operation in the cluster actor's scope."""

from __future__ import annotations

from ichord.api.disruptions import PlannedDisruption
from ichord.api.views import OperationView
from ichord.operations.ca_rotation.stage_table import advance
from ichord.operations.ca_rotation.status import CA_ROTATION
from ichord.operations.disruptions import reboot_of
from ichord.operations.managed.clients import ManagedClients
from ichord.operations.managed.context import context_of
from ichord.operations.outcome import Done, Failed, Outcome
from ichord.operations.registry import Operation
from ichord.operations.roll_store import MarkerFormatError, marker_from_status
from ichord.operations.scope import ClusterScope
from ichord.settings import Timing


def ca_rotation_operation() -> Operation:
    """The ``ca-rotation`` kind for one registry: its managed-cluster clients are kept across steps, one per
    cluster, and closed when the operation ends (a pass verifies, gates and restarts clients over many steps)."""
    clients = ManagedClients()

    async def advance_in_scope(scope: ClusterScope, op: OperationView) -> Outcome:
        outcome = await advance(context_of(scope, clients), op.obj)
        if isinstance(outcome, Done | Failed):
            await clients.close(scope.key)
        return outcome

    return Operation(CA_ROTATION, advance_in_scope, close=clients.close_all, disruptions=disruptions)


def disruptions(op: OperationView, timing: Timing) -> list[PlannedDisruption]:
    """The etcd roll's reboot under way (status.caRotation.etcdRebooting, asked for at etcdRestartedAt).

    A pass's kube-apiserver restarts are not listed: the machine reconciler stands aside for the whole rotation
    (Ready=Unknown/CARotationInProgress) and the node's Talos API stays up through them."""
    try:
        planned = reboot_of(op, marker_from_status(op.status), timing.node_action_timeout)
    except MarkerFormatError:
        return []  # unreadable: the loss is reported as one (the step itself says what is wrong with the marker)
    return [planned] if planned is not None else []
