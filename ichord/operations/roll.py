"""The reboot roll: one node at a time, gated, with a boot-ID marker before the irreversible call.

Written once for the etcd CA target (docs/decisions.md#etcd-reboot-roll) and the ``config`` operation
(docs/decisions.md#config-rollout). ``advance_roll`` is a level-triggered step: each call reads the persisted marker
(``MarkerStore``, roll_ports.py), the node's boot ID (Talos) and its Node (the managed cluster's
API; once a step, and while a reboot is outstanding only once another boot ID answers: before that no row asks it),
does at most one small piece of work and returns a ``RollOutcome``; the caller requeues.
Nothing is remembered in the process: every wait is measured from the marker's ``requested_at``.

State table (``roll_state.decide``; first matching row wins)::

    marker            observation                                     action
    ----------------  ----------------------------------------------  ---------------------------------------
    rebooting=M       M not in the plan                               Blocked UnknownMachine
    rebooting=M       boot ID = marker's, Talos stage REBOOTING or    Requeue RebootingNode (wait); past
                      SHUTTING_DOWN                                   node_action_timeout: the timeout row
    rebooting=M       boot ID = marker's, < reboot_retry              Requeue RebootingNode (wait)
    rebooting=M       boot ID = marker's, >= reboot_retry             ask again (below): Reboot, marker kept ->
                                                                      Requeue RebootRequestedAgain
    rebooting=M       new boot ID, Node Ready on it, verifiers open   after_reboot_verified, uncordon (if ours),
                                                                      done += M, clear -> Requeue NodeRebooted
    rebooting=M       back (as above), a verifier failed for good     uncordon (if ours), keep marker ->
                                                                      Blocked VerifyFailed, pause=True
    rebooting=M       anything else, < node_action_timeout            Requeue RebootingNode / AwaitingNode
    rebooting=M       anything else, >= node_action_timeout           Blocked NodeActionTimeout, pause=True
    none              every machine done                              Done RollDone
    none              a gate closed                                   Blocked GateClosed (retry 30 s; a
                                                                      cordon already made stays)
    none              Node unreadable / missing                       Blocked ManagedAPIUnavailable / NodeNotFound
    none              Node schedulable, outside every maintenance     Requeue WaitingForWindow (nothing done;
                      window (``admit``)                              the requeue is at the opening)
    none              Node schedulable                                cordon -> Requeue Cordoned
    none              Node unschedulable (ours or a person's)         before_reboot (drain): wait -> Requeue
                                                                      Draining; give up -> uncordon, pause
                                                                      DrainFailed; then read boot ID (fails ->
                                                                      Blocked NodeUnreachable),
                                                                      before_reboot_call (best effort), write
                                                                      marker, Reboot -> Requeue RebootingNode

``admit`` (the maintenance windows, operations/windows.py) is asked only before a node is started, and last before
that call, on the step's clock as it reads then: after ``roll.cordon.before``, right before the cordon is sent, or
right before the drain and reboot of a node a person cordoned (a step that took long to get there decides on the
time it cordons at, not on one read earlier). A node ichord cordoned, or one with a marker, is in flight and always
finishes, so a window closing mid-node never leaves it cordoned between nodes.

A cordon is followed in the same call by the row it leads to: the drain starts without waiting for the caller's
next step. That row decides on the gates asked again (as the next step would) and on the Node as the cordon's answer
returned it (the server's newest: a GET would say the same).

Resume rules: a marker means wait, never reboot again. The same boot ID past ``reboot_retry`` asks again, in one
step and with the marker kept: the node's stage, the gates and, last, its boot ID are read again right before the
call, and the node is asked only while it answers, is not rebooting or shutting down, and still runs the marker's
boot (a node that answers the old boot ID and then goes down, or comes back on a new one, was seen: it is waited for,
never asked twice); the marker is written again with the new request's time before the call. A stage that cannot be
read counts as a node that does not answer (a wait), not as a reboot not seen. A Reboot the node refused (it answered
with an error status) clears the marker and uncordons (Blocked RebootFailed); a Reboot whose answer was lost
(unreachable, deadline) keeps the marker: the node may be rebooting, and the rows above decide.
Only a Node ichord cordoned (annotation ``ichor.maesh.dev/cordoned-by-ichor``) is ever uncordoned.

Failpoints (``ICHORD_FAILPOINTS``), in the order a node passes them::

    roll.cordon.before          gates open, Node schedulable, window not asked, cordon not sent
    roll.cordon.after           cordoned, nothing else
    roll.marker.before          drained, boot ID read, marker not written
    roll.marker.after           marker written, Reboot not called
    roll.reboot.before          about to call Reboot (marker written)
    roll.reboot.after           Reboot answered, outcome not returned
    roll.reboot_failed.before   Reboot refused, marker not cleared
    roll.reboot_failed.after    marker cleared, not uncordoned
    roll.ask_again.before       same boot ID past reboot_retry, nothing read again yet
    roll.ask_again.after        read again (still up on the marker's boot), marker rewritten, Reboot not called
    roll.verified.before        node back and verified, after_reboot_verified not run
    roll.verified.after         after_reboot_verified ran, not uncordoned
    roll.uncordon.before        about to uncordon
    roll.uncordon.after         uncordoned, done not recorded
    roll.done.before            about to record the machine as done and clear the marker
    roll.done.after             recorded, outcome not returned
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

import structlog

from ichord.contract import ContractMismatchError
from ichord.errors import IchordError
from ichord.failpoints import failpoint
from ichord.kube.errors import Conflict, NotFound
from ichord.kube.nodes import NodeView
from ichord.operations.outcome import Blocked, Done, Outcome, Requeue
from ichord.operations.roll_ports import KubeNodes, ManagedNodes, MarkerStore, RollTalos, TalosNodes
from ichord.operations.roll_state import (
    OPEN,
    Action,
    Decision,
    GateResult,
    Observations,
    RollMarker,
    RollReason,
    RollTarget,
    closed,
    decide,
    failed,
    next_target,
)
from ichord.operations.windows import Closed
from ichord.render.trusted_cas import BundleMismatchError
from ichord.settings import Timing
from ichord.talos.errors import TalosError, TalosUnreachableError

log = structlog.get_logger(__name__)

__all__ = [
    "OPEN",
    "PROCEED",
    "Gate",
    "GateResult",
    "HookResult",
    "HookVerdict",
    "KubeNodes",
    "ManagedNodes",
    "MarkerStore",
    "RollHooks",
    "RollMarker",
    "RollOutcome",
    "RollReason",
    "RollTalos",
    "RollTarget",
    "TalosNodes",
    "advance_roll",
    "closed",
    "failed",
    "restart_clock",
]


#: Each returns OPEN or the reason to wait; an IchordError raised by a gate counts as a reason to wait.
Gate = Callable[[RollTarget], Awaitable[GateResult]]
#: May this node be started now (a maintenance window open)? None: yes; else why not and when to look again.
Admit = Callable[[RollTarget], Awaitable[Closed | None]]


class HookVerdict(enum.Enum):
    PROCEED = "proceed"
    WAIT = "wait"
    GIVE_UP = "give-up"


@dataclass(frozen=True)
class HookResult:
    """What ``before_reboot`` (drain) answers: go on, come back after ``after`` seconds, or give up."""

    verdict: HookVerdict = HookVerdict.PROCEED
    message: str = ""
    after: float = 0.0


PROCEED = HookResult()


async def _no_drain(target: RollTarget) -> HookResult:
    return PROCEED


async def _nothing(target: RollTarget) -> None:
    return None


@dataclass(frozen=True)
class RollHooks:
    """The roll's injection points. Every hook may run more than once for a node (a killed step repeats)."""

    #: Drain (and storage evacuation) after the cordon; the ``config`` operation fills it.
    before_reboot: Callable[[RollTarget], Awaitable[HookResult]] = _no_drain
    #: Just before the marker is written, e.g. forfeit etcd leadership. Best effort: an IchordError is logged.
    before_reboot_call: Callable[[RollTarget], Awaitable[None]] = _nothing
    #: Once the node is back and verified, before it is uncordoned (e.g. end storage evacuation).
    after_reboot_verified: Callable[[RollTarget], Awaitable[None]] = _nothing


