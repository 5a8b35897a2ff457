"""The Reboot class on one machine, through the backbone's roll (docs/decisions.md#config-rollout, roll.py's state
table).

    converged (and no reboot outstanding)      -> done without a call; ichord's cordon (if any) released
    gates: held? Node Ready, dry run, etcd (CP) -> closed: Blocked, retried
    outside every maintenance window            -> not cordoned: WaitingForWindow (operations/windows.py)
    cordon (roll)                              -> drain rounds (before_reboot): Eviction API, one round a step
    drained                                    -> STAGED apply of the render (own deadline), then the roll
                                                  records the boot ID and calls Reboot (own deadline)
    new boot ID, Node Ready                    -> verifiers: runs the render (else fail for good), etcd (CP)
    verified                                   -> uncordon (only ichord's cordon), done

STAGED writes the configuration for the next boot and restarts nothing, so the marker (the boot ID) is
written before the Reboot is asked for: a daemon killed in between resumes into "wait for the boot ID to
change" and never reboots the node twice. Never AUTO, never the deprecated REBOOT mode.
"""

from __future__ import annotations

from ichord.api.views import MachineView
from ichord.errors import IchordError
from ichord.failpoints import failpoint
from ichord.kube import crds
from ichord.operations import backbone
from ichord.operations.config import checks
from ichord.operations.config.plan import HOLD_ANNOTATION
from ichord.operations.config.world import ROLL_FIELDS, World
from ichord.operations.managed.drain import DrainVerdict, drain_round, end_drain
from ichord.operations.managed.rendered import runs_render
from ichord.operations.outcome import Requeue
from ichord.operations.roll import (
    PROCEED,
    Gate,
    HookResult,
    HookVerdict,
    KubeNodes,
    MarkerStore,
    RollHooks,
    RollOutcome,
    RollReason,
    RollTarget,
    TalosNodes,
    advance_roll,
)
from ichord.operations.roll_state import GateResult
from ichord.operations.roll_store import StatusMarkerStore
from ichord.operations.windows import Closed
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import ApplyMode
from ichord.talos.errors import TalosError, TalosUnreachableError


def marker_store(world: World) -> StatusMarkerStore:
    inputs = world.inputs
    return StatusMarkerStore(crds.operations(world.ctx.kube), inputs.op_namespace, inputs.name, ROLL_FIELDS)


async def advance_reboot(world: World, m: MachineView, store: MarkerStore | None = None) -> RollOutcome:
    """One step of the Reboot class on ``m`` (a machine under way); ``store``: its marker (status.roll default)."""
    store = store or marker_store(world)
    nodes = KubeNodes(world.managed)  # this step's Node: read once, then its copy (roll_ports.KubeNodes)
    marker = await store.read()
    target = await world.target(m)
    rendered = world.rendered(m)
    if marker.rebooting != m.name and m.name not in marker.done:
        try:
            converged = await runs_render(world.talos, m.address, rendered)
        except TalosError:
            converged = False  # the gates below say why it cannot go on
        if converged:
            # Nothing to do (or a rollout resumed after the reboot was recorded elsewhere): release what is ours.
            failpoint("config.skip.before")
            try:
                drain_obj = (await nodes.read(target.node)).obj
                await nodes.uncordon(target.node)
                await end_drain(world.managed, target.node, drain_obj)
            except IchordError:
                pass  # the Node is released on a later step; the machine is done either way
            await store.write(marker.finished(m.name))
            return RollOutcome(Requeue(0.0, "converged"), RollReason.NODE_REBOOTED, m.name,
                               f"{m.name} already runs the rendered configuration; nothing done")

    async def held(_t: RollTarget) -> GateResult:
        return checks.not_held(m.name, world.annotations(m.name), HOLD_ANNOTATION)

    async def ready(t: RollTarget) -> GateResult:
        return await checks.node_is_ready(nodes, t.node)

    async def dry(_t: RollTarget) -> GateResult:
        return await checks.dry_run(world.talos, m.address, rendered, m.name, world.inputs.cluster_inputs.contract)

    async def etcd(_t: RollTarget) -> GateResult:
        return await checks.etcd_whole(world.talos, world.control_planes)

    async def back(_t: RollTarget) -> GateResult:
        return await checks.back_on_render(world.talos, m.address, rendered, m.name)

    async def drain_and_stage(t: RollTarget) -> HookResult:
        try:
            drained = await drain_round(world.managed, t.node, now=world.now(), bound=world.ctx.timing.drain_bound,
                                        node_obj=(await nodes.read(t.node)).obj)
        except IchordError as exc:
            return HookResult(HookVerdict.WAIT, f"cannot drain Node {t.node} yet: {SCRUBBER.exception(exc)}",
                              world.ctx.timing.reboot_poll)
        if drained.wrote_node:
            nodes.forget(t.node)  # its annotation changed: an uncordon after this round reads it again
        if drained.verdict == DrainVerdict.REFUSED:
            return HookResult(HookVerdict.GIVE_UP, drained.message)
        if drained.verdict == DrainVerdict.WAIT:
            return HookResult(HookVerdict.WAIT, drained.message, world.ctx.timing.reboot_poll)
        failpoint("config.stage.before")
        try:
            # Staged by an earlier step whose marker was never written (killed, API down): not applied twice.
            staged = await runs_render(world.talos, m.address, rendered, persistent=True)
        except TalosError:
            staged = False  # the apply says whether the node answers
        try:
            if not staged:
                await world.talos.apply_configuration(m.address, rendered.wire_bytes(), ApplyMode.STAGED,
                                                      contract=world.inputs.cluster_inputs.contract)
        except TalosUnreachableError as exc:
            return HookResult(HookVerdict.WAIT, f"cannot stage {m.name}'s configuration yet: {exc}",
                              world.ctx.timing.reboot_poll)
        except TalosError as exc:
            return HookResult(HookVerdict.GIVE_UP, f"{m.name} refused the staged configuration: {exc}")
        failpoint("config.stage.after")
        return PROCEED

    async def window(_t: RollTarget) -> Closed | None:
        # Asked by the roll right before the node's cordon, on the clock as it reads then; the node's step must fit.
        return backbone.window_closed(world.ctx, world.inputs.cluster, f"the reboot of {m.name}",
                                      lambda: backbone.predicted_step(world.ctx, world.inputs.op, m.name))

    gates: list[Gate] = [held, ready, dry]
    verifiers: list[Gate] = [back]
    if m.is_control_plane:
        gates.append(etcd)
        verifiers.append(etcd)
    hooks = RollHooks(before_reboot=drain_and_stage)
    return await advance_roll([target], store, TalosNodes(world.talos, world.inputs.cluster_inputs.contract),
                              nodes, gates=gates, verifiers=verifiers, hooks=hooks,
                              timing=world.ctx.timing, clock=world.ctx.now, admit=window)
