"""Planned disruptions: the machines an operation is rebooting, or whose kube-apiserver it is restarting, now.

A node that ichord itself asked to reboot stops answering for a while; that is the plan, not a fault. The
machine reconciler learns it from here, so the machine shows ``Ready=False/Rebooting`` (or
``APIServerRestarting``) with a Normal Event, and only a loss nobody planned, or a planned one that has lasted
past its bound, is a Warning ``MachineUnreachable``.

Every disruption is read from the operation's markers in the API (the roll's ``rebooting``/``requestedAt``, the
restart marker's ``machine``/``appliedAt``), written before the irreversible call; nothing is remembered in the
process, so a daemon killed in the middle of a reboot and restarted (or a new leader) knows it is planned. Each
kind says where its markers are (``Operation.disruptions`` in registry.py); the actor never names a kind.

The bound is the operation's own: past it the operation stops waiting and pauses (roll.py's
``node_action_timeout``, the API-server restart's ``apiserver_restart_bound``), and so the machine's loss stops
being planned at the same moment.
"""

from __future__ import annotations

from ichord.api.disruptions import Disruption, PlannedDisruption
from ichord.api.views import OperationView
from ichord.operations.roll_state import RollMarker
from ichord.operations.roll_store import MarkerFormatError, parse_time


def reboot_of(op: OperationView, marker: RollMarker, bound: float) -> PlannedDisruption | None:
    """The reboot a roll marker records as asked for (the machine and the time are both written), or None."""
    if not marker.rebooting or marker.requested_at is None:
        return None
    return PlannedDisruption(marker.rebooting, Disruption.REBOOT, f"{op.namespace}/{op.name}", marker.requested_at,
                             bound)


def restart_of(op: OperationView, machine: str, raw_at: object, bound: float) -> PlannedDisruption | None:
    """The kube-apiserver restart a marker records (``machine`` and its ``appliedAt``), or None."""
    if not machine or not raw_at:
        return None
    try:
        at = parse_time(str(raw_at), "appliedAt")
    except MarkerFormatError:
        return None  # a marker that cannot be read plans nothing: a loss is then reported as one
    return PlannedDisruption(machine, Disruption.API_SERVER_RESTART, f"{op.namespace}/{op.name}", at, bound)