@dataclass(frozen=True)
class RollOutcome:
    """A step's outcome plus what the caller shows: the reason, the machine under way, and whether to pause."""

    outcome: Outcome
    reason: RollReason
    machine: str | None = None
    message: str = ""
    #: Past a bound or failed for good (NodeActionTimeout, DrainFailed, VerifyFailed): the operation pauses,
    #: naming ``machine``.
    pause: bool = False
    done: tuple[str, ...] = field(default=())
    #: Outside every maintenance window (reason WaitingForWindow): what the operation says while it waits.
    window: Closed | None = None
    #: The step only waited on a reboot already asked for (a poll): its message details the wait, it is no news
    #: (the caller keeps the Rebooting condition it wrote when the reboot was asked for: one write a reboot).
    polled: bool = False

    @property
    def finished(self) -> bool:
        return isinstance(self.outcome, Done)


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def advance_roll(plan: Sequence[RollTarget], store: MarkerStore, talos: RollTalos, nodes: ManagedNodes, *,
                       gates: Sequence[Gate] = (), verifiers: Sequence[Gate] = (), hooks: RollHooks | None = None,
                       timing: Timing | None = None, clock: Callable[[], datetime] = _utcnow,
                       admit: Admit | None = None) -> RollOutcome:
    """One step of the roll over ``plan`` (in order). ``gates`` are asked before each reboot (a closed one
    blocks); ``verifiers`` once the node is back on a new boot ID with its Node Ready (a closed one waits,
    up to node_action_timeout); ``admit`` before a node is started (nothing is done to it while it says no)."""
    timing = timing or Timing.from_env()
    hooks = hooks or RollHooks()
    marker = await store.read()
    target = next_target(plan, marker)
    obs = await _observe(target, marker, talos, nodes, gates, verifiers)
    decision = decide(plan, marker, obs, clock(), timing)
    # The window is asked at the node's first disruptive call, right before it (its cordon, or the drain of a node a
    # person cordoned), on the clock as it reads then: a step slow to get there must not cordon past the window's end.
    starts = admit if decision.target is not None and _starts_node(decision, obs) else None
    if decision.action is not Action.CORDON:
        return await _act(decision, marker, store, talos, nodes, hooks, timing, clock, gates, starts)
    rolled, cordoned = await _cordon(decision, marker, nodes, timing, starts)
    if cordoned is not None:
        # Cordoned just now: the drain need not wait for another step of the cluster (a step of a hundred machines
        # lasts seconds). The row it leads to is decided as the next step would decide it: the gates are asked again
        # (a gate that closed meanwhile still holds the node, cordoned), the Node is the cordon's answer (the
        # server's newest: a second GET would say the same).
        assert decision.target is not None  # a cordon names its node
        again = replace(obs, node=cordoned, gate=await _first_closed(gates, decision.target))
        rolled = await _act(decide(plan, marker, again, clock(), timing), marker, store, talos, nodes, hooks, timing,
                            clock)
    return rolled


