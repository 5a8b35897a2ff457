"""A `config` operation deleted mid-rollout gives back what it took: ichord's cordons, then the lock.

While the operation holds the cluster lock no other operation cordons in that cluster, so every Node
carrying ichord's cordon annotation is this rollout's; each is uncordoned (never a Node a person
cordoned: kube.nodes.uncordon checks the annotation). A node still rebooting is uncordoned too: it takes
pods again once its kubelet is Ready, as it would after the roll. When the managed API cannot be reached
the operation is let go anyway and a Warning Event names what may be left cordoned.
"""

from __future__ import annotations

import structlog

from ichord.api import names
from ichord.errors import IchordError
from ichord.kube import nodes as kube_nodes
from ichord.kube.reads import list_nodes
from ichord.operations import backbone
from ichord.operations.managed.clients import admin_client
from ichord.operations.managed.context import StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.pki.scrub import SCRUBBER
from ichord.talos.dial import DialBundle

log = structlog.get_logger(__name__)


async def release_cordons(ctx: StepContext, inputs: Inputs) -> list[str]:
    """Uncordon every Node ichord cordoned in the cluster; the Nodes released. Best effort: a failure is an Event."""
    released: list[str] = []
    talos = ctx.talos_factory(DialBundle.from_bundle(inputs.bundle))
    try:
        async with admin_client(talos, inputs.control_planes, [inputs.bundle.k8s.cert_pem]) as managed:
            for node in await list_nodes(managed):
                view = kube_nodes.NodeView.of(node)
                if view.cordoned_by_ichord and await kube_nodes.uncordon(managed, view.name, view):  # as just listed
                    released.append(view.name)
    except IchordError as exc:
        message = (f"the config operation {inputs.name} was deleted mid-rollout and its cordons could not be "
                   f"released ({SCRUBBER.exception(exc)}); uncordon by hand any Node annotated "
                   f"{kube_nodes.CORDONED_BY_ICHORD_ANNOTATION}")
        log.warning("config: cordons not released", operation=inputs.name, error=SCRUBBER.exception(exc))
        # Not an op_status.Transition: no condition moves. The operation is deleted and let go in this same step
        # (its finalizer removed), so a condition would vanish with it; the Event, which outlives the object, is
        # the one record a person can find (docs/architecture.md: one writer of an operation's status).
        backbone.event(ctx, inputs, "Warning", names.EventReason.OPERATION_BLOCKED, message)
        return released
    finally:
        talos.close()
    if released:
        log.info("config: deleted mid-rollout; cordons released", operation=inputs.name, nodes=released)
    return released
