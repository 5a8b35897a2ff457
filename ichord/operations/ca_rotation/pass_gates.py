"""The health gates of a CA rotation (docs/decisions.md#health-gates): asked before each pass starts and before each
control plane of the etcd reboot roll (etcd_roll.roll_step's admit), the way a config rollout asks them before
each node (operations/gates.py).

A pass is gated once, before ``status.caRotation.passStarted`` is recorded (the same point its maintenance window is
asked); a pass that started runs to its end and is never gated again mid-pass. The target the verdicts are recorded
for (``status.healthGates.target``) is ``the <Stage> pass`` or the control plane's machine name. The first pass
(Accepting) and the first control plane of a roll have no soak before them, like the first node of a rollout: the
gates are still asked.
"""

from __future__ import annotations

from ichord.api.carotation import Stage
from ichord.operations import gates
from ichord.operations.ca_rotation.etcd_roll import ManagedAPI
from ichord.operations.ca_rotation.passes import kubernetes_cas
from ichord.operations.ca_rotation.plan import apply_dial
from ichord.operations.ca_rotation.status import CA_ROTATION
from ichord.operations.managed.context import StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.operations.outcome import Blocked, Requeue
from ichord.pki.rotation import Rotation


def pass_target(stage: Stage) -> str:
    return f"the {stage.value} pass"


async def before_pass(ctx: StepContext, inputs: Inputs, rotation: Rotation, stage: Stage) -> Blocked | Requeue | None:
    """None when the pass may start; else the hold (Paused GateFailing, or InProgress Soaking). The managed cluster is
    dialled only when a CEL gate reads its Nodes, with the credentials the pass's first apply uses."""
    talos = ctx.talos_factory(apply_dial(inputs.bundle, rotation, stage))
    managed = ManagedAPI(talos, inputs.control_planes, kubernetes_cas(inputs, rotation), clients=ctx.managed,
                         key=inputs.cluster_key, issued_in=stage.value)
    try:
        return await gates.hold(ctx, CA_ROTATION, inputs, inputs.cluster, gates.opening_probe(managed.client),
                                target=pass_target(stage), first=stage is Stage.ACCEPTING)
    finally:
        await managed.aclose()
        talos.close()