def _starts_node(decision: Decision, obs: Observations) -> bool:
    """The decision's call would be the first disruptive one on its node: a cordon, or the drain and reboot of a
    node ichord did not cordon (a person's cordon)."""
    if decision.action is Action.CORDON:
        return True
    return decision.action is Action.REBOOT and not (obs.node is not None and obs.node.cordoned_by_ichord)


async def restart_clock(store: MarkerStore, clock: Callable[[], datetime] = _utcnow) -> bool:
    """Measure an outstanding reboot's bounds from now, for a paused roll a person resumes
    (docs/decisions.md#config-rollout's retry "waits again with a fresh clock", as docs/decisions.md#config-rollout
    cites it). False when no reboot is outstanding."""
    marker = await store.read()
    if not marker.rebooting:
        return False
    await store.write(marker.marked(marker.rebooting, marker.boot_id, clock()))
    return True


# ---- observations -------------------------------------------------------------------------------


async def _observe(target: RollTarget | None, marker: RollMarker, talos: RollTalos, nodes: ManagedNodes,
                   gates: Sequence[Gate], verifiers: Sequence[Gate]) -> Observations:
    if target is None:
        return Observations()
    if not marker.rebooting:
        node, node_error, missing = await _read_node(nodes, target)
        return Observations(node=node, node_error=node_error, node_missing=missing, gate=await _first_closed(
            gates, target))
    try:
        boot_id: str | None = await talos.boot_id(target)
        boot_error = ""
    except TalosError as exc:
        boot_id, boot_error = None, str(exc)
    stopping = False
    if boot_id is not None and boot_id == marker.boot_id:
        try:
            stopping = await talos.shutting_down(target)
        except TalosError as exc:
            # It answered the boot ID a moment ago and no longer does: on its way down, not "the reboot not seen".
            boot_id, boot_error = None, str(exc)
    if boot_id is None or boot_id == marker.boot_id:
        # Not back on another boot: no row asks the Node (roll_state.decide), so it is not read (a reboot's polls).
        return Observations(boot_id=boot_id, boot_error=boot_error, stopping=stopping)
    node, node_error, missing = await _read_node(nodes, target)
    obs = Observations(node=node, node_error=node_error, node_missing=missing, boot_id=boot_id,
                       boot_error=boot_error, stopping=stopping)
    if boot_id not in (None, marker.boot_id) and node is not None and node.ready:
        # The verifiers (etcd health, PKI) are asked only of a node that is back.
        obs = Observations(node=node, boot_id=boot_id, gate=await _first_closed(verifiers, target))
    return obs


