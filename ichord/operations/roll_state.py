"""The reboot roll's data and its pure decision: marker + observations + now -> the one action to take.

No I/O here: ``decide`` is table-tested with an injected ``now`` (tests/unit/test_roll_decide.py), and
``ichord.operations.roll`` gathers the observations, runs the action and owns the failpoints. The
state table is in roll.py's docstring.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from ichord.kube.nodes import NodeView
from ichord.settings import Timing


@dataclass(frozen=True)
class RollTarget:
    """One node of the roll: the machine (the name the marker records), its Talos endpoint, its Node name."""

    machine: str
    endpoint: str
    node: str


@dataclass(frozen=True)
class RollMarker:
    """The persisted state of a roll (docs/decisions.md#etcd-reboot-roll): everything it resumes from.

    ``rebooting`` names the machine asked to reboot ("" = none), ``boot_id`` is the boot it left and
    ``requested_at`` when the marker was written (both meaningful only while ``rebooting`` is set);
    ``done`` lists the machines rebooted and verified, in order, append-only. ``staged_at``: when the step that
    asked for the reboot began its last drain round and apply (the node's apply is timed from it to
    ``requested_at``, operations/progress.py); kept, like ``requested_at``, once the reboot is over.
    """

    rebooting: str = ""
    boot_id: str = ""
    requested_at: datetime | None = None
    done: tuple[str, ...] = ()
    staged_at: datetime | None = None

    def marked(self, machine: str, boot_id: str, at: datetime, staged_at: datetime | None = None) -> RollMarker:
        return replace(self, rebooting=machine, boot_id=boot_id, requested_at=at,
                       staged_at=self.staged_at if staged_at is None else staged_at)

    def cleared(self) -> RollMarker:
        """No reboot outstanding; ``requested_at`` stays as the last request's time (etcdRestartedAt)."""
        return replace(self, rebooting="", boot_id="")

    def finished(self, machine: str) -> RollMarker:
        done = self.done if machine in self.done else (*self.done, machine)
        return replace(self.cleared(), done=done)


@dataclass(frozen=True)
class GateResult:
    """A gate's answer: open (``wait`` is None) or the reason to wait, shown to the user. ``final``: a
    verifier that knows waiting will not help (docs/decisions.md#config-rollout: the node came back without the rendered
    configuration); before a reboot it is an ordinary closed gate."""

    wait: str | None = None
    final: bool = False

    @property
    def ok(self) -> bool:
        return self.wait is None


OPEN = GateResult()


def closed(reason: str) -> GateResult:
    return GateResult(reason)


def failed(reason: str) -> GateResult:
    return GateResult(reason, final=True)


class RollReason(enum.StrEnum):
    """Why a step of the roll returned what it did (the caller maps them to its own condition reasons)."""

    DONE = "RollDone"                        # every machine rebooted and verified
    GATE_CLOSED = "GateClosed"               # a gate says wait: Blocked, retried every Timing.retry
    MANAGED_API_UNAVAILABLE = "ManagedAPIUnavailable"  # the Node cannot be read before a reboot: Blocked
    NODE_NOT_FOUND = "NodeNotFound"          # the managed cluster has no such Node: Blocked
    UNKNOWN_MACHINE = "UnknownMachine"       # the marker names a machine the plan lacks: Blocked
    CORDONED = "Cordoned"                    # ichord cordoned the node just now
    WAITING_FOR_WINDOW = "WaitingForWindow"  # not started: outside every maintenance window (operations/windows.py)
    DRAINING = "Draining"                    # the before_reboot hook asks to come back later
    DRAIN_FAILED = "DrainFailed"             # the before_reboot hook gave up: uncordoned, pause
    NODE_UNREACHABLE = "NodeUnreachable"     # Talos does not answer before the reboot: Blocked
    REBOOTING = "RebootingNode"              # asked to reboot; waiting for another boot ID
    REBOOT_REQUESTED_AGAIN = "RebootRequestedAgain"  # same boot ID after reboot_retry, read again: asked again
    REBOOT_FAILED = "RebootFailed"           # the node refused Reboot: marker cleared, uncordoned, Blocked
    AWAITING_NODE = "AwaitingNode"           # new boot ID; waiting for Node Ready and the verifiers
    VERIFY_FAILED = "VerifyFailed"           # back, but a verifier failed for good: uncordoned, marker kept, pause
    NODE_REBOOTED = "NodeRebooted"           # one machine verified, uncordoned and recorded
    NODE_TIMED_OUT = "NodeActionTimeout"     # past node_action_timeout: the caller pauses, naming the node


class Action(enum.Enum):
    FINISH = "finish"            # the roll is done
    BLOCK = "block"              # wait for a gate / the API / the plan; nothing done
    CORDON = "cordon"
    REBOOT = "reboot"            # before_reboot hook, boot ID, before_reboot_call, marker, Reboot
    WAIT = "wait"                # a reboot is outstanding; look again later
    ASK_AGAIN = "ask-again"      # same boot ID past reboot_retry: read again, then Reboot again (marker kept)
    TIME_OUT = "time-out"        # past the bound: pause
    COMPLETE = "complete"        # after_reboot_verified hook, uncordon, record done
    GIVE_UP = "give-up"          # back but failed for good: uncordon, keep the marker, pause


@dataclass(frozen=True)
class Observations:
    """What was read this step. ``node`` None: the Node could not be read (``node_missing``: it does not
    exist); ``boot_id`` None: Talos did not answer; ``gate``: the first closed gate (before a reboot) or
    verifier (after one), OPEN when none is closed or none was asked."""

    node: NodeView | None = None
    node_error: str = ""
    node_missing: bool = False
    boot_id: str | None = None
    boot_error: str = ""
    #: Talos reports the node rebooting or shutting down (asked only while the boot ID is the marker's).
    stopping: bool = False
    gate: GateResult = OPEN


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: RollReason
    target: RollTarget | None = None
    message: str = ""
    after: float = 0.0


def next_target(plan: Sequence[RollTarget], marker: RollMarker) -> RollTarget | None:
    """The machine being rebooted, else the first one in order not done yet, else None."""
    if marker.rebooting:
        return next((t for t in plan if t.machine == marker.rebooting), None)
    return next((t for t in plan if t.machine not in marker.done), None)


def elapsed(marker: RollMarker, now: datetime) -> float:
    """Seconds since the marker was written; a marker without a time counts as past every bound."""
    if marker.requested_at is None:
        return math.inf
    return max(0.0, (now - marker.requested_at).total_seconds())


def is_back(marker: RollMarker, obs: Observations) -> bool:
    """Another boot ID, and a Ready Node whose kubelet reports that boot (not a Ready left from before)."""
    if obs.boot_id is None or obs.boot_id == marker.boot_id or obs.node is None:
        return False
    return obs.node.ready and obs.node.boot_id in ("", obs.boot_id)


def decide(plan: Sequence[RollTarget], marker: RollMarker, obs: Observations, now: datetime,
           timing: Timing) -> Decision:
    """The one action of this step; the guard clauses follow roll.py's state table row by row."""
    target = next_target(plan, marker)
    if marker.rebooting:
        if target is None:
            return Decision(Action.BLOCK, RollReason.UNKNOWN_MACHINE, None,
                            f"the roll's marker names {marker.rebooting}, which is not in the plan "
                            f"({', '.join(t.machine for t in plan)}); it stays until the machine is back in it",
                            timing.retry)
        return _rebooting(target, marker, obs, now, timing)
    if target is None:
        return Decision(Action.FINISH, RollReason.DONE, None, f"rebooted {', '.join(marker.done) or 'nothing'}")
    if not obs.gate.ok:
        return Decision(Action.BLOCK, RollReason.GATE_CLOSED, target,
                        f"waiting to reboot {target.machine}: {obs.gate.wait}", timing.retry)
    if obs.node is None:
        reason = RollReason.NODE_NOT_FOUND if obs.node_missing else RollReason.MANAGED_API_UNAVAILABLE
        return Decision(Action.BLOCK, reason, target,
                        f"cannot read Node {target.node} of {target.machine}: {obs.node_error}", timing.retry)
    if not obs.node.unschedulable:
        return Decision(Action.CORDON, RollReason.CORDONED, target, f"cordoning Node {target.node}")
    return Decision(Action.REBOOT, RollReason.REBOOTING, target, f"rebooting {target.machine}")


def _rebooting(target: RollTarget, marker: RollMarker, obs: Observations, now: datetime,
               timing: Timing) -> Decision:
    spent = elapsed(marker, now)
    left = timing.node_action_timeout - spent
    if obs.boot_id == marker.boot_id:
        if obs.stopping:
            # Still on its way down (a graceful reboot stops pods and services first): asking again could
            # reboot it twice. Wait, bounded like any other wait after the request.
            if left <= 0:
                return Decision(Action.TIME_OUT, RollReason.NODE_TIMED_OUT, target,
                                f"{target.machine} did not come back within {timing.node_action_timeout:g} s of its "
                                "reboot request (Talos still reports it rebooting)", timing.retry)
            return Decision(Action.WAIT, RollReason.REBOOTING, target,
                            f"waiting for {target.machine}: Talos reports it rebooting", min(timing.reboot_poll, left))
        if spent >= timing.reboot_retry:
            return Decision(Action.ASK_AGAIN, RollReason.REBOOT_REQUESTED_AGAIN, target,
                            f"{target.machine} still runs boot {marker.boot_id} {timing.reboot_retry:g} s after the "
                            "reboot was asked for; asking again")
        return Decision(Action.WAIT, RollReason.REBOOTING, target,
                        f"waiting for {target.machine} to reboot (still on the boot it had)",
                        min(timing.reboot_poll, timing.reboot_retry - spent))
    if is_back(marker, obs) and obs.gate.ok:
        return Decision(Action.COMPLETE, RollReason.NODE_REBOOTED, target, f"{target.machine} rebooted and verified")
    if is_back(marker, obs) and obs.gate.final:
        return Decision(Action.GIVE_UP, RollReason.VERIFY_FAILED, target,
                        f"{target.machine} rebooted but failed verification: {obs.gate.wait}", timing.retry)
    waiting = _waiting_for(target, marker, obs)
    if left <= 0:
        return Decision(Action.TIME_OUT, RollReason.NODE_TIMED_OUT, target,
                        f"{target.machine} did not come back within {timing.node_action_timeout:g} s of its reboot "
                        f"request ({waiting})", timing.retry)
    reason = RollReason.REBOOTING if obs.boot_id is None else RollReason.AWAITING_NODE
    return Decision(Action.WAIT, reason, target, f"waiting for {target.machine}: {waiting}",
                    min(timing.reboot_poll, left))


def _waiting_for(target: RollTarget, marker: RollMarker, obs: Observations) -> str:
    if obs.boot_id is None:
        return f"its Talos API does not answer ({obs.boot_error or 'no answer'})"
    if obs.node is None:
        return f"Node {target.node} cannot be read ({obs.node_error or 'no answer'})"
    if not obs.node.ready:
        return f"Node {target.node} is not Ready"
    if obs.node.boot_id not in ("", obs.boot_id):
        return f"Node {target.node} still reports the boot before the reboot"
    return str(obs.gate.wait)
