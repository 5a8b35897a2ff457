"""The ``config`` operation as the registry runs it (docs/decisions.md#config-rollout): plan, refusals, the lifecycle,
one executor step.

    created paused                      -> plan only (status.plan), phase Pending, reason Planned
    no machine waits / another operation of the cluster unfinished / a planned machine's render invalid
                                        -> Failed (NothingToDo, ClusterCARotating, OperationUnfinished,
                                           InvalidConfig): refused, nothing written but the status
    a render turns invalid mid-rollout  -> Blocked naming the machine and the field; nothing applied to it
    started                             -> finalizer, the cluster lock, status.plan (the order run), stage Rolling
    Rolling                             -> one executor step on the machine under way (reboot.py, apiserver.py)
    every planned machine done          -> Completed (ConfigRollout True/RolledOut, one ConfigApplied Event),
                                           lock released, finalizer removed

Failpoints (ICHORD_FAILPOINTS), besides the roll's (roll.py)::

    config.skip.before               a machine found on the render, not yet recorded done
    config.stage.before / .after     drained; the STAGED apply not sent / answered (marker not written)
    config.apiserver.marker.before   dry run passed, container ID read, marker not written
    config.apiserver.marker.after    marker written, NO_REBOOT apply not sent
    config.apiserver.apply.after     applied, nothing recorded
    config.apiserver.done.before     restarted and Ready, not recorded done

Control planes one at a time in the plan's order, then workers up to ``maxUnavailable`` at once (workers.py; the
operation's, else the cluster's, else the daemon's --max-unavailable, a percentage of the cluster's workers),
then the plan's last machine alone (ichord's own node when it is in the plan).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Awaitable, Callable

import anyio
import structlog

from ichord.api import names, operation_kinds
from ichord.api.conditions import find, now_rfc3339
from ichord.api.disruptions import PlannedDisruption
from ichord.api.names import Phase
from ichord.api.views import MachineView, OperationView
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.errors import KubeError
from ichord.operations import backbone, etcd_snapshot, gates, guard, intent
from ichord.operations.backbone import OperationKind
from ichord.operations.config import workers
from ichord.operations.config.apiserver import SECTION as RESTART_SECTION
from ichord.operations.config.apiserver import RestartMarker, advance_restart
from ichord.operations.config.machine_status import RolloutReason, set_rollout_condition
from ichord.operations.config.plan import (
    Candidate,
    Change,
    PlannedMachine,
    Refusal,
    plan_machines,
    plan_status,
    planned_from_status,
    reboots_control_plane,
    refusal,
)
from ichord.operations.config.reboot import advance_reboot
from ichord.operations.config.release import release_cordons
from ichord.operations.config.world import ROLL_FIELDS, NodeNameUnknown, World
from ichord.operations.disruptions import reboot_of, restart_of
from ichord.operations.managed.clients import ManagedAPIError, ManagedClients, NodeWatcher
from ichord.operations.managed.context import Obj, StepContext, context_of
from ichord.operations.managed.inputs import Inputs, InputsError, load_inputs
from ichord.operations.managed.rendered import render_of
from ichord.operations.outcome import Blocked, Done, Outcome, Requeue, soonest
from ichord.operations.registry import Operation
from ichord.operations.roll import RollOutcome, RollReason
from ichord.operations.roll_store import MarkerFormatError, marker_from_status
from ichord.operations.scope import ClusterScope
from ichord.pki.scrub import SCRUBBER
from ichord.render.errors import RenderError
from ichord.render.strict import InvalidConfigError
from ichord.settings import Timing
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

log = structlog.get_logger("ichord.operations.config")

def _covers(op: OperationView, machines: list[MachineView]) -> set[str]:
    """The machines of the plan once written (the ones rolled), else every approved one (guard.py)."""
    planned = {str(m.get("name")) for m in ((op.status.get("plan") or {}).get("machines") or []) if m.get("name")}
    return planned or backbone.approved(machines)


#: What the backbone knows of a config rollout (its description, always abandonable: api/operation_kinds.py;
#: deleting it gives back its cordon and lets the lock go, release.py).
CONFIG = OperationKind(operation_kinds.CONFIG, covers=_covers)
ROLLING = "Rolling"
ROLLED_OUT = "RolledOut"

#: Roll reasons -> the ConfigRollout reasons (docs/decisions.md#config-rollout) (on the operation and on the machine).
_ROLL_REASONS = {
    RollReason.CORDONED: RolloutReason.DRAINING,
    RollReason.DRAINING: RolloutReason.DRAINING,
    RollReason.REBOOTING: RolloutReason.REBOOTING,
    RollReason.AWAITING_NODE: RolloutReason.REBOOTING,
    RollReason.REBOOT_REQUESTED_AGAIN: RolloutReason.REBOOTING,
}


def own_node() -> str | None:
    """The Node ichord runs on (the chart sets NODE_NAME from the downward API); its machine goes last."""
    return os.environ.get("NODE_NAME") or None


def config_operation() -> Operation:
    """The ``config`` kind for one registry: its managed-cluster clients are kept across steps, one per cluster."""
    clients = ManagedClients()

    async def advance(scope: ClusterScope, op: OperationView) -> Outcome:
        return await advance_in_scope(scope, op, clients)

    return Operation(CONFIG, advance, close=clients.close_all, disruptions=disruptions)


def disruptions(op: OperationView, timing: Timing) -> list[PlannedDisruption]:
    """The reboots and kube-apiserver restarts the rollout has asked for and not yet seen through, from its markers:
    the machine going alone (status.roll), the workers under way (status.workerRolls), the restart marker."""
    status = op.status
    rolls = workers.markers(status)
    # An unreadable marker plans nothing: the loss is reported as one (the step itself says what is wrong with it).
    with contextlib.suppress(MarkerFormatError):
        rolls.append(marker_from_status(status, ROLL_FIELDS))
    found = [reboot_of(op, m, timing.node_action_timeout) for m in rolls]
    restart = status.get(RESTART_SECTION) or {}
    found.append(restart_of(op, str(restart.get("machine") or ""), restart.get("appliedAt"),
                            timing.apiserver_restart_bound))
    return [d for d in found if d is not None]


async def advance_in_scope(scope: ClusterScope, op: OperationView, clients: ManagedClients) -> Outcome:
    ctx = context_of(scope)
    if op.deleting and not op.finished and op.stage:
        # Deleted mid-rollout: ichord's cordons go back before the lock does (release.py).
        try:
            inputs_now = await load_inputs(ctx, op.obj)
        except (InputsError, KubeError) as exc:
            log.warning("config: deleted mid-rollout; inputs unreadable, cordons not released", operation=op.name,
                        error=SCRUBBER.text(str(exc)))
        else:
            await release_cordons(ctx, inputs_now)
    if op.finished or op.deleting:
        await clients.close(scope.key)
        await backbone.let_go(ctx, CONFIG, op.obj)
        return Done()
    try:
        inputs = await load_inputs(ctx, op.obj)
    except InputsError as exc:
        return await backbone.blocked_before_read(ctx, CONFIG, op.obj, exc.message,
                                                  reason=backbone.FORBIDDEN if exc.reason == backbone.FORBIDDEN
                                                  else backbone.BLOCKED)
    # The approved machines' objects as load_inputs listed them this step (a second LIST of the namespace's
    # machines, every step, read the same objects again).
    objects = {m.name: _object(m) for m in inputs.machines}
    if not op.stage:
        return await _start(ctx, scope, op, inputs, objects)
    refused = await backbone.lock(ctx, CONFIG, inputs, approved_control_planes=len(inputs.control_planes),
                                  other_under_way=backbone.other_under_way(scope.operations, inputs.uid))
    if refused is not None:
        return refused
    if op.paused:
        return await backbone.hold_paused(ctx, CONFIG, inputs, op.stage)
    await backbone.resume_if_paused(ctx, CONFIG, inputs, op.stage)
    return await _rolling(ctx, inputs, objects, clients, scope.key, scope.watch_nodes)


def _object(m: MachineView) -> Obj:
    """The TalosMachine as this step read it (metadata with labels, annotations and resourceVersion, spec, status)."""
    return {"metadata": m.metadata, "spec": m.spec, "status": m.status}


async def _start(ctx: StepContext, scope: ClusterScope, op: OperationView, inputs: Inputs,
                 objects: dict[str, Obj]) -> Outcome:
    planned = plan_machines([Candidate.of(o) for o in objects.values()], own_node())
    refused = refusal(planned, scope.operations, inputs.uid)
    # Nothing planned may be because the machines' configuration is invalid (they report InvalidConfig, so no reboot
    # paths): say that, not "nothing to roll out".
    nothing = refused is not None and refused[0] == Refusal.NOTHING_TO_DO
    if refused is not None and not nothing:
        reason, message = refused
        log.info("config operation refused", operation=op.name, reason=reason)
        return await backbone.fail(ctx, CONFIG, op.obj, reason, message,
                                   event_reason=names.EventReason.OPERATION_BLOCKED)
    invalid = _invalid_render(inputs, [m.name for m in (inputs.machines if nothing else planned)])
    if invalid is None and refused is not None:
        log.info("config operation refused", operation=op.name, reason=refused[0])
        return await backbone.fail(ctx, CONFIG, op.obj, refused[0], refused[1],
                                   event_reason=names.EventReason.OPERATION_BLOCKED)
    if invalid is not None:
        log.info("config operation refused", operation=op.name, reason=Refusal.INVALID_CONFIG)
        return await backbone.fail(ctx, CONFIG, op.obj, Refusal.INVALID_CONFIG, invalid,
                                   event_reason=names.EventReason.INVALID_CONFIG)
    destination = etcd_snapshot.Destination.of(inputs.cluster.get("spec") or {})
    plan = plan_status(planned, len(inputs.control_planes), inputs.worker_bound,
                       etcd_snapshot=etcd_snapshot.plan_entry(destination, inputs.status),
                       snapshot_hint=etcd_snapshot.hint(inputs.cluster_name, inputs.op_namespace))
    if op.paused:
        await backbone.plan_only(ctx, CONFIG, inputs, plan)
        return Done()
    names_planned = {p.name for p in planned}
    held = await guard.hold_for_start(ctx.kube, inputs.cluster, [m for m in inputs.machines if m.name in names_planned])
    if held is not None:  # before anything irreversible: the cluster and the planned machines held
        return await backbone.blocked(ctx, CONFIG, inputs, held)
    await backbone.ensure_finalizer(ctx, CONFIG, inputs)
    refused_lock = await backbone.lock(ctx, CONFIG, inputs, approved_control_planes=len(inputs.control_planes),
                                       other_under_way=backbone.other_under_way(scope.operations, inputs.uid))
    if refused_lock is not None:
        return refused_lock
    if destination is not None and reboots_control_plane(planned):
        # A control plane's reboot restarts its etcd member: a snapshot first, before anything is changed.
        if (inputs.status.get("plan") or {}).get("etcdSnapshot") is None:
            await backbone.write(ctx, inputs, lambda s: s.__setitem__("plan", plan))  # where it goes, for review
        not_taken = await etcd_snapshot.take_before_reboots(ctx, CONFIG, inputs, destination)
        if not_taken is not None:
            return not_taken
        plan = {**plan, "etcdSnapshot": etcd_snapshot.plan_entry(destination, inputs.status)}
    stamp = now_rfc3339(ctx.now())
    order = ", ".join(f"{p.name} ({p.change.value})" for p in planned)

    def start(s: Obj) -> None:
        s["plan"], s["stage"] = plan, ROLLING
        s.setdefault("startedAt", stamp)

    await backbone.write(ctx, inputs, start, intent.accept(op.obj),
                         *backbone.in_progress(ctx, CONFIG, ROLLING, f"rolling out: {order}"))
    backbone.event(ctx, inputs, "Normal", names.EventReason.OPERATION_STARTED, f"config rollout started: {order}")
    backbone.log_transition(CONFIG, inputs, "config rollout started", machines=len(planned))
    return Requeue(0.0, "stage Rolling")


def _invalid_render(inputs: Inputs, machines: list[str]) -> str | None:
    """Why the rollout must not start: the render of one of ``machines`` (the planned ones; every one when nothing
    is planned) holds what Talos's decoder refuses (rebootPaths may predate the patch that made it so). Nothing is
    applied to any machine then."""
    by_name = {m.name: m for m in inputs.machines}
    for name in machines:
        m = by_name.get(name)
        if m is None:
            continue
        try:
            render_of(inputs, m)
        except InvalidConfigError as exc:
            return (f"the configuration of {name} is invalid, nothing was rolled out: {SCRUBBER.text(str(exc))}; "
                    "fix the patch, then create the operation again")
        except RenderError:
            continue  # reported on the machine (RenderFailed); the rollout reports it when it reaches it
    return None


def _current(planned: list[PlannedMachine], status: Obj) -> PlannedMachine | None:
    """The machine under way: a reboot or restart outstanding, else the first one in order not done."""
    roll = marker_from_status(status, ROLL_FIELDS)
    restart = RestartMarker.of(status)
    for name in (roll.rebooting, restart.machine):
        if name:
            found = next((p for p in planned if p.name == name), None)
            if found is not None:
                return found
    done = set(roll.done) | set(restart.done)
    return next((p for p in planned if p.name not in done), None)


def _issuer(ctx: StepContext, inputs: Inputs, clients: ManagedClients,
            key: str) -> tuple[TalosClient, list[MachineView], list[bytes]]:
    """Who issues the admin kubeconfig (the control planes, through Talos: the cluster's client kept across steps)
    and the Kubernetes CA it is verified by."""
    return clients.talos(key, DialBundle.from_bundle(inputs.bundle), ctx.talos_factory), inputs.control_planes, \
        [inputs.bundle.k8s.cert_pem]


async def _rolling(ctx: StepContext, inputs: Inputs, objects: dict[str, Obj], clients: ManagedClients,
                   key: str, watch_nodes: NodeWatcher | None) -> Outcome:
    planned = planned_from_status(inputs.status)
    current = _current(planned, inputs.status)
    if current is None:
        await clients.close(key)
        return await _complete(ctx, inputs, planned)
    parallel = not current.is_control_plane and current.name != planned[-1].name \
        and not marker_from_status(inputs.status, ROLL_FIELDS).rebooting
    m = next((x for x in inputs.machines if x.name == current.name), None)
    if m is None:
        return await backbone.blocked(ctx, CONFIG, inputs, f"TalosMachine {current.name} of the plan is not approved "
                                      "or does not exist; the rollout waits for it")
    talos, control_planes, trusted = _issuer(ctx, inputs, clients, key)
    outstanding = bool(marker_from_status(inputs.status, ROLL_FIELDS).rebooting or
                       RestartMarker.of(inputs.status).machine or workers.in_flight(inputs.status))
    try:
        async with clients.client(key, talos, control_planes, trusted) as managed:
            # A node back from its reboot wakes the next step (watchers/managed_nodes.py); reboot_poll stays
            # the fallback.
            clients.watch_nodes(key, watch_nodes)
            world = World(ctx, inputs, talos, managed, objects)
            if not outstanding:  # a new node is about to start: the health gates first (operations/gates.py)
                held = await gates.hold(ctx, CONFIG, inputs, inputs.cluster, gates.kube_probe(managed),
                                        target=current.name, first=current.name == planned[0].name)
                if held is not None:
                    return held
            if parallel:
                return await _workers(ctx, inputs, world, planned,
                                      gated=gates.declared(inputs.cluster, inputs.op))
            if current.change is Change.REBOOT:
                rolled = await advance_reboot(world, m)
                if rolled.window is not None:  # not started: outside every maintenance window
                    return await backbone.wait_for_window(ctx, CONFIG, inputs, rolled.window)
                reason = _ROLL_REASONS.get(rolled.reason, str(rolled.reason))
                return await _report(ctx, inputs, [current], rolled.outcome, reason, rolled.message,
                                     pause=rolled.pause, done=rolled.reason is RollReason.NODE_REBOOTED,
                                     polled=rolled.polled)
            if RestartMarker.of(inputs.status).machine != current.name:
                # Not started: its kube-apiserver restarts only inside a maintenance window.
                closed = backbone.window_closed(ctx, inputs.cluster, f"the kube-apiserver restart of {m.name}")
                if closed is not None:
                    return await backbone.wait_for_window(ctx, CONFIG, inputs, closed)
            restarted = await advance_restart(world, m)
            return await _report(ctx, inputs, [current], restarted.outcome, restarted.reason, restarted.message,
                                 pause=restarted.pause, done=restarted.reason in ("APIServerRestarted",
                                                                                  names.ReadyReason.CONVERGED))
    except RenderError as exc:
        # The inputs changed under the rollout (a patch now invalid): nothing is applied to the machine.
        return await backbone.blocked(ctx, CONFIG, inputs, f"cannot render {current.name}'s configuration, "
                                      f"nothing applied to it: {SCRUBBER.text(str(exc))}")
    except (ManagedAPIError, NodeNameUnknown) as exc:
        message = SCRUBBER.text(str(exc))
        if outstanding:
            # The node (maybe the only control plane) is rebooting or restarting its API server: waiting.
            why = RolloutReason.REBOOTING if current.reboots else RolloutReason.API_SERVER_RESTARTING
            return await _report(ctx, inputs, [current], Requeue(ctx.timing.reboot_poll, "waiting"), why,
                                 f"waiting for {current.name}: {message}", polled=True)
        return await backbone.blocked(ctx, CONFIG, inputs, f"{current.name}: {message}")


async def _workers(ctx: StepContext, inputs: Inputs, world: World, planned: list[PlannedMachine], *,
                   gated: bool = False) -> Outcome:
    """One step of every worker under way, then take new ones up to maxUnavailable as resolved this step.
    ``gated`` (health gates declared): new workers are taken only when none is under way, right after the gates let
    the round through (operations/gates.py), so every round is gated and soaked, never a freed slot alone."""
    objects = crds.operations(ctx.kube)
    by_name = {p.name: p for p in planned}
    outcomes: list[Outcome] = []
    shown: list[tuple[PlannedMachine, str, str]] = []
    paused: tuple[PlannedMachine, str] | None = None
    advanced: set[str] = set()
    # The workers' markers share the operation's status: written together, one write in flight (workers.StatusLine).
    line = workers.StatusLine(objects, inputs.op_namespace, inputs.name, inputs.op)
    # Twice at most: the slots a worker freed in the first round are taken in the second, in this same step,
    # rather than a whole step of the cluster later (docs/decisions.md#config-rollout: up to maxUnavailable at once).
    closed = None
    for round_ in range(2):
        freed = False
        # Outside every maintenance window, or with too little of it left for their step, no new worker is taken;
        # those under way finish (windows.py). Each is asked again at its cordon, on the clock as it reads then.
        candidates = workers.to_start(planned, inputs.status, inputs.worker_bound.at_once)
        closed = backbone.window_closed(ctx, inputs.cluster, "the next workers", functools.partial(
            _longest_step, ctx, inputs.op, [p.name for p in candidates]))
        taking = closed is None and (not gated or (round_ == 0 and not workers.in_flight(inputs.status)))
        starting = candidates if taking else []
        taken = [t.name for t in starting]
        if taken:
            inputs.op = await line.update(workers.opening(taken, ctx.now()))
            ctx.observe(inputs.op)
        under_way = [(name, by_name[name], m) for name in workers.in_flight(inputs.status)
                     if name not in advanced and name in by_name
                     and (m := workers.machine_of(inputs.machines, name)) is not None]
        # (left the plan or unapproved: its marker stays until it is back)
        advanced.update(name for name, _, _ in under_way)
        rolled_by = await _advance_workers(world, [(name, m) for name, _, m in under_way], line)
        if line.obj is not None:
            inputs.op = line.obj
            ctx.observe(inputs.op)
        await _machine_conditions(ctx, inputs, [(pm, rolled_by[name][0]) for name, pm, _m in under_way])
        for name, pm, _m in under_way:
            rolled, slot_closed = rolled_by[name]
            reason = _ROLL_REASONS.get(rolled.reason, str(rolled.reason))
            done = name in rolled.done
            if done:
                if not slot_closed:  # recorded done by an earlier step's write that left the slot (an older daemon's)
                    inputs.op = await line.update(workers.closing(name))
                    ctx.observe(inputs.op)
                outcomes.append(Requeue(0.0, "worker done"))
                freed = True
                continue
            if rolled.pause and paused is None:
                paused = (pm, rolled.message)
            outcomes.append(rolled.outcome)
            shown.append((pm, reason, rolled.message))
        if not freed or paused is not None:
            break
    if paused is not None:
        return await backbone.blocked(ctx, CONFIG, inputs, paused[1], machines=[
            {"name": p.name, "state": r, "message": SCRUBBER.text(msg)} for p, r, msg in shown])
    blocked = next((o for o in outcomes if isinstance(o, Blocked)), None)
    if blocked is not None:
        return await backbone.blocked(ctx, CONFIG, inputs, blocked.message)
    if closed is not None and all(r == RollReason.WAITING_FOR_WINDOW for _, r, _ in shown):
        return await backbone.wait_for_window(ctx, CONFIG, inputs, closed)  # nothing in flight: all wait
    summary = "; ".join(f"{p.name}: {r}" for p, r, _ in shown) or "taking the next workers"
    at_most = inputs.worker_bound.at_once
    await _operation_status(ctx, inputs, "RollingWorkers", f"workers under way (at most {at_most}): {summary}",
                            [{"name": p.name, "state": r, "message": SCRUBBER.text(msg)} for p, r, msg in shown])
    return soonest(*outcomes) if outcomes else Requeue(0.0, "workers")


async def _advance_workers(world: World, under_way: list[tuple[str, MachineView]], line: workers.StatusLine,
                           ) -> dict[str, tuple[RollOutcome, bool]]:
    """One roll step of each worker under way, together (each its own node and its own marker; a step of twenty
    workers one after the other lasted seconds). The first error is raised as it would be from one of them.
    Each worker's outcome, and whether its slot was freed by the write that recorded it done."""
    rolled: dict[str, tuple[RollOutcome, bool]] = {}

    async def one(name: str, m: MachineView) -> None:
        store = workers.WorkerMarkerStore(line, name)
        rolled[name] = (await advance_reboot(world, m, store), store.closed is not None)

    await _together([functools.partial(one, name, m) for name, m in under_way])
    return rolled


async def _together(calls: list[Callable[[], Awaitable[None]]]) -> None:
    """Run ``calls`` at once (each its own node or object); the first error is raised alone once all have ended:
    the callers' handlers expect one error, not a group."""
    errors: list[BaseException] = []

    async def one(call: Callable[[], Awaitable[None]]) -> None:
        try:
            await call()
        except Exception as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for call in calls:
            tg.start_soon(one, call)
    if errors:
        raise errors[0]


async def _machine_conditions(ctx: StepContext, inputs: Inputs,
                              rolled: list[tuple[PlannedMachine, RollOutcome]]) -> None:
    """Each worker's ConfigRollout on its own TalosMachine, written together (each its own object; one after the
    other, a step of twenty workers waited twenty round trips)."""
    await _together([functools.partial(_machine_condition, ctx, inputs, pm, _ROLL_REASONS.get(r.reason, str(r.reason)),
                                       r.message, pause=r.pause, done=pm.name in r.done, polled=r.polled)
                     for pm, r in rolled])


def _longest_step(ctx: StepContext, op: Obj, machines: list[str]) -> float:
    """The longest predicted step of ``machines`` (what the next workers need of a maintenance window)."""
    return max((backbone.predicted_step(ctx, op, name) for name in machines), default=0.0)


async def _machine_condition(ctx: StepContext, inputs: Inputs, pm: PlannedMachine, reason: str, message: str,
                             *, pause: bool = False, done: bool = False, polled: bool = False) -> None:
    """ConfigRollout on the machine (written only when it changes; ``polled``: a reboot's poll keeps the message the
    request wrote); a report, so a failure is only logged. The write starts from the machine as this step read it:
    no GET (a copy stale by then costs a 409 and a fresh read)."""
    m = next((x for x in inputs.machines if x.name == pm.name), None)
    machine = _object(m) if m is not None else None
    now = ctx.now()
    try:
        if done:
            await set_rollout_condition(ctx.kube, inputs.op_namespace, pm.name, "False", RolloutReason.ROLLED_OUT,
                                        message, now=now, current=machine)
        elif pause:
            await set_rollout_condition(ctx.kube, inputs.op_namespace, pm.name, "False", RolloutReason.FAILED,
                                        message, now=now, current=machine)
        elif reason in (RolloutReason.DRAINING, RolloutReason.REBOOTING, RolloutReason.API_SERVER_RESTARTING):
            await set_rollout_condition(ctx.kube, inputs.op_namespace, pm.name, "True", reason, message, now=now,
                                        current=machine, keep=polled)
    except IchordError as exc:
        log.warning("cannot write ConfigRollout on the machine", machine=pm.name, error=SCRUBBER.exception(exc))


async def _operation_status(ctx: StepContext, inputs: Inputs, reason: str, message: str,
                            machines: list[Obj], *, keep: bool = False) -> None:
    """``keep``: a condition of this reason already says it, only the message would change (a reboot's poll)."""
    cond = find(inputs.status.get("conditions"), names.CONFIG_ROLLOUT)
    text = SCRUBBER.text(message)
    same = cond is not None and cond.get("reason") == reason and (keep or cond.get("message") == text)
    if not same or inputs.status.get("phase") != Phase.IN_PROGRESS:
        await backbone.write(ctx, inputs, *backbone.in_progress(ctx, CONFIG, reason, message),
                             lambda s: s.__setitem__("machines", machines))


async def _report(ctx: StepContext, inputs: Inputs, pms: list[PlannedMachine], outcome: Outcome, reason: str,
                  message: str, *, pause: bool = False, done: bool = False, polled: bool = False) -> Outcome:
    """The step's outcome on the operation and on the machine(s); ``polled``: a reboot's poll, which rewrites
    neither the operation's nor the machine's message of the reboot (one write a reboot, not one a poll)."""
    for pm in pms:
        await _machine_condition(ctx, inputs, pm, reason, message, pause=pause, done=done, polled=polled)
    text = SCRUBBER.text(message)
    machines = [{"name": pm.name, "state": reason, "message": text} for pm in pms]
    if isinstance(outcome, Blocked):
        return await backbone.blocked(ctx, CONFIG, inputs, message, machines=machines)
    await _operation_status(ctx, inputs, reason, message, machines, keep=polled)
    return outcome


async def _complete(ctx: StepContext, inputs: Inputs, planned: list[PlannedMachine]) -> Outcome:
    message = f"rolled out on {len(planned)} machine(s): {', '.join(p.name for p in planned)}"
    stamp = now_rfc3339(ctx.now())

    def finish(s: Obj) -> None:
        s["stage"], s["completedAt"], s["machines"] = "Done", stamp, []

    await backbone.write(ctx, inputs, finish, backbone.phase(ctx, Phase.COMPLETED, message),
                         backbone.condition(ctx, CONFIG, "True", ROLLED_OUT, message))
    backbone.event(ctx, inputs, "Normal", names.EventReason.CONFIG_APPLIED, message)
    backbone.log_transition(CONFIG, inputs, "config rollout completed", machines=len(planned))
    await backbone.let_go(ctx, CONFIG, inputs.op)
    return Done()