async def _read_node(nodes: ManagedNodes, target: RollTarget) -> tuple[NodeView | None, str, bool]:
    try:
        return await nodes.read(target.node), "", False
    except NotFound as exc:
        return None, str(exc), True
    except IchordError as exc:
        return None, str(exc), False


async def _first_closed(gates: Sequence[Gate], target: RollTarget) -> GateResult:
    for gate in gates:
        try:
            result = await gate(target)
        except (ContractMismatchError, BundleMismatchError):
            # No check a wait clears: the operation blocks naming it (docs/decisions.md#contract-match,
            # docs/decisions.md#bundle-belongs).
            raise
        except IchordError as exc:
            result = GateResult(f"a check failed: {exc}")
        if not result.ok:
            return result
    return OPEN


# ---- actions ------------------------------------------------------------------------------------


async def _act(d: Decision, marker: RollMarker, store: MarkerStore, talos: RollTalos, nodes: ManagedNodes,
               hooks: RollHooks, timing: Timing, clock: Callable[[], datetime],
               gates: Sequence[Gate] = (), admit: Admit | None = None) -> RollOutcome:
    machine = d.target.machine if d.target else None

    def out(outcome: Outcome, reason: RollReason = d.reason, message: str = d.message, *, pause: bool = False,
            m: RollMarker = marker) -> RollOutcome:
        return RollOutcome(outcome, reason, machine, message, pause, m.done)

    if d.action is Action.FINISH:
        return out(Done())
    if d.action is Action.BLOCK:
        return out(Blocked(d.reason, d.message, d.after))
    if d.action is Action.WAIT:
        return replace(out(Requeue(d.after, d.reason)), polled=True)
    if d.action is Action.TIME_OUT:
        log.warning("roll: node did not come back in time", machine=machine, reason=d.reason)
        return out(Blocked(d.reason, d.message, d.after), pause=True)
    assert d.target is not None
    if d.action is Action.CORDON:
        return (await _cordon(d, marker, nodes, timing, admit))[0]
    if d.action is Action.ASK_AGAIN:
        return await _ask_again(d.target, marker, store, talos, nodes, gates, hooks, timing, clock, out)
    if d.action is Action.COMPLETE:
        return await _complete(d.target, marker, store, nodes, hooks, timing, out)
    if d.action is Action.GIVE_UP:
        # docs/decisions.md#config-rollout: any failure after the reboot request re-enables scheduling; the marker
        # stays, so a resumed roll verifies this node again and never reboots it a second time.
        log.warning("roll: node failed verification", machine=machine, reason=d.reason)
        freed = "released" if await _uncordon_quietly(nodes, d.target) else "not released yet (see the log)"
        message = f"{d.message}; ichord's cordon of {d.target.node} {freed}"
        return out(Blocked(d.reason, message, d.after), d.reason, message, pause=True)
    if admit is not None and (closed := await admit(d.target)) is not None:
        return _waiting(d.target, marker, closed)
    return await _reboot(d.target, marker, store, talos, nodes, hooks, timing, clock, out)


def _waiting(target: RollTarget, marker: RollMarker, closed: Closed) -> RollOutcome:
    """Not started: outside every maintenance window, or too little of it left for the node's step."""
    return RollOutcome(Requeue(closed.after, RollReason.WAITING_FOR_WINDOW), RollReason.WAITING_FOR_WINDOW,
                       target.machine, closed.message, done=marker.done, window=closed)


async def _cordon(d: Decision, marker: RollMarker, nodes: ManagedNodes, timing: Timing,
                  admit: Admit | None = None) -> tuple[RollOutcome, NodeView | None]:
    """Cordon the decision's node: the outcome, and the Node as the cordon left it (None: not cordoned). ``admit``:
    the window, asked last before the cordon is sent."""
    assert d.target is not None
    machine = d.target.machine

    def out(outcome: Outcome, reason: RollReason = d.reason, message: str = d.message) -> RollOutcome:
        return RollOutcome(outcome, reason, machine, message, False, marker.done)

    failpoint("roll.cordon.before")
    if admit is not None and (closed := await admit(d.target)) is not None:
        return _waiting(d.target, marker, closed), None
    try:
        node = await nodes.cordon(d.target.node)
    except Conflict:  # the Node changed since it was read: read it again and decide again
        return out(Requeue(timing.reboot_poll, d.reason), d.reason,
                   f"Node {d.target.node} changed while being cordoned; trying again"), None
    except IchordError as exc:
        message = f"cannot cordon Node {d.target.node}: {exc}"
        return out(Blocked(RollReason.MANAGED_API_UNAVAILABLE, message, timing.retry),
                   RollReason.MANAGED_API_UNAVAILABLE, message), None
    failpoint("roll.cordon.after")
    log.info("roll: cordoned", machine=machine, node=d.target.node)
    return out(Requeue(0.0, d.reason)), node


class _Out(Protocol):
    def __call__(self, outcome: Outcome, reason: RollReason = ..., message: str = ..., *, pause: bool = ...,
                 m: RollMarker = ...) -> RollOutcome: ...


async def _complete(target: RollTarget, marker: RollMarker, store: MarkerStore, nodes: ManagedNodes,
                    hooks: RollHooks, timing: Timing, out: _Out) -> RollOutcome:
    failpoint("roll.verified.before")
    await hooks.after_reboot_verified(target)
    failpoint("roll.verified.after")
    failpoint("roll.uncordon.before")
    try:
        uncordoned = await nodes.uncordon(target.node)
    except IchordError as exc:
        return out(Requeue(timing.reboot_poll, RollReason.AWAITING_NODE), RollReason.AWAITING_NODE,
                   f"{target.machine} is back; cannot uncordon Node {target.node} yet: {exc}")
    failpoint("roll.uncordon.after")
    failpoint("roll.done.before")
    done = marker.finished(target.machine)
    await store.write(done)
    failpoint("roll.done.after")
    log.info("roll: node rebooted", machine=target.machine, uncordoned=uncordoned, done=len(done.done))
    return out(Requeue(0.0, RollReason.NODE_REBOOTED), m=done)


async def _reboot(target: RollTarget, marker: RollMarker, store: MarkerStore, talos: RollTalos,
                  nodes: ManagedNodes, hooks: RollHooks, timing: Timing, clock: Callable[[], datetime],
                  out: _Out) -> RollOutcome:
    staging = clock()  # the last drain round and the apply begin (the apply is timed from here: progress.py)
    prepared = await hooks.before_reboot(target)
    if prepared.verdict is HookVerdict.WAIT:
        return out(Requeue(prepared.after, RollReason.DRAINING), RollReason.DRAINING,
                   prepared.message or f"draining {target.node}")
    if prepared.verdict is HookVerdict.GIVE_UP:
        freed = "released" if await _uncordon_quietly(nodes, target) else "not released yet (see the log)"
        message = f"{target.machine} was not rebooted: {prepared.message}; ichord's cordon of {target.node} {freed}"
        return out(Blocked(RollReason.DRAIN_FAILED, message, timing.retry), RollReason.DRAIN_FAILED, message,
                   pause=True)
    try:
        boot_id = await talos.boot_id(target)
    except TalosError as exc:
        message = f"cannot read the boot ID of {target.machine} before its reboot: {exc}"
        return out(Blocked(RollReason.NODE_UNREACHABLE, message, timing.retry), RollReason.NODE_UNREACHABLE,
                   message)
    try:
        await hooks.before_reboot_call(target)
    except IchordError as exc:  # best effort (docs/decisions.md#etcd-reboot-roll: a leader forfeits, best effort)
        log.warning("roll: before the reboot call", machine=target.machine, error=str(exc))
    failpoint("roll.marker.before")
    marked = marker.marked(target.machine, boot_id, clock(), staged_at=staging)
    await store.write(marked)
    failpoint("roll.marker.after")
    return await _send(target, marked, store, talos, nodes, timing, out)


async def _ask_again(target: RollTarget, marker: RollMarker, store: MarkerStore, talos: RollTalos,
                     nodes: ManagedNodes, gates: Sequence[Gate], hooks: RollHooks, timing: Timing,
                     clock: Callable[[], datetime], out: _Out) -> RollOutcome:
    """The same boot ID past reboot_retry: the reboot was not seen. "Not seen" is read again right before the call,
    because the step's first reads are a moment old (a node finishing its shutdown answers the old boot ID, then
    nothing, then a new one): the node is asked again only while it answers, runs (not rebooting or shutting down),
    the gates are open and its boot ID, read last, is still the marker's. The marker is never cleared here: it is
    written again with a fresh time before the call, so a node that moved is seen back by the rows, never asked
    again, and a process killed in between waits reboot_retry once more."""
    failpoint("roll.ask_again.before")
    machine = target.machine
    try:
        stopping = await talos.shutting_down(target)
    except TalosError as exc:
        return _not_asked(out, timing, f"{machine} does not answer ({exc}); waiting for it, not asking it again")
    if stopping:
        return _not_asked(out, timing, f"waiting for {machine}: Talos reports it rebooting")
    gate = await _first_closed(gates, target)
    if not gate.ok:
        message = f"waiting to ask {machine} again to reboot: {gate.wait}"
        return out(Blocked(RollReason.GATE_CLOSED, message, timing.retry), RollReason.GATE_CLOSED, message)
    try:
        await hooks.before_reboot_call(target)
    except IchordError as exc:  # best effort, as before the first request
        log.warning("roll: before the reboot call", machine=machine, error=str(exc))
    try:
        boot_id = await talos.boot_id(target)
    except TalosError as exc:
        return _not_asked(out, timing, f"{machine} does not answer ({exc}); waiting for it, not asking it again")
    if boot_id != marker.boot_id:
        log.info("roll: reboot seen before asking again", machine=machine, boot_id=marker.boot_id, now=boot_id)
        return _not_asked(out, timing, f"{machine} left boot {marker.boot_id}; waiting for it to be back",
                          RollReason.AWAITING_NODE, 0.0)
    marked = marker.marked(machine, boot_id, clock())
    await store.write(marked)
    failpoint("roll.ask_again.after")
    log.warning("roll: reboot not seen; asking again", machine=machine, boot_id=boot_id)
    return await _send(target, marked, store, talos, nodes, timing, out, RollReason.REBOOT_REQUESTED_AGAIN,
                       f"asked {machine} again to reboot: it still ran boot {boot_id} {timing.reboot_retry:g} s "
                       "after the first request")


def _not_asked(out: _Out, timing: Timing, message: str, reason: RollReason = RollReason.REBOOTING,
               after: float | None = None) -> RollOutcome:
    """The re-ask not sent: the marker stays, and the rows decide at the next step."""
    return replace(out(Requeue(timing.reboot_poll if after is None else after, reason), reason, message), polled=True)


async def _send(target: RollTarget, marked: RollMarker, store: MarkerStore, talos: RollTalos, nodes: ManagedNodes,
                timing: Timing, out: _Out, reason: RollReason = RollReason.REBOOTING, asked: str = "") -> RollOutcome:
    """Ask for the reboot the marker ``marked`` (written) records; ``reason`` and ``asked`` say it once answered."""
    boot_id = marked.boot_id
    failpoint("roll.reboot.before")
    try:
        await talos.reboot(target)
    except TalosUnreachableError as exc:
        # The answer was lost, not refused: the node may be rebooting. The marker decides from here.
        log.warning("roll: reboot answer lost; waiting on the marker", machine=target.machine, error=str(exc))
        return out(Requeue(timing.reboot_poll, RollReason.REBOOTING), RollReason.REBOOTING,
                   f"asked {target.machine} to reboot; no answer ({exc})", m=marked)
    except TalosError as exc:
        failpoint("roll.reboot_failed.before")
        await store.write(marked.cleared())
        failpoint("roll.reboot_failed.after")
        await _uncordon_quietly(nodes, target)
        message = f"{target.machine} refused the reboot: {exc}"
        log.warning("roll: reboot refused", machine=target.machine, error=str(exc))
        return out(Blocked(RollReason.REBOOT_FAILED, message, timing.retry), RollReason.REBOOT_FAILED, message,
                   m=marked.cleared())
    failpoint("roll.reboot.after")
    log.info("roll: reboot requested", machine=target.machine, boot_id=boot_id)
    return out(Requeue(timing.reboot_poll, reason), reason, asked or f"asked {target.machine} to reboot", m=marked)


async def _uncordon_quietly(nodes: ManagedNodes, target: RollTarget) -> bool:
    # On a failure path the failure itself is the news; a Node left cordoned is taken up by the next step.
    try:
        await nodes.uncordon(target.node)
    except IchordError as exc:
        log.warning("roll: cannot uncordon", machine=target.machine, node=target.node, error=str(exc))
        return False
    return True
